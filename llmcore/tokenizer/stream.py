"""Incremental detokenizing for streamed output: ``feed(id)`` returns only complete UTF-8
text, so a character split across byte tokens is never cut in two; ``flush()`` returns
what is left (an incomplete sequence becomes U+FFFD)."""
from __future__ import annotations

import codecs
from typing import Protocol


class PieceSource(Protocol):
    def token_to_piece(self, tid: int, special: bool = True) -> bytes: ...


class StreamDecoder:
    """See the module docstring. special=True keeps control tokens' text."""

    def __init__(self, tokenizer: PieceSource, special: bool = False):
        self.tokenizer = tokenizer
        self.special = special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tid: int) -> str:
        return self._dec.decode(self.tokenizer.token_to_piece(tid, self.special))

    def flush(self) -> str:
        s = self._dec.decode(b"", final=True)
        self._dec.reset()
        return s
