"""Llama-3 JSON calls: the whole output is ``{"name": .., "parameters": {..}}``, optionally
after ``<|python_tag|>``, several separated by ``;``.

An output that does not start as a call object is content, all of it as written
(``<|python_tag|>`` included); text after complete calls is dropped. A call still
unfinished when the output ends makes the output content, unless calls came before it.
"""
from __future__ import annotations

from .formats import Format, ParseOptions, register
from .jsoncall import CALL, JsonCall
from .output import Output

PYTHON_TAG = "<|python_tag|>"


@register
class Llama3(Format):
    name = "llama3"

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return "<|python_tag|>" in template or ("ipython" in template and "parameters" in template)

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, per_tool

        head = '{"name": "'
        call = per_tool(tools, lambda name, params: f'{w.lit(name + chr(34) + ", " + chr(34) + "parameters" + chr(34) + ": ")} '
                                                     f'{w.json(params)} "}}"')
        # calls are the whole output: "auto" cannot tell a call from text until it is one
        return CallSyntax(open=head, call=call, sep=f'"; " {w.lit(head)}', lazy=False,
                          plain=w.rule(r"/([^{](.|\n)*)?/"))

    _START, _CALLS, _BETWEEN, _CONTENT, _DROP = range(5)

    def __init__(self, out: Output, opts: ParseOptions):
        super().__init__(out, opts)
        self._state = self._START
        self._buf = ""  # text before the first call is decided
        self._raw: list[str] | None = []  # the whole output, while it may still turn into content
        self._call = JsonCall()
        self._started = False
        self._n_calls = 0  # complete calls

    def feed(self, text: str, final: bool) -> None:
        if self._raw is not None:
            self._raw.append(text)
        if self._state == self._CONTENT:
            self.out.add_content(text)
            return
        if self._state == self._DROP:
            return
        if self._state == self._START:
            self._buf += text
            t = self._buf.lstrip()
            if t.startswith(PYTHON_TAG):
                t = t[len(PYTHON_TAG):]
            elif not final and (not t or PYTHON_TAG.startswith(t)):
                return
            self._buf, text, self._state = "", t, self._CALLS
        while True:
            if self._state == self._BETWEEN:  # after a call: spaces, then an optional ";"
                text = text.lstrip()
                if not text:
                    return
                if text.startswith(";"):
                    text = text[1:]
                self._state, self._call, self._started = self._CALLS, JsonCall(), False
            call = self._call
            call.feed(text)
            if call.state == CALL and not call.done and not final:
                if not self._started:
                    self.out.start_call(call.name)
                    self._started = True
                self.out.add_args(call.take_args())
                return
            if call.done:
                if not self._started:
                    self.out.start_call(call.name)
                    self._started = True
                call.take_args()
                self.out.end_call(call.arguments)
                self._n_calls += 1
                self._raw = None
                self._state, text = self._BETWEEN, call.rest()
                continue
            if not final and not call.settled:
                return  # nothing to show yet
            if not call.text().strip():
                return  # only spaces after the last call (or no output at all)
            if self._started and self.out.call_open:
                self.out.drop_call()
            if self._n_calls:
                self._state = self._DROP  # trailing text after calls is dropped
                return
            self._state = self._CONTENT
            self.out.add_content("".join(self._raw or ()))
            self._raw = None
            return
