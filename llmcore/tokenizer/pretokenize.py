"""BPE pre-tokenizers: the regex chains llama.cpp's ``llm_tokenizer_bpe`` applies before
merging, picked by ``tokenizer.ggml.pre``, with the vocabulary flags each one implies.

Each regex of a chain splits the pieces left by the previous one, and text between
matches is kept as its own piece (``regex_split``, llama.cpp's unicode_regex_split).

    pre = PRE_TOKENIZERS["llama3"]
    pre.split("I'M 12345")  -> ["I", "'M", " ", "123", "45"]
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Sequence

import regex


def regex_split(text: str, patterns: Sequence[regex.Pattern]) -> list[str]:
    """llama.cpp's unicode_regex_split: each pattern splits the pieces of the previous one;
    the text between matches is kept as a piece of its own."""
    pieces = [text]
    for pat in patterns:
        out: list[str] = []
        for p in pieces:
            pos = 0
            for m in pat.finditer(p):
                s, e = m.span()
                if s > pos:
                    out.append(p[pos:s])
                if e > s:
                    out.append(p[s:e])
                pos = e
            if pos < len(p):
                out.append(p[pos:])
        pieces = out
    return pieces


@dataclass(frozen=True)
class PreTokenizer:
    """One ``tokenizer.ggml.pre`` entry. The flags are llama.cpp's per-type defaults:
    clean_spaces (decoding drops a space before punctuation), ignore_merges (a word that
    is a whole token is not merged), add_bos (when the metadata has no add_bos_token)."""

    name: str
    exprs: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False

    @functools.cached_property
    def patterns(self) -> list[regex.Pattern]:
        return [regex.compile(e) for e in self.exprs]

    def split(self, text: str) -> list[str]:
        return regex_split(text, self.patterns)


PRE_TOKENIZERS: dict[str, PreTokenizer] = {}


def _reg(names: Iterable[str], exprs: list[str], **flags: bool) -> None:
    for n in names:
        PRE_TOKENIZERS[n] = PreTokenizer(n, tuple(exprs), **flags)


# ---------------------------------------------------------------------------------------
# the regexes

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"((?=[\p{L}])([^a-z]))"
_LOWER = r"((?=[\p{L}])([^A-Z]))"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]

# ---------------------------------------------------------------------------------------
# name -> chain and flags (llama.cpp's table)

_DEFAULT_EXPRS = [
    r"[\p{P}\$\+<=>\^~\|]+",
    _GPT2,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
]
_reg(["default"], _DEFAULT_EXPRS)
_reg(
    ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"],
    [_LLAMA3],
    ignore_merges=True,
    add_bos=True,
)
_reg(["dbrx", "smaug-bpe"], [_LLAMA3])
_reg(["glm4", "chatglm-bpe"], [_LLAMA3])
_reg(["deepseek-v3"], _DEEPSEEK3, clean_spaces=False)
_reg(["deepseek-coder"], [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"], clean_spaces=False)
_reg(["falcon"], [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"])
_reg(["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"], [r"\p{N}", _GPT2])
_reg(["smollm", "command-r"], [r"\p{N}", _GPT2], clean_spaces=False)
_reg(
    ["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
     "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4"],
    [_GPT2],
)
_reg(["trillion", "granite-docling"], [_GPT2], clean_spaces=False)
_reg(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"], [_QWEN2], clean_spaces=False)
_reg(["stablelm2", "megrez"], [_QWEN2])
_reg(["hunyuan", "solar-open"], [_QWEN2], clean_spaces=False)
_reg(["qwen35"], [_QWEN35], clean_spaces=False)
_reg(["poro-chat"], [r" ?[^(\s|.,!?…。，、।۔،)]+"], clean_spaces=False)
_reg(["bloom", "gpt3-finnish"], [r" ?[^(\s|.,!?…。，、।۔،)]+"])
_reg(["viking"], [r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"], clean_spaces=False)
_reg(["tekken"], [_TEKKEN], clean_spaces=False, ignore_merges=True, add_bos=True)
_reg(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], [_GPT4O], clean_spaces=False)
_reg(
    ["seed-coder"],
    [_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"],
    clean_spaces=False,
)
_reg(
    ["bailingmoe", "bailingmoe2", "llada-moe"],
    [r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"],
    clean_spaces=False,
)
_reg(["grok-2"], [_QWEN2], clean_spaces=False)
_reg(["superbpe"], [r"\p{N}+", r"(?=(\d{3})+(?!\d))"], clean_spaces=False)
