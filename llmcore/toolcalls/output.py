"""What parsing produces: ``Delta`` (one piece of streamed output), ``ToolCall`` (a call as
the API returns it) and ``Output``, the sink every format writes to.

Formats report what they have decided, in text order: reasoning and content text, and
calls (``start_call(name)``, argument text as it arrives, ``end_call(arguments)``).
``take_deltas()`` returns what is new since the last take, grouped as clients have
always seen it: reasoning, then content, then each call's name and argument fragment.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class Delta:
    kind: str  # reasoning | content | call | args
    text: str = ""
    index: int = 0
    id: str = ""
    name: str = ""


@dataclass
class ToolCall:
    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class _Text:
    """Append-only text kept as parts (a long stream is joined once, when read)."""

    __slots__ = ("_parts", "_len")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._len = 0

    def add(self, text: str) -> None:
        if text:
            self._parts.append(text)
            self._len += len(text)

    def __len__(self) -> int:
        return self._len

    def value(self) -> str:
        if len(self._parts) > 1:
            self._parts[:] = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""


class _Call:
    __slots__ = ("call", "args", "done")

    def __init__(self, name: str):
        self.call = ToolCall(name, "")
        self.args = _Text()
        self.done = False


class Output:
    """The parsed output so far (see the module docstring). With parallel=False only the
    first call is kept."""

    def __init__(self, parallel: bool = True):
        self.parallel = parallel
        self._reasoning = _Text()
        self._content = _Text()
        self._calls: list[_Call] = []
        self._open: _Call | None = None
        self._new_reasoning: list[str] = []
        self._new_content: list[str] = []
        self._new_calls: list[Delta] = []

    # --- written by the formats ---------------------------------------------------------
    def add_reasoning(self, text: str) -> None:
        if text:
            self._reasoning.add(text)
            self._new_reasoning.append(text)

    def add_content(self, text: str) -> None:
        if text:
            self._content.add(text)
            self._new_content.append(text)

    def start_call(self, name: str) -> None:
        """A call whose name is known; argument text that follows belongs to it."""
        self._open = None
        if not self.parallel and self._calls:
            return
        c = _Call(name)
        self._calls.append(c)
        self._open = c
        self._new_calls.append(Delta("call", index=len(self._calls) - 1, id=c.call.id, name=name))

    def add_args(self, text: str) -> None:
        c = self._open
        if c is None or not text:
            return
        c.args.add(text)
        i = len(self._calls) - 1
        last = self._new_calls[-1] if self._new_calls else None
        if last is not None and last.kind == "args" and last.index == i:
            last.text += text
        else:
            self._new_calls.append(Delta("args", text, index=i))

    def end_call(self, arguments: str | None = None) -> None:
        """The open call is complete. `arguments`: its whole argument string; the part
        beyond what was streamed is streamed now (a string that does not extend what was
        streamed cannot be taken back, so it is dropped)."""
        c = self._open
        if c is None:
            return
        if arguments is not None and len(arguments) > len(c.args):
            streamed = c.args.value()
            if arguments.startswith(streamed):
                self.add_args(arguments[len(streamed):])
        c.done = True
        self._open = None

    def drop_call(self) -> None:
        """The open call turned out not to be one: what was streamed of it stays (a stream
        cannot take it back), nothing more is added to it."""
        self._open = None

    @property
    def call_open(self) -> bool:
        return self._open is not None

    # --- read by the parser ------------------------------------------------------------
    def take_deltas(self) -> list[Delta]:
        out: list[Delta] = []
        if self._new_reasoning:
            out.append(Delta("reasoning", "".join(self._new_reasoning)))
            self._new_reasoning.clear()
        if self._new_content:
            out.append(Delta("content", "".join(self._new_content)))
            self._new_content.clear()
        out += self._new_calls
        self._new_calls = []
        return out

    @property
    def reasoning(self) -> str:
        return self._reasoning.value()

    @property
    def content(self) -> str:
        return self._content.value()

    @property
    def calls(self) -> list[ToolCall]:
        for c in self._calls:
            if len(c.call.arguments) != len(c.args):
                c.call.arguments = c.args.value()
        return [c.call for c in self._calls]
