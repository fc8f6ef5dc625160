"""Fill-in-the-middle tokens: the ids a code model marks a prefix, a suffix and the middle
to write with (``tokenizer.ggml.fim_pre_token_id`` etc. in GGUF metadata), found by their
text when the metadata does not name them, as llama.cpp does.

    fim = FimTokens.from_metadata(meta, vocab)   # None: the model cannot fill in the middle
    fim.pre, fim.suf, fim.mid                     # required; pad, rep, sep optional
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .vocab import Vocab

# the texts llama.cpp looks for when the metadata names no id
_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>", "<｜fim▁begin｜>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>", "<｜fim▁hole｜>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>", "<｜fim▁end｜>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>", "<fim-sep>"),
}


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    pad: int | None = None
    rep: int | None = None  # starts the repository name before extra files
    sep: int | None = None  # starts each file

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], vocab: Vocab) -> "FimTokens | None":
        found: dict[str, int | None] = {}
        for kind, texts in _TEXTS.items():
            tid = meta.get(f"tokenizer.ggml.fim_{kind}_token_id")
            if tid is not None and not vocab.valid_id(int(tid)):
                tid = None
            if tid is None:
                tid = next((vocab.ids[t] for t in texts if t in vocab.ids), None)
            found[kind] = None if tid is None else int(tid)
        if found["pre"] is None or found["suf"] is None or found["mid"] is None:
            return None
        return cls(**found)  # type: ignore[arg-type]
