"""``SPMTokenizer`` (``tokenizer.ggml.model = "llama"``): SentencePiece-style merges by
token score over code points (llama.cpp's llm_tokenizer_spm).

Spaces are escaped to U+2581 and, with ``add_space_prefix``, one is put before the text
and after each special token. The best-scoring adjacent pair is merged first
(``merge.py``); a symbol the vocabulary lacks falls back to ``<0xNN>`` byte tokens.
"""
from __future__ import annotations

from typing import Any, Sequence

import regex

from .base import Tokenizer
from .merge import merge
from .special import DefaultIds
from .vocab import Vocab

SPACE = "\u2581"
_SEGMENT = regex.compile("\u2581*[^\u2581]+|\u2581+")  # "▁word" segments
_CROSS = regex.compile("[^\u2581\x00]\u2581")  # a U+2581 after another character
_MAX_CROSS_WORD_TOKENS = 64


class SPMTokenizer(Tokenizer):
    model = "llama"
    type = "spm"
    default_ids = DefaultIds(bos=1, eos=2, unk=0)

    def __init__(
        self,
        tokens: Sequence[str],
        scores: Sequence[float] | None = None,
        token_types: Sequence[int] | None = None,
        **common: Any,
    ):
        """`common`: the special ids and add_* flags of ``Tokenizer.__init__``."""
        vocab = Vocab(tokens, token_types, scores)
        self.add_space_prefix = True
        self.add_bos = True
        super().__init__(vocab, **common)
        self._merge_order = [-s for s in vocab.scores]  # a pair that makes a token ranks by its score, best first
        self._cross_word_tokens = _cross_word_tokens(vocab.texts)

    @classmethod
    def _from_metadata(cls, meta: dict[str, Any], **common: Any) -> "SPMTokenizer":
        return cls(scores=meta.get("tokenizer.ggml.scores"), **common)

    def _encode_fragment(self, text: str, out: list[int], after_special: bool) -> None:
        """SPM over one fragment. When no vocabulary string joins a non-space character to
        a following U+2581, no merge can cross the start of a "▁word" segment, so segments
        are tokenized independently (and cached): the result is the same as one pass over
        the whole fragment."""
        if self.add_space_prefix and after_special:
            text = " " + text
        text = text.replace(" ", SPACE)
        cross = self._cross_word_tokens
        if cross is None or any(c in text for c in cross):
            self._segment_ids(text, out)
            return
        cache = self._word_cache
        for seg in _SEGMENT.findall(text):
            ids = cache.get(seg)
            if ids is None:
                ids = []
                self._segment_ids(seg, ids)
                self._remember(seg, ids)
            out.extend(ids)

    def _segment_ids(self, text: str, out: list[int]) -> None:
        """Merge (ties: leftmost), then ids; unknown symbols fall back to bytes."""
        t2i = self.vocab.ids
        for s in merge(text, self.vocab.ids, self._merge_order, ""):
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for b in s.encode("utf-8"):
                bt = t2i.get(f"<0x{b:02X}>")
                if bt is None and b < 128:
                    bt = t2i.get(chr(b))
                if bt is None:
                    bt = self.unk_id
                if bt is not None:
                    out.append(bt)

    def _normal_piece(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8")


def _cross_word_tokens(texts: Sequence[str]) -> list[str] | None:
    """Vocabulary strings with a U+2581 after another character (None: too many to check
    a text for, so every fragment is tokenized in one pass)."""
    joined = "\x00".join(texts)
    found = set()
    for m in _CROSS.finditer(joined):  # the whole vocab string around each hit
        found.add(joined[joined.rfind("\x00", 0, m.start()) + 1 : (joined.find("\x00", m.end()) % (len(joined) + 1))])
    bad = sorted(found)
    return bad if len(bad) <= _MAX_CROSS_WORD_TOKENS else None
