"""Special tokens, as llama.cpp's ``llama-vocab.cpp`` finds and uses them.

- ``find_special_tokens``: the BOS/EOS/EOT/EOM/UNK/PAD ids (metadata, checked against
  the vocabulary, else the kind's defaults), then llama.cpp's by-text workarounds: EOT,
  EOM and FIM tokens found by their text and marked control, the end-of-generation set,
  the few tokens always rendered as text, and the harmony / gemma4 exceptions.
- ``SpecialSplitter``: cuts special-token texts out of a text before the tokenizer runs
  (longest first). User-defined tokens are always cut out; control and unknown ones only
  with ``parse_special=True``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import regex

from .vocab import ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_UNUSED, ATTR_USER_DEFINED, Vocab

log = logging.getLogger("llmcore")

# llama.cpp's workaround lists: token texts that mean end of turn, end of message, FIM
# markers, end of generation, and markup that is always shown as text
EOT_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
}
EOM_TEXTS = {"<|eom_id|>"}
FIM_PAD_TEXTS = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}
FIM_REP_TEXTS = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}
FIM_SEP_TEXTS = {"<|file_sep|>"}
EOG_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
}
ALWAYS_RENDER = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}


@dataclass(frozen=True)
class DefaultIds:
    """Special ids a vocabulary kind assumes when the metadata gives none."""

    bos: int | None
    eos: int | None
    unk: int | None


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int | None
    eot: int | None
    eom: int | None
    unk: int | None
    pad: int | None
    eog: frozenset[int]


def find_special_tokens(
    vocab: Vocab,
    defaults: DefaultIds,
    bos: int | None = None,
    eos: int | None = None,
    eot: int | None = None,
    eom: int | None = None,
    unk: int | None = None,
    pad: int | None = None,
) -> SpecialTokens:
    """The special ids (metadata first, see the module docstring). Refines `vocab.attrs`
    in place: tokens found by text become control, unused controls are flagged unused."""
    n = len(vocab)

    def valid(tid: int | None, default: int | None) -> int | None:
        if vocab.valid_id(tid):
            return int(tid)  # type: ignore[arg-type]
        if tid is not None:
            log.warning("tokenizer: special token id %s out of range, using default %s", tid, default)
        return default if default is not None and 0 <= default < n else None

    bos, eos, unk = valid(bos, defaults.bos), valid(eos, defaults.eos), valid(unk, defaults.unk)
    pad, eot, eom = valid(pad, None), valid(eot, None), valid(eom, None)

    t2i, attr = vocab.ids, vocab.attrs

    def mark_control(i: int) -> None:
        attr[i] |= ATTR_CONTROL

    def find(texts: set[str]) -> int | None:
        found = None
        for t in texts:  # llama.cpp walks an unordered map: any match; take the lowest id
            i = t2i.get(t)
            if i is not None and (found is None or i < found):
                found = i
        return found

    found: list[int | None] = []
    if eot is None:
        eot = find(EOT_TEXTS)
        found.append(eot)
    if eom is None:
        eom = find(EOM_TEXTS)
        found.append(eom)
    fim = [find(FIM_PAD_TEXTS), find(FIM_REP_TEXTS), find(FIM_SEP_TEXTS)]
    for i in found + fim:
        if i is not None:
            mark_control(i)
    for i, t in enumerate(vocab.texts):
        if attr[i] & ATTR_CONTROL and "unused" in t:
            attr[i] |= ATTR_UNUSED

    eog = {i for i in fim if i is not None}
    for t in EOG_TEXTS:
        i = t2i.get(t)
        if i is not None:
            eog.add(i)
            mark_control(i)
    for t in ALWAYS_RENDER:
        i = t2i.get(t)
        if i is not None:
            attr[i] = ATTR_USER_DEFINED
    for i in (eos, eot, eom):
        if i is not None:
            eog.add(i)
    texts = {vocab.texts[i]: i for i in eog}
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
    return SpecialTokens(bos=bos, eos=eos, eot=eot, eom=eom, unk=unk, pad=pad, eog=frozenset(eog))


class _SpecialSet:
    """The texts one splitting mode cuts out, their prefixes, and a regex for their first
    characters (where a special text can start)."""

    __slots__ = ("ids", "prefixes", "first")

    def __init__(self, ids: dict[str, int]):
        self.ids = ids
        self.prefixes: set[str] = {t[:k] for t in ids for k in range(1, len(t) + 1)}
        first = "".join(sorted({t[0] for t in ids}))
        self.first = regex.compile("[" + regex.escape(first, special_only=False) + "]") if first else None


class SpecialSplitter:
    """llama.cpp's tokenizer_st_partition over a vocabulary's special tokens."""

    def __init__(self, vocab: Vocab):
        every = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
        hidden = ATTR_CONTROL | ATTR_UNKNOWN
        self._sets = {
            True: _SpecialSet({vocab.texts[i]: i for i, a in enumerate(vocab.attrs) if a & every}),
            False: _SpecialSet(
                {vocab.texts[i]: i for i, a in enumerate(vocab.attrs) if a & ATTR_USER_DEFINED and not a & hidden}
            ),
        }

    def split(self, text: str, parse_special: bool) -> list[str | int]:
        """`text` as text fragments and special-token ids, in order: the longest special
        text first, each splitting every fragment left by the longer ones."""
        sset = self._sets[parse_special]
        if sset.first is None:
            return [text]
        toks, prefixes = sset.ids, sset.prefixes
        present: set[str] = set()
        n = len(text)
        for m in sset.first.finditer(text):
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
