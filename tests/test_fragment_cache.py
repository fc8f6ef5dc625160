"""The tokenizer's fragment cache: a text tokenized again (a chat history with one more
turn) gives exactly the ids it gives without the cache, for both tokenizer kinds, with
special tokens in and around it; the cache stays within its size."""
from __future__ import annotations

import random

import pytest

from llmcore.tokenizer.fragment_cache import FragmentCache
from test_tokenizer import _tiny_spm


@pytest.fixture(scope="module")
def bpe_tok(built_model):
    from llmcore.gguf_file import GGUFFile
    from llmcore.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(built_model("chat")))  # SmolLM2-like byte-level BPE


def _texts(rng: random.Random, specials: list[str], alphabet: str, n: int) -> list[str]:
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200))))
            if rng.random() < 0.7:
                parts.append(rng.choice(specials))
        out.append("".join(parts))
    return out


def _uncached(tok, text, **kw):
    saved = tok.fragments
    tok.fragments = FragmentCache(min_chars=1 << 30)  # keeps nothing
    try:
        return tok.encode(text, **kw)
    finally:
        tok.fragments = saved


def test_bpe_history_retokenized_from_cache_is_exact(bpe_tok):
    rng = random.Random(1)
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    history = ""
    for i, t in enumerate(_texts(rng, specials, "abc xyz\n.,'é€1234  ", 40)):
        history += t  # every turn: the whole history again, plus the new text
        for kw in (dict(add_special=True, parse_special=True), dict(add_special=False, parse_special=False)):
            assert bpe_tok.encode(history, **kw) == _uncached(bpe_tok, history, **kw)
    assert bpe_tok.fragments.hits > 0


@pytest.mark.parametrize("cross", [True, False])
def test_spm_after_special_is_part_of_the_key(cross):
    # SPM puts a space before a fragment that follows a special token: the same text gives
    # other ids there
    tok, _ = _tiny_spm(cross=cross)
    frag = "ab cd " * 20
    a = tok.encode(frag + "<turn>" + frag, parse_special=True)
    assert a == _uncached(tok, frag + "<turn>" + frag, parse_special=True)
    rng = random.Random(2)
    for t in _texts(rng, ["<turn>", "</s>"], "abcd é", 60):
        assert tok.encode(t, parse_special=True) == _uncached(tok, t, parse_special=True)
        assert tok.encode(t) == _uncached(tok, t)


def test_cache_bounds_and_short_fragments():
    c = FragmentCache(max_chars=1000, min_chars=10)
    assert not c.wants("short") and c.wants("x" * 10) and not c.wants("x" * 1001)
    for i in range(50):
        c.put(f"{i:03d}" + "y" * 97, False, [i] * 5)
    assert c._chars <= 1000 and len(c) == 10  # the least recently used went first
    assert c.get("049" + "y" * 97, False).tolist() == [49] * 5
    assert c.get("000" + "y" * 97, False) is None
    assert c.get("049" + "y" * 97, True) is None  # after a special token: another entry
