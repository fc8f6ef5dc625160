"""Hermes / Qwen JSON calls: ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``
(Qwen2.5/3, Hermes, SmolLM2-style ChatML). Inside the block a Qwen3-Coder
``<function=..>`` body works too.

Text between blocks is content; once a call has been made, a stretch of spaces only
between blocks is dropped. A block that holds no call stays in the content as written.
A block cut off by ``</tool_call>`` or by the end of the output is repaired as far as
the JSON allows.
"""
from __future__ import annotations

from .formats import Format, ParseOptions, register
from .jsoncall import CALL, PENDING, JsonCall
from .jsontext import close_json, valid_json
from .output import Output
from .scan import MarkerScan
from .xmlcall import FUNCTION_OPEN, XmlCall

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
NL = "\n"


class CallBody:
    """A block's body: a JSON call object, or else a Qwen3-Coder XML call (which one is
    decided by its first character other than a space)."""

    def __init__(self, tools: list):
        self._tools = tools
        self._lead = ""
        self.scanner: JsonCall | XmlCall | None = None

    def feed(self, text: str) -> None:
        if self.scanner is None:
            self._lead += text
            s = self._lead.lstrip()
            if not s:
                return
            self.scanner = JsonCall() if s[0] == "{" else XmlCall(self._tools)
            text, self._lead = self._lead, ""
        self.scanner.feed(text)

    @property
    def state(self) -> str:
        return self.scanner.state if self.scanner is not None else PENDING


class _Block:
    """One call block being read; `feed` returns the text after it once it is over."""

    def __init__(self, owner: "Hermes", wrapped: bool):
        self.owner = owner
        self.out = owner.out
        self.wrapped = wrapped  # <tool_call>..</tool_call>; else a bare <function=..>..</function>
        self.raw: list[str] = []  # the block's text after its opener
        self.close = MarkerScan([TOOL_CALL_CLOSE])
        self.body = CallBody(owner.opts.tools)
        self.started = False  # the call's name has been streamed
        self.ended = False  # the call is decided

    def feed(self, text: str, final: bool) -> str | None:
        if not self.wrapped:
            return self._feed_bare(text, final)
        f = self.close.feed(text)
        self._take(f.before)
        if f.marker is None:
            if not final:
                self._stream()
                return None
            self._take(self.close.flush())
            if self.body.state == CALL:
                self._settle(self._repaired(at_close=False))
            else:
                self._drop()
                self.out.add_content(TOOL_CALL_OPEN + "".join(self.raw))
            return ""
        st = self.body.state
        if st == CALL:
            self._settle(self._repaired(at_close=True))
            return f.after
        self._drop()
        if st == PENDING:  # an empty or nameless block: kept whole
            self.out.add_content(TOOL_CALL_OPEN + "".join(self.raw) + TOOL_CALL_CLOSE)
            return f.after
        self.out.add_content(TOOL_CALL_OPEN + "".join(self.raw))  # not a call: its text stays,
        return TOOL_CALL_CLOSE + f.after  # and so does the closer, as text after it

    def _feed_bare(self, text: str, final: bool) -> str | None:
        """A <function=..> call outside a block: over at </function>; one that is not a
        call holds everything after it until the end of the output."""
        self._take(text)
        sc = self.body.scanner
        if sc.done:
            self._settle(sc.arguments)
            return sc.rest()
        if not final:
            self._stream()
            return None
        if sc.state == CALL:
            self._settle(sc.args_so_far() + "}")
        else:
            self.out.add_content("".join(self.raw))
        return ""

    def _take(self, text: str) -> None:
        if text:
            self.raw.append(text)
            self.body.feed(text)

    def _stream(self) -> None:
        """Stream what the call has so far (a call that is not one after all stops)."""
        if self.ended:
            return
        if self.body.state != CALL:
            self._drop()
            return
        sc = self.body.scanner
        if sc.done:
            self._settle(sc.arguments)
            return
        if not self.started:
            self.out.start_call(sc.name)
            self.started = True
        self.out.add_args(sc.take_args())

    def _settle(self, arguments: str) -> None:
        """The call is decided, with these arguments (what was streamed stays streamed)."""
        if self.ended:
            return
        sc = self.body.scanner
        if not self.started:
            self.out.start_call(sc.name)
            self.started = True
        sc.take_args()  # superseded by `arguments`
        self.out.end_call(arguments)
        self.ended = True
        self.owner.has_calls = True

    def _repaired(self, at_close: bool) -> str:
        """The arguments of a call cut off before its object or function closed."""
        sc = self.body.scanner
        if sc.done:
            return sc.arguments
        args = sc.args_so_far()
        if at_close:
            if not args:
                return "{}"
            return args if valid_json(args) else close_json(args)
        return close_json(args or "{}")

    def _drop(self) -> None:
        if self.started and not self.ended and self.out.call_open:
            self.out.drop_call()
        self.started = False


@register
class Hermes(Format):
    name = "hermes"
    bare_functions = False  # also read <function=..> calls outside <tool_call> blocks

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return "<tool_call>" in template

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, call_object_schema

        return CallSyntax(open=TOOL_CALL_OPEN, call=f"{w.lit(NL)} {w.json(call_object_schema(tools))} {w.lit(NL)}",
                          close=w.lit(TOOL_CALL_CLOSE), sep=w.lit(NL), per_call=True)

    def __init__(self, out: Output, opts: ParseOptions):
        super().__init__(out, opts)
        self._outside = MarkerScan([TOOL_CALL_OPEN] + ([FUNCTION_OPEN] if self.bare_functions else []))
        self._block: _Block | None = None
        self.has_calls = False
        self._run_has_text = False  # the content since the last block has more than spaces
        self._spaces = ""  # spaces after a call, kept back until text follows them

    def feed(self, text: str, final: bool) -> None:
        while True:
            if self._block is None:
                f = self._outside.feed(text)
                self._content(f.before)
                if f.marker is None:
                    if final:
                        self._content(self._outside.flush())
                    return
                self._spaces, self._run_has_text = "", False
                self._block = _Block(self, wrapped=f.marker == TOOL_CALL_OPEN)
                text = f.after if f.marker == TOOL_CALL_OPEN else FUNCTION_OPEN + f.after
            rest = self._block.feed(text, final)
            if rest is None:
                return
            self._block, text = None, rest

    def _content(self, text: str) -> None:
        if not text:
            return
        if not self.has_calls or self._run_has_text:
            self.out.add_content(text)
        elif text.strip():
            self.out.add_content(self._spaces + text)
            self._spaces, self._run_has_text = "", True
        else:
            self._spaces += text
