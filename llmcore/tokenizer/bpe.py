"""``BPETokenizer`` (``tokenizer.ggml.model = "gpt2"``): GPT-2-style byte-level BPE.

The text is split by the pre-tokenizer's regex chain (``pretokenize.py``, chosen by
``tokenizer.ggml.pre``); each piece is mapped to byte-level characters
(``bytelevel.py``) and merged by merge rank (``merge.py``). A merged symbol the
vocabulary lacks falls back to one token per byte where the vocabulary has one.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from ..errors import ModelLoadError
from .base import Tokenizer
from .bytelevel import byte_decode, byte_encode
from .merge import merge
from .pretokenize import PRE_TOKENIZERS, PreTokenizer
from .special import DefaultIds
from .vocab import Vocab

log = logging.getLogger("llmcore")


class BPETokenizer(Tokenizer):
    model = "gpt2"
    type = "bpe"
    default_ids = DefaultIds(bos=11, eos=11, unk=None)

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str] | None,
        pre: str | None = None,
        token_types: Sequence[int] | None = None,
        ignore_merges: bool | None = None,
        **common: Any,
    ):
        """`common`: the special ids and add_* flags of ``Tokenizer.__init__``."""
        if merges is None:
            raise ModelLoadError("BPE tokenizer: tokenizer.ggml.merges missing")
        vocab = Vocab(tokens, token_types)
        name = pre or "default"
        if not pre:
            log.warning("tokenizer: missing pre-tokenizer type, using 'default' (generation quality may degrade)")
        if name not in PRE_TOKENIZERS:
            log.warning("tokenizer: unknown pre-tokenizer type %r, using 'default'", name)
            name = "default"
        self.pre_tokenizer: PreTokenizer = PRE_TOKENIZERS[name]
        self.add_space_prefix = False
        self.clean_spaces = self.pre_tokenizer.clean_spaces
        self.add_bos = self.pre_tokenizer.add_bos
        self.ignore_merges = self.pre_tokenizer.ignore_merges if ignore_merges is None else bool(ignore_merges)
        self._merges: dict[str, int] = {}  # "left right" -> its rank (index in the merge list)
        for i, m in enumerate(merges):
            key = m if m.find(" ", 1) >= 0 else " "  # llama.cpp: a merge without a space maps ("", "")
            self._merges.setdefault(key, i)
        self._merge_order = range(len(merges))  # a merge ranks by its index
        super().__init__(vocab, **common)

    @classmethod
    def _from_metadata(cls, meta: dict[str, Any], **common: Any) -> "BPETokenizer":
        return cls(merges=meta.get("tokenizer.ggml.merges"), pre=meta.get("tokenizer.ggml.pre"), **common)

    @property
    def pre(self) -> str:
        """The pre-tokenizer's name (``tokenizer.ggml.pre``, or "default")."""
        return self.pre_tokenizer.name

    def _encode_fragment(self, text: str, out: list[int], after_special: bool) -> None:
        cache = self._word_cache
        for word in self.pre_tokenizer.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._word_ids(byte_encode(word))
                self._remember(word, ids)
            out.extend(ids)

    def _word_ids(self, word: str) -> list[int]:
        """Ids of one pre-tokenized word (already in byte-level characters)."""
        t2i = self.vocab.ids
        if self.ignore_merges:
            tid = t2i.get(word)
            if tid is not None:
                return [tid]
        ids: list[int] = []
        for s in merge(word, self._merges, self._merge_order, " "):
            tid = t2i.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            # no token for this symbol: one token per byte when the vocab has it (llama.cpp
            # looks up the symbol's UTF-8 bytes, so only ASCII ones can be found)
            for b in s.encode("utf-8"):
                bt = t2i.get(chr(b)) if b < 128 else None
                if bt is not None:
                    ids.append(bt)
        return ids

    def _normal_piece(self, text: str) -> bytes:
        return byte_decode(text)
