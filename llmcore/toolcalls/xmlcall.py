"""A Qwen3-Coder XML tool call as it streams in:

    <function=NAME>
    <parameter=ARG>
    value
    </parameter>
    </function>

``XmlCall`` is fed the text of one call and reports, like ``JsonCall``, ``PENDING`` /
``CALL`` (``name``, ``take_args()``, ``done``) / ``NOT_A_CALL``. The arguments are
built as a JSON object, one ``"ARG": value`` entry per complete parameter, the value
converted with the tool's JSON-schema type (a string stays a string, anything else is
parsed as JSON when it is JSON). A parameter's value is passed over once, however long.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .jsoncall import CALL, NOT_A_CALL, PENDING
from .scan import MarkerScan

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
_FUNC_RE = re.compile(r"\s*<function=([^>\n]+)>")


def schema_types(tools: list | None, name: str) -> dict[str, Any]:
    """Parameter name -> JSON-schema type, for the tool called `name`."""
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            props = ((fn.get("parameters") or fn.get("input_schema") or {}).get("properties") or {})
            return {k: (v.get("type") if isinstance(v, dict) else None) for k, v in props.items()}
    return {}


def xml_value(raw: str, typ: Any) -> object:
    """A parameter's text as the value its schema type asks for (one newline on each side
    belongs to the markup)."""
    v = raw[1:] if raw.startswith("\n") else raw
    v = v[:-1] if v.endswith("\n") else v
    if typ == "string" or (isinstance(typ, list) and "string" in typ and len(typ) == 1):
        return v
    try:
        return json.loads(v)
    except ValueError:
        return v


class XmlCall:
    """See the module docstring."""

    _BETWEEN, _TAG, _VALUE = range(3)

    def __init__(self, tools: list | None):
        self._tools = tools
        self._n = 0  # characters fed
        self._head = ""  # text until the function tag is read
        self._not_a_call = False
        self.name: str | None = None
        self.done = False
        self.end = -1  # index just past </function>, once done
        self._rest = ""  # text fed after </function>
        self._types: dict[str, Any] = {}
        self._items: list[str] = []
        self._new_args: list[str] = []
        self._phase = self._BETWEEN
        self._between = MarkerScan([PARAMETER_OPEN, FUNCTION_CLOSE])
        self._tag = ""  # a parameter tag after "<parameter=", until its ">"
        self._key = ""
        self._value = MarkerScan([PARAMETER_CLOSE, FUNCTION_CLOSE])
        self._value_parts: list[str] = []

    @property
    def state(self) -> str:
        if self.name is not None:
            return CALL
        return NOT_A_CALL if self._not_a_call else PENDING

    @property
    def settled(self) -> bool:
        return self._not_a_call

    def take_args(self) -> str:
        new = "".join(self._new_args)
        self._new_args.clear()
        return new

    def args_so_far(self) -> str:
        return "{" + ", ".join(self._items) + ("}" if self.done else "")

    @property
    def arguments(self) -> str | None:
        """The whole arguments, once done."""
        return self.args_so_far() if self.done else None

    def rest(self) -> str:
        """The text fed after </function> (once done)."""
        return self._rest

    def feed(self, chunk: str) -> None:
        if not chunk:
            return
        self._n += len(chunk)
        if self.done:
            self._rest += chunk
            return
        if self._not_a_call:
            return
        if self.name is None:
            self._head += chunk
            if not self._head.strip():
                return
            m = _FUNC_RE.match(self._head)
            if m is None:
                head = self._head.lstrip()
                if not (FUNCTION_OPEN.startswith(head) or (head.startswith(FUNCTION_OPEN) and ">" not in head)):
                    self._not_a_call = True
                return
            self.name = m.group(1).strip()
            self._types = schema_types(self._tools, self.name)
            self._new_args.append("{")
            chunk, self._head = self._head[m.end():], ""
        self._body(chunk)

    def _body(self, text: str) -> None:
        while True:
            if self._phase == self._BETWEEN:
                f = self._between.feed(text)
                if f.marker is None:
                    return  # text between parameters is not part of the call
                if f.marker == FUNCTION_CLOSE:
                    return self._close(f.after)
                self._phase, self._tag, text = self._TAG, "", f.after
            if self._phase == self._TAG:
                self._tag += text
                text = ""
                tag = self._tag
                ends = [i for i in (tag.find(">"), tag.find("\n")) if i >= 0]
                if not ends:
                    return
                j = min(ends)
                close = tag.find(FUNCTION_CLOSE, 0, j + 1)
                if close >= 0:  # the function ends inside what looked like a tag
                    return self._close(tag[close + len(FUNCTION_CLOSE):])
                if tag[j] == ">" and j > 0:
                    self._phase, self._key, self._value_parts = self._VALUE, tag[:j], []
                    text = tag[j + 1:]
                else:  # not a tag: look again from the character after its "<"
                    self._phase, self._between = self._BETWEEN, MarkerScan([PARAMETER_OPEN, FUNCTION_CLOSE])
                    text = PARAMETER_OPEN[1:] + tag
                    continue
            f = self._value.feed(text)
            self._value_parts.append(f.before)
            if f.marker is None:
                return
            if f.marker == FUNCTION_CLOSE:
                return self._close(f.after)
            key = self._key.strip()
            value = xml_value("".join(self._value_parts), self._types.get(key))
            item = f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
            self._new_args.append((", " if self._items else "") + item)
            self._items.append(item)
            self._phase, text = self._BETWEEN, f.after

    def _close(self, after: str) -> None:
        self.done = True
        self._new_args.append("}")
        self._rest = after
        self.end = self._n - len(after)
