"""Mistral calls after ``[TOOL_CALLS]``: a JSON list ``[{"name": .., "arguments": {..}}, ..]``
(each call appears once its object is complete), or ``name[ARGS]{..}`` (v11 templates;
the arguments stream), repeated with or without another ``[TOOL_CALLS]``.

Text before the first ``[TOOL_CALLS]`` is content; after it, only calls count.
"""
from __future__ import annotations

import json
import re

import regex

from .formats import Format, ParseOptions, register
from .jsontext import DECODER, JsonScan, close_json
from .output import Output
from .scan import MarkerScan

TOOL_CALLS = "[TOOL_CALLS]"
_NAMED_RE = re.compile(r"([\w.\-]+)\[ARGS\]")
_NAMED_PARTIAL = regex.compile(_NAMED_RE.pattern)


@register
class Mistral(Format):
    name = "mistral"
    needs_special = True

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return "[TOOL_CALLS]" in template

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, call_object_schema, per_tool

        if "[ARGS]" in template:  # v11: name[ARGS]{..}, each call after its own [TOOL_CALLS]
            call = per_tool(tools, lambda name, params: f"{w.lit(name + '[ARGS]')} {w.json(params)}")
            return CallSyntax(open=TOOL_CALLS, call=call, per_call=True)
        return CallSyntax(open=TOOL_CALLS + "[", call=w.json(call_object_schema(tools)), sep='", "',
                          close='"]"')

    _CONTENT, _CALLS, _ARGS, _LIST, _ELEMENT, _DONE = range(6)

    def __init__(self, out: Output, opts: ParseOptions):
        super().__init__(out, opts)
        self._state = self._CONTENT
        self._tag = MarkerScan([TOOL_CALLS])
        self._buf = ""  # undecided text after [TOOL_CALLS] or between list elements
        self._args: JsonScan | None = None  # a name[ARGS]{..} call's arguments
        self._args_raw: list[str] = []
        self._args_text: list[str] = []  # ... with raw control characters escaped
        self._args_failed = False  # they closed but do not decode: the rest of the text counts
        self._element: JsonScan | None = None  # a list element that is an object or a list
        self._element_raw: list[str] = []
        self._element_scalar = False  # ... or a string, number or literal
        self._after_element = False  # an element was just read: one comma may come

    def feed(self, text: str, final: bool) -> None:
        if self._state == self._CONTENT:
            f = self._tag.feed(text)
            self.out.add_content(f.before)
            if f.marker is None:
                if final:
                    self.out.add_content(self._tag.flush())
                return
            self._state, text = self._CALLS, f.after
        while self._state != self._DONE:
            if self._state == self._CALLS:
                text = self._calls(text, final)
            elif self._state == self._ARGS:
                text = self._named_args(text, final)
            elif self._state == self._LIST:
                text = self._list(text, final)
            else:
                text = self._list_element(text, final)
            if text is None:
                return

    # each step returns the text left for the next state, or None to wait for more

    def _calls(self, text: str, final: bool) -> str | None:
        """Between calls: another [TOOL_CALLS], a list, or name[ARGS]."""
        s = (self._buf + text).lstrip()
        self._buf = ""
        if not s:
            return None
        if s.startswith(TOOL_CALLS):
            return s[len(TOOL_CALLS):]
        if TOOL_CALLS.startswith(s) and not final:
            self._buf = s
            return None
        if s.startswith("["):
            self._state = self._LIST
            return s[1:]
        m = _NAMED_RE.match(s)
        if m is None:
            if not final and _NAMED_PARTIAL.match(s, partial=True):
                self._buf = s
                return None
            self._state = self._DONE  # anything else ends the calls
            return None
        self.out.start_call(m.group(1))
        self._state, self._args, self._args_failed = self._ARGS, None, False
        self._args_raw, self._args_text = [], []
        return s[m.end():]

    def _named_args(self, text: str, final: bool) -> str | None:
        """The arguments object of name[ARGS] (streamed as it comes)."""
        if self._args is None:
            if not text:
                if final:
                    self._state = self._DONE
                return None
            if text[0] != "{":  # the call keeps empty arguments and stays unfinished
                self.out.drop_call()
                self._state = self._DONE
                return None
            self._args = JsonScan()
        piece, close = self._args.feed(text, sanitize=True, stop_at_close=not self._args_failed)
        self._args_raw.append(text if close < 0 else text[:close])
        if close >= 0:
            try:
                DECODER.raw_decode("".join(self._args_raw))
            except ValueError:  # not valid JSON: the rest of the text counts as arguments too
                self._args_failed = True
                rest, _ = self._args.feed(text[close:], sanitize=True, stop_at_close=False)
                piece += rest
            else:
                self.out.add_args(piece)
                self.out.end_call()
                self._state = self._CALLS
                return text[close:]
        self._args_text.append(piece)
        if final:  # unfinished: closed as far as the JSON allows
            self.out.end_call(close_json("".join(self._args_text)))
            self._state = self._DONE
        else:
            self.out.add_args(piece)
        return None

    def _list(self, text: str, final: bool) -> str | None:
        """Inside [..]: the next element, or the end of the list (which ends the calls)."""
        s = (self._buf + text).lstrip()
        self._buf = ""
        if not s:
            return None
        if self._after_element and s.startswith(","):
            s = s[1:].lstrip()
            if not s:
                self._after_element = False
                return None
        self._after_element = False
        if s.startswith("]"):
            self._state = self._DONE
            return None
        self._state, self._element_raw = self._ELEMENT, []
        self._element_scalar = s[0] not in "{["
        self._element = None if self._element_scalar else JsonScan()
        return s

    def _list_element(self, text: str, final: bool) -> str | None:
        """One list element; a complete {"name": .., "arguments": ..} object is a call."""
        if not self._element_scalar:
            _, close = self._element.feed(text)
            self._element_raw.append(text if close < 0 else text[:close])
            if close < 0:
                return None
            s, rest = "".join(self._element_raw), text[close:]
        else:  # a string, number or literal: short, decoded when it can be
            s = "".join(self._element_raw) + text
            self._element_raw = [s]
            rest = ""
        try:
            obj, end = DECODER.raw_decode(s)
        except ValueError:
            if not self._element_scalar:
                self._state = self._DONE  # an object that is not JSON: nothing more is read
            return None
        if self._element_scalar and end == len(s) and not final:
            return None  # a number may go on
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", obj.get("parameters", {}))
            self.out.start_call(obj["name"])
            self.out.end_call(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
        self._state, self._after_element = self._LIST, True  # a comma may follow
        return s[end:] + rest
