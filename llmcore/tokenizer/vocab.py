"""The vocabulary both tokenizer kinds share: token strings <-> ids, per-token attributes
(llama.cpp's ``llama_token_attr`` flags, from ``tokenizer.ggml.token_type``) and scores.

Token strings are kept exactly as the GGUF stores them (byte-level characters for BPE,
U+2581 for spaces in SPM); turning a token into bytes is the tokenizer's job.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ModelLoadError

# token attributes (llama_token_attr bit flags)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

# tokenizer.ggml.token_type values -> attributes
TYPE_TO_ATTR = {
    0: ATTR_UNDEFINED,
    1: ATTR_NORMAL,
    2: ATTR_UNKNOWN,
    3: ATTR_CONTROL,
    4: ATTR_USER_DEFINED,
    5: ATTR_UNUSED,
    6: ATTR_BYTE,
}


class Vocab:
    """Token strings, their ids, attributes (mutable: special-token detection refines
    them) and scores. An empty token string becomes ``[EMPTY_<id>]`` as in llama.cpp."""

    __slots__ = ("texts", "ids", "attrs", "scores")

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int] | None = None,
        scores: Sequence[float] | None = None,
    ):
        n = len(tokens)
        self.texts: list[str] = list(tokens)
        self.ids: dict[str, int] = {}
        for i, t in enumerate(self.texts):
            if t == "":
                t = f"[EMPTY_{i}]"
                self.texts[i] = t
            if t in self.ids:
                raise ModelLoadError(f"duplicate token in vocabulary: {t!r} has ids {self.ids[t]} and {i}")
            self.ids[t] = i
        if token_types is not None:
            self.attrs: list[int] = [TYPE_TO_ATTR.get(int(x), ATTR_UNDEFINED) for x in token_types[:n]]
        else:
            self.attrs = [ATTR_NORMAL] * n
        self.scores: list[float] = [float(s) for s in scores[:n]] if scores is not None else [0.0] * n

    def __len__(self) -> int:
        return len(self.texts)

    def valid_id(self, tid: int | None) -> bool:
        return tid is not None and 0 <= int(tid) < len(self.texts)
