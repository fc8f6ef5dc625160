"""Tokenizer tests: llama.cpp's token ids and pieces (the conformance set's oracle) on the
SmolLM2 vocab (tiny conformance model and the real model) and gemma-3 (SPM, slow); the tiny
byte-level BPE vocabulary of fixtures.py (special tokens, round trip, streaming); hand-built
vocabularies checked against small independent reference implementations."""
from __future__ import annotations

import json
import random
import time

import pytest

from fixtures import tiny_vocab
from llmcore.tokenizer import (
    BYTE_TO_UNICODE,
    PRE_TOKENIZERS,
    BPETokenizer,
    SPMTokenizer,
    StreamDecoder,
    Tokenizer,
    byte_encode,
    regex_split,
)

# ---------------------------------------------------------------------------------------
# conformance with llama.cpp


def _oracle(conformance, name):
    return json.loads((conformance / "oracle" / f"{name}.json").read_text())


def _tokenizer(path) -> Tokenizer:
    from llmcore.gguf_file import GGUFFile

    return Tokenizer.from_gguf(GGUFFile(path))


def _check_oracle(tok: Tokenizer, oracle: dict) -> None:
    assert len(oracle["prompts"]) == 4
    for p in oracle["prompts"]:
        ids = tok.encode(p["text"], add_special=True, parse_special=True)
        assert ids == p["prompt_tokens"], p["name"]
        assert [tok.piece(i) for i in ids] == p["prompt_pieces"], p["name"]
        # llama.cpp's end-of-generation flags on the greedy continuation
        assert [tok.is_eog(g) for g in p["generated"]] == p["generated_is_eog"], p["name"]
        assert tok.decode(p["generated"]) == p["generated_text"], p["name"]


def test_tiny_models_match_oracle(conformance):
    """SmolLM2's tokenizer, from the tiny conformance model that copies it (fast to load)."""
    _check_oracle(_tokenizer(conformance / "models" / "tiny-qwen3-f32.gguf"), _oracle(conformance, "tiny-qwen3-f32"))


def test_smollm2_matches_oracle(conformance, smollm2_path):
    from llmcore.gguf_file import GGUFFile

    tok = Tokenizer.from_gguf(GGUFFile(smollm2_path))
    assert tok.type == "bpe" and tok.pre == "smollm" and tok.vocab_size == 49152
    assert not tok.add_bos and tok.bos_id == 1 and tok.eos_id == 2
    _check_oracle(tok, _oracle(conformance, "SmolLM2-135M-Instruct.Q4_1"))


@pytest.mark.slow
@pytest.mark.realmodel
def test_gemma3_matches_oracle(conformance, gemma3_path):
    from llmcore.gguf_file import GGUFFile

    tok = Tokenizer.from_gguf(GGUFFile(gemma3_path))
    assert tok.type == "spm" and not tok.add_space_prefix and tok.add_bos and tok.bos_id == 2
    assert {1, 106} <= tok.eog_ids  # <eos>, <end_of_turn>
    _check_oracle(tok, _oracle(conformance, "gemma-3-270m-q4_k_m"))
    # user-defined tokens ("\n", runs of spaces) are split out even without parse_special
    ids = tok.encode("a\n  b", add_special=False)
    assert tok.token_id("\n") in ids and tok.token_id("  ") in ids
    # SPM round trip, incl. byte fallback
    text = "Héllo wörld 🦙 日本語\n\tx  y"
    assert tok.decode(tok.encode(text), skip_special=True) == text


# ---------------------------------------------------------------------------------------
# the tiny chat model's byte-level BPE vocabulary (fixtures.tiny_vocab)


@pytest.fixture(scope="module")
def bpe_tok(built_model) -> Tokenizer:
    return _tokenizer(built_model("chat"))


def test_gguf_vocab_is_read_whole(bpe_tok):
    vocab = tiny_vocab()
    assert bpe_tok.type == "bpe" and bpe_tok.pre == "smollm" and bpe_tok.vocab_size == len(vocab.tokens)
    assert not bpe_tok.add_bos and (bpe_tok.bos_id, bpe_tok.eos_id) == (vocab.bos_id, vocab.eos_id)
    assert [bpe_tok.token_id(t) for t in vocab.tokens] == list(range(len(vocab.tokens)))


def test_gguf_vocab_matches_reference_bpe(bpe_tok):
    ranks = {tuple(m.split(" ")): i for i, m in enumerate(tiny_vocab().merges)}
    text = "The model reads a prompt: tell me a story about the cat number 12, then answer briefly!"
    expected = []
    for word in PRE_TOKENIZERS["smollm"].split(text):
        expected += [bpe_tok.token_id(s) for s in _ref_bpe(byte_encode(word), ranks)]
    ids = bpe_tok.encode(text, add_special=False)
    assert ids == expected and len(ids) < len(text) // 2  # merged tokens of merged tokens


def test_bpe_special_tokens(bpe_tok):
    tok = bpe_tok
    im_start, im_end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    with_special = tok.encode("<|im_start|>user<|im_end|>", parse_special=True)
    assert with_special[0] == im_start and with_special[-1] == im_end
    plain = tok.encode("<|im_start|>user<|im_end|>", parse_special=False)
    assert im_start not in plain and im_end not in plain
    assert tok.decode(plain) == "<|im_start|>user<|im_end|>"
    assert tok.is_special(im_end) and not tok.is_special(plain[0])
    assert tok.token_to_piece(im_end, special=False) == b""
    assert tok.decode(with_special, skip_special=True) == "user"
    assert {tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")} <= tok.eog_ids


def test_bpe_roundtrip_and_speed(bpe_tok):
    rng = random.Random(0)
    words = ["the", "printing", " press", "Gutenberg", "1440", "日本語", "🦙", "\n", "  ", "\t", "é", "'s", "—", "x**2"]
    text = "".join(rng.choice(words) + rng.choice([" ", "", "\n", ", "]) for _ in range(600))
    ids = bpe_tok.encode(text, add_special=False)
    assert bpe_tok.decode(ids) == text
    assert 900 < len(ids) < len(text.encode())  # merges were applied
    bpe_tok._word_cache.clear()
    t0 = time.perf_counter()
    bpe_tok.encode(text)
    dt = time.perf_counter() - t0
    assert dt < 0.2, f"tokenizing {len(ids)} tokens took {dt * 1000:.0f} ms"


def test_stream_decoder_never_splits_utf8(bpe_tok):
    text = "a🦙b日本é!"
    ids = bpe_tok.encode(text, add_special=False)
    sd = StreamDecoder(bpe_tok)
    chunks = [sd.feed(i) for i in ids] + [sd.flush()]
    assert "".join(chunks) == text
    for c in chunks:
        assert "\ufffd" not in c
    # an incomplete character at the end comes out as U+FFFD on flush
    partial = [i for i in ids if bpe_tok.token_to_piece(i) != b""]
    llama_bytes = "🦙".encode()
    byte_ids = [bpe_tok.token_id(BYTE_TO_UNICODE[b]) for b in llama_bytes[:2]]
    sd2 = StreamDecoder(bpe_tok)
    assert sd2.feed(byte_ids[0]) == "" and sd2.feed(byte_ids[1]) == ""
    assert sd2.flush() == "\ufffd"
    assert partial


# ---------------------------------------------------------------------------------------
# pre-tokenizer regexes


@pytest.mark.parametrize(
    "pre,text,expected",
    [
        # GPT-2: contractions, optional leading space, whitespace run keeps its last space
        ("gpt-2", "Hello world's  test", ["Hello", " world", "'s", " ", " test"]),
        ("gpt-2", "a\n\nb", ["a", "\n", "\n", "b"]),
        # smollm: digits split one by one first
        ("smollm", "in 1440, ok", ["in", " ", "1", "4", "4", "0", ",", " ok"]),
        # llama3: numbers in groups of 3, case-insensitive contractions, newlines grouped
        ("llama3", "I'M 12345 ok!\n\nx", ["I", "'M", " ", "123", "45", " ok", "!\n\n", "x"]),
        # qwen2: single digits
        ("qwen2", "ab 123", ["ab", " ", "1", "2", "3"]),
    ],
)
def test_pre_tokenizer_splits(pre, text, expected):
    assert PRE_TOKENIZERS[pre].split(text) == expected


# ---------------------------------------------------------------------------------------
# hand-built BPE vocabulary vs. a reference BPE


def _ref_bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Textbook BPE: repeatedly merge the lowest-ranked adjacent pair (leftmost first)."""
    syms = list(word)
    while len(syms) > 1:
        best = min(
            ((ranks[(a, b)], i) for i, (a, b) in enumerate(zip(syms, syms[1:])) if (a, b) in ranks),
            default=None,
        )
        if best is None:
            break
        i = best[1]
        syms[i : i + 2] = [syms[i] + syms[i + 1]]
    return syms


def _tiny_bpe(pre="gpt-2", **kw) -> tuple[Tokenizer, dict]:
    rng = random.Random(1)
    tokens = list(BYTE_TO_UNICODE)  # every byte is a token
    merges: list[str] = []
    ranks: dict[tuple[str, str], int] = {}
    alphabet = [byte_encode(c) for c in "abcde ."]
    pool = list(alphabet)
    while len(merges) < 60:
        a, b = rng.choice(pool), rng.choice(pool)
        if (a, b) in ranks or a + b in tokens or len(a + b) > 5:
            continue
        ranks[(a, b)] = len(merges)
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        pool.append(a + b)
    tokens += ["<|begin|>", "<|end|>", "<tool>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 4]
    tok = BPETokenizer(tokens, token_types=types, merges=merges, pre=pre, bos_id=len(tokens) - 3,
                       eos_id=len(tokens) - 2, **kw)
    return tok, ranks


def test_bpe_matches_reference_bpe():
    tok, ranks = _tiny_bpe()
    rng = random.Random(2)
    for _ in range(200):
        text = "".join(rng.choice("abcde .") for _ in range(rng.randint(1, 30)))
        expected = []
        for word in regex_split(text, PRE_TOKENIZERS["gpt-2"].patterns):
            expected += [tok.token_id(s) for s in _ref_bpe(byte_encode(word), ranks)]
        assert tok.encode(text, add_special=False) == expected, text
        raw = tok.detokenize(expected, clean_spaces=False)
        assert raw == text.encode(), text
    # gpt-2 keeps llama.cpp's clean_spaces on: " ." -> "." when decoding
    assert tok.clean_spaces and tok.decode(tok.encode("ab . cd")) == "ab. cd"


def test_bpe_special_and_bos():
    tok, _ = _tiny_bpe()
    start, end, tool = tok.token_id("<|begin|>"), tok.token_id("<|end|>"), tok.token_id("<tool>")
    assert not tok.add_bos  # gpt2 vocab: no BOS unless the metadata asks
    ids = tok.encode("<|begin|>ab<tool>cd<|end|>", parse_special=True)
    assert ids[0] == start and ids[-1] == end and tool in ids
    ids = tok.encode("<|begin|>ab<tool>cd", parse_special=False)
    assert start not in ids and tool in ids  # user-defined tokens are always split out
    assert tok.decode(ids) == "<|begin|>ab<tool>cd"
    assert tok.decode(tok.encode("<|begin|>ab<|end|>", parse_special=True), skip_special=True) == "ab"
    assert tok.eog_ids == {end, tok.eos_id}  # "<|end|>" by text, plus eos
    tok_b, _ = _tiny_bpe(add_bos=True)
    assert tok_b.encode("ab")[0] == tok_b.bos_id
    tok_l3, _ = _tiny_bpe(pre="llama3")
    assert tok_l3.add_bos  # llama.cpp's default for the llama3 pre-tokenizer


def test_longest_special_match_first():
    tokens = list(BYTE_TO_UNICODE) + ["<a>", "<a><b>", "<b>"]
    tok = BPETokenizer(tokens, token_types=[1] * 256 + [3, 3, 3], merges=[], pre="gpt-2")
    ids = tok.encode("x<a><b>y<b><a>", add_special=False, parse_special=True)
    a, ab, b = 256, 257, 258
    assert [i for i in ids if i >= 256] == [ab, b, a]


def test_unknown_pre_falls_back_to_default(caplog):
    tokens = list(BYTE_TO_UNICODE)
    with caplog.at_level("WARNING", logger="llmcore"):
        tok = BPETokenizer(tokens, merges=[], pre="no-such-pre")
    assert tok.pre == "default" and "no-such-pre" in caplog.text
    assert tok.decode(tok.encode("Hi 1234, you!")) == "Hi 1234, you!"


# ---------------------------------------------------------------------------------------
# hand-built SPM vocabulary vs. a reference SPM


def _ref_spm(text: str, vocab: dict[str, float]) -> list[str]:
    """Greedy SentencePiece BPE: merge the highest-scoring adjacent pair (leftmost on ties)."""
    syms = list(text)
    while True:
        best = None
        for i in range(len(syms) - 1):
            s = syms[i] + syms[i + 1]
            if s in vocab and (best is None or vocab[s] > best[0]):
                best = (vocab[s], i)
        if best is None:
            return syms
        i = best[1]
        syms[i : i + 2] = [syms[i] + syms[i + 1]]


def _tiny_spm(cross=True, **kw):
    """A random SPM vocab; cross=False keeps "▁" only at the start of vocab strings, which
    lets the tokenizer work word by word."""
    rng = random.Random(3)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    chars = ["▁", "a", "b", "c", "d"]
    vocab: dict[str, float] = {}
    for c in chars:
        vocab[c] = -100.0
    while len(vocab) < 40:
        s = "".join(rng.choice(chars) for _ in range(rng.randint(2, 4)))
        if not cross and "▁" in s.lstrip("▁"):
            continue
        if s not in vocab:
            vocab[s] = -float(rng.randint(1, 20))  # ties on purpose
    for s, sc in vocab.items():
        tokens.append(s)
        types.append(1)
        scores.append(sc)
    tokens.append("<turn>")
    types.append(3)
    scores.append(0.0)
    tok = SPMTokenizer(tokens, token_types=types, scores=scores, bos_id=1, eos_id=2, unk_id=0, **kw)
    return tok, vocab


def _spm_ids(tok: Tokenizer, syms: list[str]) -> list[int]:
    out = []
    for s in syms:
        tid = tok.token_id(s)
        if tid is None:
            out += [tok.token_id(f"<0x{b:02X}>") for b in s.encode()]
        else:
            out.append(tid)
    return out


@pytest.mark.parametrize("cross", [True, False])
def test_spm_matches_reference(cross):
    tok, vocab = _tiny_spm(cross=cross)
    assert bool(tok._cross_word_tokens) == cross  # word-by-word only when no vocab string crosses "▁"
    assert tok.add_bos and tok.add_space_prefix  # llama.cpp SPM defaults
    rng = random.Random(4)
    for _ in range(300):
        text = "".join(rng.choice("abcd é") for _ in range(rng.randint(1, 25)))
        expected = [tok.bos_id] + _spm_ids(tok, _ref_spm(("▁" + text).replace(" ", "▁"), vocab))
        ids = tok.encode(text)
        assert ids == expected, text
        assert tok.decode(ids[1:]) == text  # the space prefix is removed again
        # llama.cpp keeps it when a leading BOS is removed with the special tokens
        assert tok.decode(ids, skip_special=True) == " " + text


def test_spm_no_space_prefix_and_specials():
    tok, vocab = _tiny_spm(add_space_prefix=False)
    turn = tok.token_id("<turn>")
    ids = tok.encode("ab<turn>cd", parse_special=True)
    assert ids[0] == tok.bos_id and turn in ids
    k = ids.index(turn)
    assert ids[1:k] == _spm_ids(tok, _ref_spm("ab", vocab))
    assert ids[k + 1 :] == _spm_ids(tok, _ref_spm("cd", vocab))
    assert tok.decode(ids, skip_special=True) == "abcd"
    assert tok.decode(ids) == "<s>ab<turn>cd"
    # byte fallback for a character the vocab lacks
    ids = tok.encode("é", add_special=False)
    assert ids == [tok.token_id("<0xC3>"), tok.token_id("<0xA9>")]
    sd = StreamDecoder(tok)
    assert sd.feed(ids[0]) == "" and sd.feed(ids[1]) == "é" and sd.flush() == ""
    # with a space prefix, one is added after each special token (llama.cpp behaviour)
    tok2, vocab2 = _tiny_spm()
    ids = tok2.encode("a<turn>b", add_special=False, parse_special=True)
    k = ids.index(turn)
    assert ids[:k] == _spm_ids(tok2, _ref_spm("▁a", vocab2))
    assert ids[k + 1 :] == _spm_ids(tok2, _ref_spm("▁b", vocab2))
