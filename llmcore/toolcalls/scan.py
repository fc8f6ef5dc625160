"""Finding markers in text that arrives in pieces.

``MarkerScan`` passes text on as soon as it cannot be part of a marker and keeps back a
tail that could still grow into one (``held_suffix``, the engine's stop-string hold-back),
so each piece costs its own length, however long the text around the markers grows.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from ..engine.output import held_suffix


class Found(NamedTuple):
    before: str  # text before the marker (or all the text that is safe so far)
    marker: str | None  # the first marker found, or None
    after: str  # the text after the marker ("" when none was found)


class MarkerScan:
    """The first occurrence of any of `markers` in a text fed piece by piece."""

    __slots__ = ("markers", "_tail")

    def __init__(self, markers: Sequence[str]):
        self.markers = tuple(markers)
        self._tail = ""

    def feed(self, text: str) -> Found:
        s = self._tail + text if self._tail else text
        best, found = -1, None
        for m in self.markers:
            i = s.find(m)
            if i >= 0 and (best < 0 or i < best):
                best, found = i, m
        if found is not None:
            self._tail = ""
            return Found(s[:best], found, s[best + len(found):])
        h = held_suffix(s, self.markers)
        self._tail = s[len(s) - h:] if h else ""
        return Found(s[:len(s) - h], None, "")

    def flush(self) -> str:
        """The held-back tail (at the end of the text: no marker will complete it)."""
        t, self._tail = self._tail, ""
        return t
