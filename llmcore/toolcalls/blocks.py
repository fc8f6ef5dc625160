"""Calls written in marked blocks, read one block at a time: the shared reader of the
formats whose call bodies are not streamed piece by piece (LFM2, GLM-4.5, DeepSeek,
Kimi K2).

    content <SECTION_OPEN> <CALL_OPEN> body <CALL_CLOSE> ... <SECTION_CLOSE> content

Text before the first block (or section) is content. A block's body is collected until
its closer (each character is scanned once) and parsed once (``parse_body``); a block
that does not parse comes back as content, markers and all. Spaces between blocks and a
stretch of only spaces after a call are dropped.
"""
from __future__ import annotations

from typing import ClassVar

from .formats import Format, ParseOptions
from .output import Output
from .scan import MarkerScan


class BlockCalls(Format):
    section_open: ClassVar[str | None] = None  # calls come in one section (None: blocks alone)
    section_close: ClassVar[str | None] = None
    call_open: ClassVar[str]
    call_close: ClassVar[str]

    _CONTENT, _SECTION, _CALL = range(3)

    def parse_body(self, body: str) -> list[tuple[str, str]] | None:
        """The calls of one block's body as (name, JSON arguments); None: not a call."""
        raise NotImplementedError

    def __init__(self, out: Output, opts: ParseOptions):
        super().__init__(out, opts)
        self._state = self._CONTENT
        self._outside = MarkerScan([self.section_open or self.call_open])
        inside = [self.call_open] + ([self.section_close] if self.section_close else [])
        self._section = MarkerScan(inside)
        ends = [self.call_close] + ([self.section_close] if self.section_close else [])
        self._call = MarkerScan(ends)
        self._body: list[str] = []
        self._has_calls = False
        self._spaces = ""  # spaces after a call, kept until text follows

    def feed(self, text: str, final: bool) -> None:
        while True:
            if self._state == self._CONTENT:
                f = self._outside.feed(text)
                self._content(f.before)
                if f.marker is None:
                    if final:
                        self._content(self._outside.flush())
                    return
                self._state = self._SECTION if self.section_open else self._CALL
                self._body, text = [], f.after
            elif self._state == self._SECTION:
                f = self._section.feed(text)  # what lies between blocks is dropped
                if f.marker is None:
                    if final:
                        self._section.flush()
                    return
                self._state = self._CALL if f.marker == self.call_open else self._CONTENT
                self._body, text = [], f.after
            else:
                f = self._call.feed(text)
                self._body.append(f.before)
                if f.marker is None:
                    if not final:
                        return
                    self._body.append(self._call.flush())
                    self._settle("".join(self._body), "")
                    return
                self._settle("".join(self._body), f.marker)
                back = self._SECTION if self.section_open and f.marker == self.call_close else self._CONTENT
                self._state, text = back, f.after

    def _settle(self, body: str, closer: str) -> None:
        try:
            calls = self.parse_body(body)
        except (ValueError, SyntaxError, TypeError, RecursionError):
            calls = None
        if not calls:  # not a call: its text stays, as written
            self.out.add_content(self.call_open + body + closer)
            return
        for name, args in calls:
            self.out.start_call(name)
            self.out.end_call(args)
        self._has_calls = True
        self._spaces = ""

    def _content(self, text: str) -> None:
        if not text:
            return
        if not self._has_calls:
            self.out.add_content(text)
        elif text.strip():
            self.out.add_content(self._spaces + text)
            self._spaces, self._has_calls = "", False
        else:
            self._spaces += text
