"""Tokenizers read from GGUF metadata, matching llama.cpp's `llama-vocab.cpp`.

Two vocab types:
- ``gpt2`` (BPE): byte-level BPE with merge ranks, GPT-2 byte-to-unicode mapping, and a
  chain of pre-tokenizer regexes picked by ``tokenizer.ggml.pre`` (llama.cpp's table);
  each regex of the chain splits the pieces left by the previous one, and text between
  matches is kept as its own piece.
- ``llama`` (SPM): SentencePiece-style merges by score over code points, spaces escaped
  to U+2581, byte fallback to ``<0xNN>`` tokens, optional space prefix.

Special tokens: control (type 3), user-defined (type 4) and unknown (type 2) tokens are
split out of the text before the tokenizer runs, longest first. User-defined tokens are
always split out; control and unknown ones only with ``parse_special=True``.

API::

    tok = Tokenizer.from_gguf(gf)
    ids = tok.encode(text, add_special=True, parse_special=False)
    text = tok.decode(ids, skip_special=False)
    tok.token_to_piece(id, special=True) -> bytes
    tok.vocab_size, tok.bos_id, tok.eos_id, tok.eot_id, tok.eog_ids, tok.is_eog(id)
    tok.is_special(id)          # control/unknown: hidden when special=False
    sd = StreamDecoder(tok); sd.feed(id) -> str; sd.flush() -> str
"""
from __future__ import annotations

import codecs
import heapq
import logging
from typing import Any, Iterable, Sequence

import regex

from .errors import ModelLoadError

log = logging.getLogger("llmcore")

# token attributes (llama_token_attr bit flags)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

# tokenizer.ggml.token_type values -> attributes
_TYPE_TO_ATTR = {
    0: ATTR_UNDEFINED,
    1: ATTR_NORMAL,
    2: ATTR_UNKNOWN,
    3: ATTR_CONTROL,
    4: ATTR_USER_DEFINED,
    5: ATTR_UNUSED,
    6: ATTR_BYTE,
}

_SPM_SPACE = "\u2581"
_SPM_SEGMENT = regex.compile("\u2581*[^\u2581]+|\u2581+")
_SPM_CROSS = regex.compile("[^\u2581\x00]\u2581")

# ---------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode mapping


def _bytes_to_unicode() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = [""] * 256
    for b, c in zip(bs, cs):
        table[b] = chr(c)
    return table


BYTE_TO_UNICODE: list[str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# str.translate table: latin-1 code point (= byte value) -> byte-level unicode char
_BYTE_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_UNICODE)}


def byte_encode(text: str) -> str:
    """UTF-8 bytes of `text` mapped through GPT-2's byte-to-unicode table."""
    return text.encode("utf-8").decode("latin-1").translate(_BYTE_ENCODE_TABLE)


# ---------------------------------------------------------------------------------------
# Pre-tokenizer regexes (llama.cpp llm_tokenizer_bpe, by pre-tokenizer type)

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

# name -> (regex chain, flags). flags: clean_spaces (default True for BPE), ignore_merges,
# add_bos (default for the vocab when metadata has no add_bos_token)
_PRE: dict[str, tuple[list[str], dict[str, bool]]] = {}


def _reg(names: Iterable[str], exprs: list[str], **flags: bool) -> None:
    for n in names:
        _PRE[n] = (exprs, flags)


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

_compiled_pre: dict[str, list[regex.Pattern]] = {}


def _pre_regexes(name: str) -> list[regex.Pattern]:
    pats = _compiled_pre.get(name)
    if pats is None:
        pats = [regex.compile(e) for e in _PRE[name][0]]
        _compiled_pre[name] = pats
    return pats


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


# ---------------------------------------------------------------------------------------
# EOG / special token detection by text (llama.cpp's workaround lists)

_EOT_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
}
_EOM_TEXTS = {"<|eom_id|>"}
_FIM_PAD_TEXTS = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}
_FIM_REP_TEXTS = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}
_FIM_SEP_TEXTS = {"<|file_sep|>"}
_EOG_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
}
_ALWAYS_RENDER = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}


# ---------------------------------------------------------------------------------------


class Tokenizer:
    """A GGUF vocabulary: BPE ("gpt2") or SPM ("llama"). See the module docstring."""

    def __init__(
        self,
        model: str,
        tokens: Sequence[str],
        token_types: Sequence[int] | None = None,
        scores: Sequence[float] | None = None,
        merges: Sequence[str] | None = None,
        pre: str | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        eot_id: int | None = None,
        eom_id: int | None = None,
        unk_id: int | None = None,
        pad_id: int | None = None,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
        add_space_prefix: bool | None = None,
        ignore_merges: bool | None = None,
    ):
        self.model = model
        if model == "gpt2":
            self.type = "bpe"
            if merges is None:
                raise ModelLoadError("BPE tokenizer: tokenizer.ggml.merges missing")
            default_ids = dict(bos=11, eos=11, unk=None)
        elif model == "llama":
            self.type = "spm"
            default_ids = dict(bos=1, eos=2, unk=0)
        else:
            raise ModelLoadError(f"unsupported tokenizer model {model!r} (supported: gpt2, llama)")

        n = len(tokens)
        self._id_to_text: list[str] = list(tokens)
        self._text_to_id: dict[str, int] = {}
        for i, t in enumerate(self._id_to_text):
            if t == "":
                t = f"[EMPTY_{i}]"
                self._id_to_text[i] = t
            if t in self._text_to_id:
                raise ModelLoadError(f"duplicate token in vocabulary: {t!r} has ids {self._text_to_id[t]} and {i}")
            self._text_to_id[t] = i
        if token_types is not None:
            self._attr = [_TYPE_TO_ATTR.get(int(x), ATTR_UNDEFINED) for x in token_types[:n]]
        else:
            self._attr = [ATTR_NORMAL] * n
        self._scores = [float(s) for s in scores[:n]] if scores is not None else [0.0] * n

        # per-type defaults, then the pre-tokenizer flags, then metadata overrides
        self.clean_spaces = False
        self.ignore_merges = False
        self.byte_encode = True
        self.escape_whitespaces = False
        if self.type == "bpe":
            self.add_space_prefix = False
            self.clean_spaces = True
            self.add_bos = False
            self.add_eos = False
            name = pre or "default"
            if not pre:
                log.warning("tokenizer: missing pre-tokenizer type, using 'default' (generation quality may degrade)")
            if name not in _PRE:
                log.warning("tokenizer: unknown pre-tokenizer type %r, using 'default'", name)
                name = "default"
            self.pre = name
            flags = _PRE[name][1]
            self.clean_spaces = flags.get("clean_spaces", True)
            self.ignore_merges = flags.get("ignore_merges", False)
            self.add_bos = flags.get("add_bos", False)
            self._pre_patterns = _pre_regexes(name)
            self._ranks: dict[str, int] = {}
            for i, m in enumerate(merges):
                pos = m.find(" ", 1)
                key = m if pos >= 0 else " "  # llama.cpp: a merge without a space maps ("", "")
                self._ranks.setdefault(key, i)
        else:
            self.pre = "default"
            self.add_space_prefix = True
            self.add_bos = True
            self.add_eos = False
            self._pre_patterns = []
            self._ranks = {}
        if add_space_prefix is not None:
            self.add_space_prefix = bool(add_space_prefix)
        if ignore_merges is not None:
            self.ignore_merges = bool(ignore_merges)

        def valid(tid: int | None, default: int | None) -> int | None:
            if tid is not None and 0 <= int(tid) < n:
                return int(tid)
            if tid is not None:
                log.warning("tokenizer: special token id %s out of range, using default %s", tid, default)
            return default if default is not None and 0 <= default < n else None

        self.bos_id = valid(bos_id, default_ids["bos"])
        self.eos_id = valid(eos_id, default_ids["eos"])
        self.unk_id = valid(unk_id, default_ids["unk"])
        self.pad_id = valid(pad_id, None)
        self.eot_id = valid(eot_id, None)
        self.eom_id = valid(eom_id, None)
        if add_bos is not None:
            self.add_bos = bool(add_bos)
        if add_eos is not None:
            self.add_eos = bool(add_eos)
        if self.add_bos and self.bos_id is None:
            raise ModelLoadError("tokenizer: add_bos_token is true, but bos_token_id is not set")
        if self.add_eos and self.eos_id is None:
            raise ModelLoadError("tokenizer: add_eos_token is true, but eos_token_id is not set")

        self._detect_special_by_text()
        self._build_special_cache()
        self._pieces: list[bytes | None] = [None] * n
        self._bpe_cache: dict[str, list[int]] = {}
        self._spm_cross: list[str] | None | bool = False
        if self.type == "spm":
            self._spm_cross_tokens()

    # --- construction -----------------------------------------------------------------
    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
        """From a GGUF metadata dict (keys tokenizer.ggml.*)."""
        g = meta.get
        model = g("tokenizer.ggml.model")
        if model is None:
            raise ModelLoadError("no tokenizer in this GGUF (tokenizer.ggml.model missing)")
        tokens = g("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelLoadError("no tokenizer vocabulary in this GGUF (tokenizer.ggml.tokens missing)")
        return cls(
            model=str(model),
            tokens=tokens,
            token_types=g("tokenizer.ggml.token_type"),
            scores=g("tokenizer.ggml.scores"),
            merges=g("tokenizer.ggml.merges"),
            pre=g("tokenizer.ggml.pre"),
            bos_id=g("tokenizer.ggml.bos_token_id"),
            eos_id=g("tokenizer.ggml.eos_token_id"),
            eot_id=g("tokenizer.ggml.eot_token_id"),
            eom_id=g("tokenizer.ggml.eom_token_id"),
            unk_id=g("tokenizer.ggml.unknown_token_id"),
            pad_id=g("tokenizer.ggml.padding_token_id"),
            add_bos=g("tokenizer.ggml.add_bos_token"),
            add_eos=g("tokenizer.ggml.add_eos_token"),
            add_space_prefix=g("tokenizer.ggml.add_space_prefix"),
        )

    @classmethod
    def from_gguf(cls, gf) -> "Tokenizer":
        """From an opened `llmcore.gguf_file.GGUFFile`."""
        return cls.from_metadata(gf.meta)

    def _detect_special_by_text(self) -> None:
        """EOT/EOM/FIM/EOG detection by token text, as llama.cpp does."""
        t2i = self._text_to_id
        attr = self._attr

        def mark_control(i: int) -> None:
            if not attr[i] & ATTR_CONTROL:
                attr[i] |= ATTR_CONTROL

        def find(texts: set[str]) -> int | None:
            found = None
            for t in texts:  # llama.cpp walks an unordered map: any match; take the lowest id
                i = t2i.get(t)
                if i is not None and (found is None or i < found):
                    found = i
            return found

        found: list[int | None] = []
        if self.eot_id is None:
            self.eot_id = find(_EOT_TEXTS)
            found.append(self.eot_id)
        if self.eom_id is None:
            self.eom_id = find(_EOM_TEXTS)
            found.append(self.eom_id)
        fim = [find(_FIM_PAD_TEXTS), find(_FIM_REP_TEXTS), find(_FIM_SEP_TEXTS)]
        for i in found + fim:
            if i is not None:
                mark_control(i)
        # unused control tokens
        for i, t in enumerate(self._id_to_text):
            if attr[i] & ATTR_CONTROL and "unused" in t:
                attr[i] |= ATTR_UNUSED

        eog = {i for i in fim if i is not None}
        for t in _EOG_TEXTS:
            i = t2i.get(t)
            if i is not None:
                eog.add(i)
                mark_control(i)
        for t in _ALWAYS_RENDER:
            i = t2i.get(t)
            if i is not None:
                attr[i] = ATTR_USER_DEFINED
        for i in (self.eos_id, self.eot_id, self.eom_id):
            if i is not None:
                eog.add(i)
        texts = {self._id_to_text[i]: i for i in eog}
        # harmony / solar-open: <|end|> is not end-of-generation when <|return|> and <|call|> exist
        if "<|end|>" in texts and (
            ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
            or ("<|calls|>" in texts and "<|flush|>" in texts)
            or ("<|call|>" in texts and "<|flush|>" in texts)
        ):
            i = texts["<|end|>"]
            eog.discard(i)
            attr[i] = ATTR_USER_DEFINED
        # gemma4 / paddleocr: </s> is not end-of-generation when <|tool_response> exists
        if "<|tool_response>" in texts and "</s>" in texts:
            i = texts["</s>"]
            eog.discard(i)
            attr[i] = ATTR_NORMAL
        self.eog_ids: frozenset[int] = frozenset(eog)

    def _build_special_cache(self) -> None:
        """Texts split out before tokenizing: all (control/unknown/user-defined) and the
        user-defined only (parse_special=False)."""
        self._special_sets = {}
        for parse in (True, False):
            mask = (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) if parse else ATTR_USER_DEFINED
            toks: dict[str, int] = {}
            for i, a in enumerate(self._attr):
                if a & mask and (parse or not a & (ATTR_CONTROL | ATTR_UNKNOWN)):
                    toks[self._id_to_text[i]] = i
            prefixes: set[str] = set()
            for t in toks:
                for k in range(1, len(t) + 1):
                    prefixes.add(t[:k])
            first = "".join(sorted({t[0] for t in toks}))
            first_re = regex.compile("[" + regex.escape(first, special_only=False) + "]") if first else None
            self._special_sets[parse] = (toks, prefixes, first_re)

    # --- properties --------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._id_to_text)

    @property
    def n_vocab(self) -> int:
        return len(self._id_to_text)

    def token_text(self, tid: int) -> str:
        """The raw vocabulary string of a token (byte-level / ▁-escaped form)."""
        return self._id_to_text[tid]

    def token_id(self, text: str) -> int | None:
        """Id of the token whose vocabulary string is exactly `text`, or None."""
        return self._text_to_id.get(text)

    def token_attr(self, tid: int) -> int:
        return self._attr[tid]

    def is_special(self, tid: int) -> bool:
        """Control or unknown token: rendered only when special=True (like llama.cpp)."""
        return bool(self._attr[tid] & (ATTR_CONTROL | ATTR_UNKNOWN))

    def is_control(self, tid: int) -> bool:
        return bool(self._attr[tid] & ATTR_CONTROL)

    def is_user_defined(self, tid: int) -> bool:
        return bool(self._attr[tid] & ATTR_USER_DEFINED)

    def is_eog(self, tid: int) -> bool:
        return tid in self.eog_ids

    # --- encode ------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`. add_special adds BOS/EOS as the vocab says (add_bos/add_eos);
        parse_special turns control-token texts (e.g. "<|im_start|>") into their ids."""
        frags: list[str | int] = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)  # type: ignore[arg-type]
        if self.type == "spm":
            prev_special = True
            for f in frags:
                if isinstance(f, str):
                    if self.add_space_prefix and prev_special:
                        f = " " + f
                    self._spm(f.replace(" ", _SPM_SPACE), out)
                    prev_special = False
                else:
                    out.append(f)
                    prev_special = True
        else:
            for f in frags:
                if isinstance(f, str):
                    self._bpe(f, out)
                else:
                    out.append(f)
        if add_special and self.add_eos:
            out.append(self.eos_id)  # type: ignore[arg-type]
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split special-token texts out of `text` (llama.cpp tokenizer_st_partition:
        longest token first, each splitting every remaining text fragment)."""
        toks, prefixes, first_re = self._special_sets[parse_special]
        if first_re is None:
            return [text]
        present: set[str] = set()
        n = len(text)
        for m in first_re.finditer(text):
            p = m.start()
            e = p + 1
            while e <= n:
                s = text[p:e]
                if s not in prefixes:
                    break
                if s in toks:
                    present.add(s)
                e += 1
        if not present:
            return [text]
        frags: list[str | int] = [text]
        for s in sorted(present, key=lambda t: (-len(t), toks[t])):
            tid = toks[s]
            new: list[str | int] = []
            for f in frags:
                if isinstance(f, str) and s in f:
                    parts = f.split(s)
                    for k, part in enumerate(parts):
                        if k:
                            new.append(tid)
                        if part:
                            new.append(part)
                else:
                    new.append(f)
            frags = new
        return frags

    def _bpe(self, text: str, out: list[int]) -> None:
        t2i = self._text_to_id
        cache = self._bpe_cache
        for word in regex_split(text, self._pre_patterns):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(byte_encode(word) if self.byte_encode else word)
                if len(cache) > 50000:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> list[int]:
        t2i = self._text_to_id
        if self.ignore_merges:
            tid = t2i.get(word)
            if tid is not None:
                return [tid]
        ranks = self._ranks
        syms = list(word)
        n = len(syms)
        if n > 1:
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            prv = list(range(-1, n - 1))
            heap: list[tuple[int, int, int, str]] = []
            for i in range(n - 1):
                r = ranks.get(syms[i] + " " + syms[i + 1])
                if r is not None:
                    heap.append((r, i, i + 1, syms[i] + syms[i + 1]))
            heapq.heapify(heap)
            while heap:
                _, left, right, merged = heapq.heappop(heap)
                ls, rs = syms[left], syms[right]
                if not ls or not rs or ls + rs != merged:
                    continue
                syms[left] = merged
                syms[right] = ""
                nr = nxt[right]
                nxt[left] = nr
                if nr >= 0:
                    prv[nr] = left
                pl = prv[left]
                if pl >= 0:
                    r = ranks.get(syms[pl] + " " + merged)
                    if r is not None:
                        heapq.heappush(heap, (r, pl, left, syms[pl] + merged))
                if nr >= 0:
                    r = ranks.get(merged + " " + syms[nr])
                    if r is not None:
                        heapq.heappush(heap, (r, left, nr, merged + syms[nr]))
        ids: list[int] = []
        for s in syms:
            if not s:
                continue
            tid = t2i.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            # no token for this symbol: one token per byte when the vocab has it
            for b in s.encode("utf-8"):
                if self.byte_encode:
                    bt = t2i.get(chr(b)) if b < 128 else None
                else:
                    bt = t2i.get(f"<0x{b:02X}>")
                if bt is not None:
                    ids.append(bt)
        return ids

    def _spm(self, text: str, out: list[int]) -> None:
        """SPM over `text` (spaces already escaped). When no vocabulary string joins a
        non-space character to a following U+2581, no merge can cross the start of a
        "▁word" segment, so segments are tokenized independently (and cached): the result
        is the same as one pass over the whole text."""
        bad = self._spm_cross_tokens()
        if bad is None or any(b in text for b in bad):
            self._spm_run(text, out)
            return
        cache = self._bpe_cache
        for seg in _SPM_SEGMENT.findall(text):
            ids = cache.get(seg)
            if ids is None:
                ids = []
                self._spm_run(seg, ids)
                if len(cache) > 50000:
                    cache.clear()
                cache[seg] = ids
            out.extend(ids)

    def _spm_cross_tokens(self) -> list[str] | None:
        """Vocabulary strings with a U+2581 after another character (None: too many)."""
        if self._spm_cross is False:
            joined = "\x00".join(self._id_to_text)
            found = set()
            for m in _SPM_CROSS.finditer(joined):  # the whole vocab string around each hit
                found.add(joined[joined.rfind("\x00", 0, m.start()) + 1 : (joined.find("\x00", m.end()) % (len(joined) + 1))])
            bad = sorted(found)
            self._spm_cross = bad if len(bad) <= 64 else None
        return self._spm_cross  # type: ignore[return-value]

    def _spm_run(self, text: str, out: list[int]) -> None:
        """llama.cpp llm_tokenizer_spm_session: merge the best-scoring adjacent pair
        (ties: leftmost) until no pair forms a token; unknown symbols fall back to bytes."""
        t2i = self._text_to_id
        scores = self._scores
        syms = list(text)
        n = len(syms)
        if n == 0:
            return
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            s = syms[i] + syms[i + 1]
            tid = t2i.get(s)
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, len(s)))
        heapq.heapify(heap)
        push = heapq.heappush
        pop = heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            ls, rs = syms[left], syms[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue
            merged = ls + rs
            syms[left] = merged
            syms[right] = ""
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prv[nr] = left
            pl = prv[left]
            if pl >= 0:
                s = syms[pl] + merged
                tid = t2i.get(s)
                if tid is not None:
                    push(heap, (-scores[tid], pl, left, len(s)))
            if nr >= 0:
                s = merged + syms[nr]
                tid = t2i.get(s)
                if tid is not None:
                    push(heap, (-scores[tid], left, nr, len(s)))
        i = 0
        while i != -1:
            s = syms[i]
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
            else:
                for b in s.encode("utf-8"):
                    bt = t2i.get(f"<0x{b:02X}>")
                    if bt is None and b < 128:
                        bt = t2i.get(chr(b))
                    if bt is None:
                        bt = self.unk_id
                    if bt is not None:
                        out.append(bt)
            i = nxt[i]

    # --- decode ------------------------------------------------------------------------
    def token_to_piece(self, tid: int, special: bool = True) -> bytes:
        """The bytes a token stands for. Control/unknown tokens give b"" unless special."""
        if not 0 <= tid < len(self._id_to_text):
            return b""
        a = self._attr[tid]
        if not special and a & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        p = self._pieces[tid]
        if p is None:
            p = self._make_piece(tid)
            self._pieces[tid] = p
        return p

    def _make_piece(self, tid: int) -> bytes:
        a = self._attr[tid]
        text = self._id_to_text[tid]
        if a & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if a & ATTR_NORMAL:
            if self.type == "spm" or self.escape_whitespaces:
                return text.replace(_SPM_SPACE, " ").encode("utf-8")
            if not self.byte_encode:
                return text.encode("utf-8")
            u2b = UNICODE_TO_BYTE
            out = bytearray()
            for ch in text:
                b = u2b.get(ch)
                if b is None:
                    out += ch.encode("utf-8")
                else:
                    out.append(b)
            return bytes(out)
        if a & ATTR_BYTE:
            if text.startswith("<0x") and len(text) == 6:
                return bytes([int(text[3:5], 16)])
            return text.encode("utf-8")
        return b""

    def piece(self, tid: int, special: bool = True) -> str:
        """token_to_piece decoded as UTF-8 (invalid bytes become U+FFFD)."""
        return self.token_to_piece(tid, special).decode("utf-8", errors="replace")

    def detokenize(
        self,
        ids: Sequence[int],
        remove_special: bool = False,
        unparse_special: bool = True,
        clean_spaces: bool | None = None,
    ) -> bytes:
        """llama.cpp llama_detokenize, as bytes. clean_spaces defaults to the vocab's."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            p = self.token_to_piece(tid, unparse_special)
            if remove_space and p.startswith(b" "):
                p = p[1:]
            remove_space = False
            parts.append(p)
        text = b"".join(parts)
        if (self.clean_spaces if clean_spaces is None else clean_spaces) and text:
            text = _clean_spaces(text)
        return text

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of `ids`. skip_special drops control tokens (and a leading BOS / trailing EOS
        the vocab adds itself)."""
        return self.detokenize(ids, remove_special=skip_special, unparse_special=not skip_special).decode(
            "utf-8", errors="replace"
        )

    def stream_decoder(self, special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, special=special)


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_spaces passes (BPE vocabs whose pre-tokenizer keeps them on)."""
    t = bytearray(text)
    # " ?", " !", " .", " ,"
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    t = out
    # " ' " -> "'"
    out = bytearray(t[:1])
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            out.append(x)
            i += 2
            continue
        out.append(x)
        i += 1
    t = out
    # " 's", " 'm", " 're", " 've"
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm":
                out.pop()
            elif i + 2 < len(t) and ((x1 == ord("r") and t[i + 2] == ord("e")) or (x1 == ord("v") and t[i + 2] == ord("e"))):
                out.pop()
        out.append(x)
    return bytes(out)


class StreamDecoder:
    """Incremental detokenizer: `feed(id)` returns only complete UTF-8 text, so a character
    split across byte tokens is never cut in two; `flush()` returns what is left (an
    incomplete sequence becomes U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self.tokenizer = tokenizer
        self.special = special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tid: int) -> str:
        return self._dec.decode(self.tokenizer.token_to_piece(tid, self.special))

    def flush(self) -> str:
        s = self._dec.decode(b"", final=True)
        self._dec.reset()
        return s
