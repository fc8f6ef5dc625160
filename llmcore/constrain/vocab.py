"""The model's vocabulary as llguidance sees it: each token's bytes, special tokens marked.

llguidance matches grammars against token bytes. A control token (``<|im_end|>``,
``<|tool_call_start|>``) is a special token: its bytes get a leading 0xff (as
llguidance's llama.cpp binding does), so it never matches grammar text and a grammar names
it by id. A user-defined token (``<tool_call>``, ``<think>`` in Qwen vocabularies) stays
text: a grammar literal matches it whether the model writes it as that one token or as
characters. End-of-generation tokens are the grammar's EOS: they are allowed exactly
where the grammar may end.

Building it walks the vocabulary (about 0.4 s for 49k tokens): once per tokenizer, in the
thread that first needs it (a request's worker thread, never the engine thread).
"""
from __future__ import annotations

import threading
from typing import Any

_SPECIAL_PREFIX = b"\xff"
_LOCK = threading.Lock()
_ATTR = "_llmcore_grammar_vocab"


def _is_special(tokenizer: Any, tid: int) -> bool:
    is_control = getattr(tokenizer, "is_control", None)
    if is_control is not None:
        return bool(is_control(tid))
    special = getattr(tokenizer, "special_ids", None)
    if special is not None:
        return tid in special
    return tid in getattr(tokenizer, "eog_ids", ()) or tid == getattr(tokenizer, "bos_id", None)


class _Encoder:
    """The callable llguidance tokenizes grammar-forced text with (bytes or str in)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def __call__(self, text) -> list[int]:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        return [int(t) for t in self.tokenizer.encode(text, add_special=False, parse_special=False)]


class GrammarVocab:
    """An llguidance tokenizer over a model's vocabulary, and the texts of its special tokens."""

    def __init__(self, tokenizer: Any):
        import llguidance

        n = int(getattr(tokenizer, "vocab_size", 0) or getattr(tokenizer, "n_vocab"))
        pieces: list[bytes] = []
        specials: dict[str, int] = {}
        for tid in range(n):
            p = bytes(tokenizer.token_to_piece(tid))
            if _is_special(tokenizer, tid):
                specials.setdefault(p.decode("utf-8", errors="replace"), tid)
                p = _SPECIAL_PREFIX + p
            pieces.append(p)
        eog = sorted(int(t) for t in getattr(tokenizer, "eog_ids", ()) or ())
        eos = getattr(tokenizer, "eos_id", None)
        if not eog and eos is not None:
            eog = [int(eos)]

        class _Wrapped:  # what llguidance.TokenizerWrapper reads
            eos_token_id = eog[0] if eog else 0
            bos_token_id = getattr(tokenizer, "bos_id", None)
            tokens = pieces
            special_token_ids = sorted(specials.values())
            __call__ = _Encoder(tokenizer).__call__

        self.n_vocab = n
        self.eog_ids = tuple(eog)
        self.special_ids: dict[str, int] = specials  # text -> id
        self.lltokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped()),
                                                  eos_token=list(eog) or None)

    @classmethod
    def of(cls, tokenizer: Any) -> "GrammarVocab":
        """The tokenizer's GrammarVocab, built on first use and kept on the tokenizer."""
        got = getattr(tokenizer, _ATTR, None)
        if got is not None:
            return got
        with _LOCK:
            got = getattr(tokenizer, _ATTR, None)
            if got is None:
                got = cls(tokenizer)
                try:
                    setattr(tokenizer, _ATTR, got)
                except AttributeError:  # a tokenizer without a __dict__: built each time
                    pass
        return got

    def is_special(self, text: str) -> bool:
        """Whether `text` is exactly one special token (a grammar names it by id)."""
        return text in self.special_ids
