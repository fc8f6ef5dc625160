"""The leading think block: ``<think>..</think>`` at the start of the output (or the whole
output up to ``</think>`` when the prompt already opened the block) is reasoning; the
text after it goes on to the tool-call format.

The reasoning loses its newlines at both ends; while the block is open, a tail that
could be the start of ``</think>`` is held back, and so are newlines that could turn out
to be the last ones.
"""
from __future__ import annotations

from .formats import Stage
from .output import Output
from .scan import MarkerScan

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def prompt_ends_in_think(prompt: str) -> bool:
    """A template that opens the think block itself (model output starts inside it)."""
    return prompt.rstrip().endswith(THINK_OPEN)


class ReasoningSplit(Stage):
    """Splits the think block off the front; feeds the rest to `after`."""

    _UNDECIDED, _INSIDE, _AFTER_CLOSE, _PASS = range(4)

    def __init__(self, out: Output, after: Stage, start_inside: bool = False):
        self.out = out
        self.after = after
        self._state = self._INSIDE if start_inside else self._UNDECIDED
        self._buf = ""  # undecided text
        self._close = MarkerScan([THINK_CLOSE])
        self._started = False  # reasoning text other than newlines has come
        self._newlines = ""  # newlines not emitted yet: they may end the block

    def feed(self, text: str, final: bool) -> None:
        if self._state == self._UNDECIDED:
            self._buf += text
            s = self._buf.lstrip()
            if s.startswith(THINK_OPEN):
                self._state, text = self._INSIDE, s[len(THINK_OPEN):]
            elif not final and THINK_OPEN.startswith(s):
                return  # could still become "<think>"
            else:
                self._state, text = self._PASS, self._buf
            self._buf = ""
        if self._state == self._INSIDE:
            f = self._close.feed(text)
            self._reasoning(f.before)
            if f.marker is None:
                if not final:
                    self.in_reasoning = True
                    return
                self._reasoning(self._close.flush())
                self.in_reasoning = False
                self.after.feed("", True)
                return
            self.in_reasoning = False
            self._state, text = self._AFTER_CLOSE, f.after
        if self._state == self._AFTER_CLOSE:
            text = text.lstrip()
            if not text and not final:
                return
            self._state = self._PASS
        self.after.feed(text, final)

    def _reasoning(self, text: str) -> None:
        if not self._started:
            text = text.lstrip("\n")
            if not text:
                return
            self._started = True
        core = text.rstrip("\n")
        if core:
            self.out.add_reasoning(self._newlines + core)
            self._newlines = text[len(core):]
        else:
            self._newlines += text
