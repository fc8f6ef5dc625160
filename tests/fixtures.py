"""Tiny random GGUF models for tests, written with gguf.GGUFWriter (nothing downloaded).

One builder per architecture llmcore runs, so that every cache, checkpoint, sliding-window,
recurrent and MoE test runs on a clean clone. Each takes ``(path, seed=0, ...)``, writes a
GGUF of a few MB and returns ``path``; weights are seeded and "numerically sane" (logit std
~2, activations O(1), norm weights 1 + N(0, 0.1) so a missing norm is visible):

    build_tiny(path, arch="llama"|"qwen3", wtype="f32"|"f16"|"q8_0"|"q4_0")   dense attention
    build_gemma3(path, window=8)          interleaved sliding window (5 local layers, 1 global)
    build_gpt_oss(path)                   alternating sliding window, sinks, biases, MoE
    build_qwen3moe(path, wtype="f32"|"q8_0"|"iq4")   MoE, 8 experts / 2 used
    build_mamba(path), build_mamba2(path)      recurrent (selective scan / SSD, 2 groups)
    build_lfm2(path)                      short-conv layers + attention layers (hybrid)
    build_qwen35(path, arch="qwen35moe"|"qwen35"|"qwen3next")   gated DeltaNet + gated attention

With ``tokenizer=True`` a builder embeds :func:`tiny_vocab` (a byte-level BPE vocabulary
with ChatML special tokens and a chat template) and sizes the model's vocabulary to it, so
``Engine.from_path`` and the CLI load the file like a real model. Without it the vocabulary
is ``N_VOCAB`` (256) plain ids and tests pair the model with ``fakes.FakeTokenizer``.

Session fixtures (registered in conftest.py, so every test module sees them):
    tiny_models    name -> path for the dense variants ("llama-f32", "qwen3-q8_0", ...)
    built_model    ``built_model(name) -> path`` for the names in ``CATALOGUE``, each built
                   on first use
"""
from __future__ import annotations

import functools
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT

from llmcore.models import load_model

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 256, 64, 2, 4, 2, 128
HEAD_DIM = {"llama": 16, "qwen3": 32}
QTYPES = {"f32": QT.F32, "f16": QT.F16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
VARIANTS = ["llama-f32", "llama-f16", "llama-q8_0", "llama-q4_0", "qwen3-f32", "qwen3-f16", "qwen3-q8_0",
            "qwen3-q4_0"]


# ---- weights ----------------------------------------------------------------------------------

def weight_makers(rng):
    """(normal, linear, norm_w) drawing from ``rng`` in call order: float32, "numerically
    sane". ``linear(n_in, *n_out)`` is (*n_out, n_in) with std 1/sqrt(n_in);
    ``norm_w(n, scale=1.0)`` is scale * (1 + 0.1 N(0, 1))."""
    def normal(shape, std):
        return (rng.standard_normal(size=shape) * std).astype(np.float32)

    def linear(n_in, *n_out):
        return normal((*n_out, n_in), 1.0 / math.sqrt(n_in))

    def norm_w(n, scale=1.0):
        return (scale * (1.0 + 0.1 * rng.standard_normal(size=(n,)))).astype(np.float32)

    return normal, linear, norm_w


def _quant(data: np.ndarray, qt: QT) -> np.ndarray:
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qt == QT.F32:
        return data
    if qt == QT.F16:
        return data.astype(np.float16)
    if qt in (QT.IQ4_NL, QT.IQ4_XS):
        return quantize_iq4(data, qt)
    return gguf.quants.quantize(data, qt)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _iq4_indices(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The nearest table entry to x / scale (per row of x, scale (rows, 1)), uint8."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(scale != 0, x / scale, 0)
    return np.abs(v[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def _iq4_scale(x: np.ndarray) -> np.ndarray:
    """Per row of blocks x (n, 32): the least-squares scale for the indices picked with
    d = max / -127 (as llama.cpp starts), float32 (n, 1)."""
    mx = x[np.arange(len(x)), np.abs(x).argmax(1)][:, None]
    q = IQ4_VALUES[_iq4_indices(x, mx / -127.0)]
    den = (q * q).sum(1, keepdims=True)
    return np.where(den > 0, (q * x).sum(1, keepdims=True) / np.where(den > 0, den, 1), 0).astype(np.float32)


def _nibbles(idx: np.ndarray) -> np.ndarray:
    """(n, 32) indices -> (n, 16) bytes: value j low nibble of byte j, value 16 + j high."""
    return idx[:, :16] | (idx[:, 16:] << 4)


def quantize_iq4(data: np.ndarray, qt: QT) -> np.ndarray:
    """IQ4_NL / IQ4_XS blocks of float32 ``data`` (rows of whole blocks) as uint8 (rows,
    bytes): a plain nearest-value quantizer with least-squares block scales (gguf.quants
    has none for these types; llama.cpp's searches more scales but writes the same format)."""
    rows = data.shape[:-1]
    x = data.reshape(-1, 32).astype(np.float32)
    if qt == QT.IQ4_NL:
        d = _iq4_scale(x).astype(np.float16)
        idx = _iq4_indices(x, d.astype(np.float32))
        out = np.concatenate([d.view(np.uint8).reshape(-1, 2), _nibbles(idx)], axis=1)
        return out.reshape(*rows, -1)
    sb = x.reshape(-1, 8, 32)  # super-blocks of 8 sub-blocks
    s = _iq4_scale(x).reshape(-1, 8)
    smax = s[np.arange(len(s)), np.abs(s).argmax(1)]
    d = (smax / -32.0).astype(np.float16)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.clip(np.rint(np.where(df != 0, s / df, 0)), -32, 31).astype(np.int64)
    dl = (df * ls).astype(np.float32).reshape(-1, 1)
    idx = _iq4_indices(sb.reshape(-1, 32), dl).reshape(-1, 8, 32)
    u = ls + 32
    scales_h = ((u >> 4) << (2 * np.arange(8))).sum(1).astype(np.uint16)
    scales_l = (u[:, 0::2] & 15) | ((u[:, 1::2] & 15) << 4)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), scales_h.view(np.uint8).reshape(-1, 2),
                          scales_l.astype(np.uint8), _nibbles(idx.reshape(-1, 32)).reshape(-1, 128)], axis=1)
    return out.reshape(*rows, -1)


def iq4_type(n_in: int) -> QT:
    """The i-quant a converter picks for rows of n_in values: IQ4_XS, or IQ4_NL where the rows
    are not whole 256-value super-blocks (llama.cpp's fallback)."""
    return QT.IQ4_XS if n_in % 256 == 0 else QT.IQ4_NL


def add_tensor(w: gguf.GGUFWriter, name: str, data: np.ndarray, qt: QT = QT.F32) -> None:
    """Add ``data`` (float32, NumPy order) to ``w`` stored as ``qt``."""
    w.add_tensor(name, _quant(data, qt), raw_dtype=qt if qt not in (QT.F32, QT.F16) else None)


def finish_gguf(w, path):
    """Write header, KV data and tensors of GGUFWriter ``w``, close it, return ``path``."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


# ---- tokenizer: a byte-level BPE vocabulary with ChatML special tokens -------------------------

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 (as in SmolLM2)
DEFAULT_SYSTEM = "You are a tiny test model."
# ChatML, with a system message of its own when the conversation has none
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOKENIZER_VOCAB = 384  # 3 special tokens, 256 bytes, 125 merged tokens

# what the merges are learnt from: any fixed text will do, this one is English with some
# punctuation, digits and the words chat prompts use
_BPE_CORPUS = """
A language model reads a prompt, one token at a time, and writes the next token. The tokens of
a prompt that was seen before are kept in a cache, so the model does not have to read them again.
When the user edits the last message of a conversation, the server goes back to the newest state
it saved before the edit and reads only what changed. A sliding window keeps the last few hundred
tokens; a recurrent state keeps a summary of everything. Both are saved as checkpoints every few
tokens, and restored when a request branches off. system user assistant: tell me a story about
the cat number 12 and the cat number 7, then answer briefly: what is 17 * 23? (It is 391.)
"""


@dataclass(frozen=True)
class TinyVocab:
    tokens: list[str]
    token_types: list[int]  # 1 normal, 3 control
    merges: list[str]  # "a b", in rank order
    bos_id: int
    eos_id: int
    chat_template: str

    def token_id(self, text: str) -> int:
        return self.tokens.index(text)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte: the alphabet of byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, n = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def _merge(seq: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(seq):
        if i + 1 < len(seq) and (seq[i], seq[i + 1]) == pair:
            out.append(seq[i] + seq[i + 1])
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return tuple(out)


@functools.lru_cache(maxsize=None)
def tiny_vocab() -> TinyVocab:
    """SmolLM2's layout at toy size: the special tokens, every byte, then merges learnt on a
    fixed text by textbook BPE training (most frequent pair first, ties by the pair)."""
    enc = bytes_to_unicode()
    words = re.findall(r" ?[^\W\d_]+| ?\d| ?[^\s\w]+|\s+", _BPE_CORPUS)
    seqs = Counter(tuple(enc[b] for b in w.encode()) for w in words)
    tokens = list(SPECIAL_TOKENS) + [enc[b] for b in range(256)]
    known, merges = set(tokens), []
    while len(tokens) < TOKENIZER_VOCAB:
        pairs = Counter()
        for seq, n in seqs.items():
            for p in zip(seq, seq[1:]):
                pairs[p] += n
        if not pairs:
            raise RuntimeError("BPE corpus too small for the vocabulary size")
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(f"{best[0]} {best[1]}")
        if best[0] + best[1] not in known:
            known.add(best[0] + best[1])
            tokens.append(best[0] + best[1])
        nxt = Counter()
        for seq, n in seqs.items():
            nxt[_merge(seq, best)] += n
        seqs = nxt
    types = [3] * len(SPECIAL_TOKENS) + [1] * (len(tokens) - len(SPECIAL_TOKENS))
    return TinyVocab(tokens, types, merges, bos_id=1, eos_id=2, chat_template=CHAT_TEMPLATE)


FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


@functools.lru_cache(maxsize=None)
def fim_vocab() -> TinyVocab:
    """tiny_vocab() with fill-in-the-middle control tokens after it (ids 384-386), which
    the GGUF names in tokenizer.ggml.fim_{pre,suf,mid}_token_id."""
    v = tiny_vocab()
    return TinyVocab(v.tokens + list(FIM_TOKENS), v.token_types + [3] * len(FIM_TOKENS), v.merges,
                     v.bos_id, v.eos_id, v.chat_template)


def add_tokenizer(w: gguf.GGUFWriter, vocab: TinyVocab) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_add_bos_token(False)
    w.add_chat_template(vocab.chat_template)
    for kind, text in zip(("pre", "suf", "mid"), FIM_TOKENS):
        if text in vocab.tokens:
            w.add_uint32(f"tokenizer.ggml.fim_{kind}_token_id", vocab.tokens.index(text))


def _vocab_size(w: gguf.GGUFWriter, tokenizer: bool | str) -> int:
    """Embed the tiny tokenizer if asked ("fim": the one with fill-in-the-middle tokens);
    the model's vocabulary size either way."""
    if not tokenizer:
        w.add_vocab_size(N_VOCAB)
        return N_VOCAB
    vocab = fim_vocab() if tokenizer == "fim" else tiny_vocab()
    add_tokenizer(w, vocab)
    w.add_vocab_size(len(vocab.tokens))
    return len(vocab.tokens)


# ---- dense: llama, qwen3 ----------------------------------------------------------------------

def build_tiny(path, arch: str = "llama", wtype: str = "f32", seed: int = 0, context_length: int = 512,
               rope_base: float = 10000.0, tokenizer: bool | str = False) -> Path:
    """2 layers, n_embd 64, GQA (4 heads / 2 kv heads). llama: head_dim 16, untied
    ``output.weight``; qwen3: head_dim 32 (q dim 128 != n_embd, so key_length matters), q/k
    norms, tied embedding. Norms stay F32 like llama.cpp."""
    path = Path(path)
    qt = QTYPES[wtype]
    rng = np.random.default_rng(seed + zlib.crc32(arch.encode()))
    hd = HEAD_DIM[arch]

    def normal(shape, std):
        return (rng.standard_normal(size=shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def linear(n_in, n_out):
        return normal((n_out, n_in), 1.0 / np.sqrt(n_in))

    def norm_w(n):
        return (1.0 + 0.1 * rng.standard_normal(size=(n,), dtype=np.float32)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{wtype}")
    w.add_context_length(context_length)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
    n_vocab = _vocab_size(w, tokenizer)
    if arch == "llama":
        w.add_rope_dimension_count(hd)
    else:
        w.add_key_length(hd)
        w.add_value_length(hd)

    tensors: list[tuple[str, np.ndarray, QT]] = []

    def add(name, data, t=QT.F32):
        tensors.append((name, data, t))

    add("token_embd.weight", normal((n_vocab, N_EMBD), 2.0 / np.sqrt(N_EMBD)), qt)
    add("output_norm.weight", norm_w(N_EMBD))
    if arch == "llama":
        add("output.weight", normal((n_vocab, N_EMBD), 2.0 / np.sqrt(N_EMBD)), qt)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm_w(N_EMBD))
        add(p + "attn_q.weight", linear(N_EMBD, N_HEAD * hd), qt)
        add(p + "attn_k.weight", linear(N_EMBD, N_HEAD_KV * hd), qt)
        add(p + "attn_v.weight", linear(N_EMBD, N_HEAD_KV * hd), qt)
        add(p + "attn_output.weight", linear(N_HEAD * hd, N_EMBD), qt)
        if arch == "qwen3":
            add(p + "attn_q_norm.weight", norm_w(hd))
            add(p + "attn_k_norm.weight", norm_w(hd))
        add(p + "ffn_norm.weight", norm_w(N_EMBD))
        add(p + "ffn_gate.weight", linear(N_EMBD, N_FF), qt)
        add(p + "ffn_up.weight", linear(N_EMBD, N_FF), qt)
        add(p + "ffn_down.weight", linear(N_FF, N_EMBD), qt)
    for name, data, t in tensors:
        add_tensor(w, name, data, t)
    return finish_gguf(w, path)


# ---- sliding window: gemma3 -------------------------------------------------------------------

GEMMA3 = dict(n_layer=6, n_head=4, n_head_kv=2, head_dim=32, n_ff=128, window=8)  # layers 0-4 local


def build_gemma3(path, seed: int = 0, window: int | None = None, tokenizer: bool = False,
                 proj_type: QT = QT.F32) -> Path:
    """6 layers (layers 0-4 local with ``window``, default 8; layer 5 global), F32 weights
    (the attention output and feed-forward projections stored as ``proj_type``)."""
    c = GEMMA3
    window = window or c["window"]
    nl, H, Hkv, hd, n_ff = c["n_layer"], c["n_head"], c["n_head_kv"], c["head_dim"], c["n_ff"]
    normal, linear, norm_w = weight_makers(np.random.default_rng(seed))
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name(f"tiny-gemma3-w{window}")
    w.add_context_length(512)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(nl)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    n_vocab = _vocab_size(w, tokenizer)
    # input scaled by sqrt(n_embd) in gemma3: a small embedding keeps the logits O(1)
    w.add_tensor("token_embd.weight", normal((n_vocab, N_EMBD), 0.3 / math.sqrt(N_EMBD)))
    w.add_tensor("output_norm.weight", norm_w(N_EMBD))
    for i in range(nl):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm_w(N_EMBD))
        w.add_tensor(p + "attn_q.weight", linear(N_EMBD, H * hd))
        w.add_tensor(p + "attn_k.weight", linear(N_EMBD, Hkv * hd))
        w.add_tensor(p + "attn_v.weight", linear(N_EMBD, Hkv * hd))
        add_tensor(w, p + "attn_output.weight", linear(H * hd, N_EMBD), proj_type)
        w.add_tensor(p + "attn_q_norm.weight", norm_w(hd, 1.0))
        w.add_tensor(p + "attn_k_norm.weight", norm_w(hd, 1.0))
        w.add_tensor(p + "post_attention_norm.weight", norm_w(N_EMBD, 0.5))
        w.add_tensor(p + "ffn_norm.weight", norm_w(N_EMBD))
        add_tensor(w, p + "ffn_gate.weight", linear(N_EMBD, n_ff), proj_type)
        add_tensor(w, p + "ffn_up.weight", linear(N_EMBD, n_ff), proj_type)
        add_tensor(w, p + "ffn_down.weight", linear(n_ff, N_EMBD), proj_type)
        w.add_tensor(p + "post_ffw_norm.weight", norm_w(N_EMBD, 0.5))
    return finish_gguf(w, path)


# ---- sliding window + sinks + MoE: gpt-oss ----------------------------------------------------

GPT_OSS = dict(n_layer=4, n_head=4, n_head_kv=2, head_dim=32, n_ff=64, n_expert=8, n_expert_used=2, window=8)


def build_gpt_oss(path, seed: int = 0) -> Path:
    """4 layers, even ones local (window 8); biases, sinks; 8 experts / 2 used, F32 weights
    scaled so that the SwiGLU clamp at +-7 is hit."""
    c = GPT_OSS
    nl, H, Hkv, hd, n_ff, n_exp = c["n_layer"], c["n_head"], c["n_head_kv"], c["head_dim"], c["n_ff"], c["n_expert"]
    normal, linear, norm_w = weight_makers(np.random.default_rng(seed))
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_name("tiny-gpt-oss")
    w.add_context_length(512)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(nl)
    w.add_feed_forward_length(n_ff)
    w.add_expert_feed_forward_length(n_ff)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(150000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_sliding_window(c["window"])
    w.add_expert_count(n_exp)
    w.add_expert_used_count(c["n_expert_used"])
    w.add_vocab_size(N_VOCAB)
    w.add_tensor("token_embd.weight", normal((N_VOCAB, N_EMBD), 1.0))
    w.add_tensor("output_norm.weight", norm_w(N_EMBD))
    w.add_tensor("output.weight", linear(N_EMBD, N_VOCAB) * 2)
    for i in range(nl):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm_w(N_EMBD))
        for n, rows in (("q", H * hd), ("k", Hkv * hd), ("v", Hkv * hd)):
            w.add_tensor(p + f"attn_{n}.weight", linear(N_EMBD, rows))
            w.add_tensor(p + f"attn_{n}.bias", normal((rows,), 0.1))
        w.add_tensor(p + "attn_output.weight", linear(H * hd, N_EMBD))
        w.add_tensor(p + "attn_output.bias", normal((N_EMBD,), 0.1))
        w.add_tensor(p + "attn_sinks.weight", normal((H,), 1.0))
        w.add_tensor(p + "post_attention_norm.weight", norm_w(N_EMBD))
        w.add_tensor(p + "ffn_gate_inp.weight", linear(N_EMBD, n_exp) * 3)
        w.add_tensor(p + "ffn_gate_inp.bias", normal((n_exp,), 0.5))
        w.add_tensor(p + "ffn_gate_exps.weight", linear(N_EMBD, n_exp, n_ff) * 6)
        w.add_tensor(p + "ffn_gate_exps.bias", normal((n_exp, n_ff), 0.5))
        w.add_tensor(p + "ffn_up_exps.weight", linear(N_EMBD, n_exp, n_ff) * 6)
        w.add_tensor(p + "ffn_up_exps.bias", normal((n_exp, n_ff), 0.5))
        w.add_tensor(p + "ffn_down_exps.weight", linear(n_ff, n_exp, N_EMBD) * 0.1)
        w.add_tensor(p + "ffn_down_exps.bias", normal((n_exp, N_EMBD), 0.1))
    return finish_gguf(w, path)


# ---- MoE: qwen3moe ----------------------------------------------------------------------------

QWEN3MOE = dict(n_layer=2, n_head=4, n_head_kv=2, head_dim=32, n_expert=8, n_expert_used=2, n_ff_exp=64)


def build_qwen3moe(path, wtype: str = "f32", seed: int = 0, small: str = "f32") -> Path:
    """2 layers, q/k norms, tied embedding, router F32, experts as 3-D tensors of ``wtype``.

    ``wtype="iq4"``: every matrix IQ4_XS where its rows are whole super-blocks, else IQ4_NL
    (:func:`iq4_type`), with 256-wide expert FFNs so that the down projections are IQ4_XS.
    ``small``: how the norms and routers are stored: "f32", "bf16", or "f32-bf16" (F32
    holding the values a "bf16" file rounds them to: that file's exact F32 copy)."""
    c = QWEN3MOE
    nl, H, Hkv, hd, n_exp, ff = c["n_layer"], c["n_head"], c["n_head_kv"], c["head_dim"], c["n_expert"], c["n_ff_exp"]
    if wtype == "iq4":
        ff = 256
    qt = QTYPES.get(wtype)
    small_qt = QT.BF16 if small == "bf16" else QT.F32
    rng = np.random.default_rng(seed)

    def normal(shape, std):
        return (rng.standard_normal(size=shape) * std).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name(f"tiny-qwen3moe-{wtype}")
    w.add_context_length(512)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(nl)
    w.add_feed_forward_length(4 * N_EMBD)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(c["n_expert_used"])
    w.add_expert_feed_forward_length(ff)
    w.add_vocab_size(N_VOCAB)
    tensors = [("token_embd.weight", normal((N_VOCAB, N_EMBD), 2.0 / np.sqrt(N_EMBD)), qt),
               ("output_norm.weight", norm_w(N_EMBD), QT.F32)]
    for i in range(nl):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", norm_w(N_EMBD), QT.F32),
            (p + "attn_q.weight", normal((H * hd, N_EMBD), 1 / np.sqrt(N_EMBD)), qt),
            (p + "attn_k.weight", normal((Hkv * hd, N_EMBD), 1 / np.sqrt(N_EMBD)), qt),
            (p + "attn_v.weight", normal((Hkv * hd, N_EMBD), 1 / np.sqrt(N_EMBD)), qt),
            (p + "attn_output.weight", normal((N_EMBD, H * hd), 1 / np.sqrt(H * hd)), qt),
            (p + "attn_q_norm.weight", norm_w(hd), QT.F32),
            (p + "attn_k_norm.weight", norm_w(hd), QT.F32),
            (p + "ffn_norm.weight", norm_w(N_EMBD), QT.F32),
            (p + "ffn_gate_inp.weight", normal((n_exp, N_EMBD), 3 / np.sqrt(N_EMBD)), QT.F32),
            (p + "ffn_gate_exps.weight", normal((n_exp, ff, N_EMBD), 1 / np.sqrt(N_EMBD)), qt),
            (p + "ffn_up_exps.weight", normal((n_exp, ff, N_EMBD), 1 / np.sqrt(N_EMBD)), qt),
            (p + "ffn_down_exps.weight", normal((n_exp, N_EMBD, ff), 1 / np.sqrt(ff)), qt),
        ]
    for name, data, t in tensors:
        if data.ndim == 1 or name.endswith("ffn_gate_inp.weight"):  # norms and routers
            t = small_qt
            if small == "f32-bf16":
                data = gguf.quants.dequantize(gguf.quants.quantize(data, QT.BF16), QT.BF16).reshape(data.shape)
        elif t is None:  # wtype "iq4"
            t = iq4_type(data.shape[-1])
        add_tensor(w, name, data, t)
    return finish_gguf(w, path)


# ---- recurrent: mamba, mamba2 -----------------------------------------------------------------
# Mamba's reference init: A = -(1..d_state) (stored as ssm_a = -exp(A_log)), D = 1, conv
# weights U(+-1/sqrt(d_conv)), dt bias = softplus^-1(dt) with dt log-uniform in [1e-3, 1e-1].
# Big matrices Q8_0 (so the quantized matmuls run), the rest F32, embedding tied.

MAMBA = dict(n_layer=3, d_inner=2 * N_EMBD, d_state=16, d_conv=4, dt_rank=4)
MAMBA2 = dict(n_layer=3, d_inner=2 * N_EMBD, d_state=32, d_conv=4, n_head=4, n_group=2)


def _uniform(rng, shape, lo, hi):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def _dt_bias(rng, n, dt_min=1e-3, dt_max=1e-1):
    dt = np.exp(rng.uniform(np.log(dt_min), np.log(dt_max), size=n))
    return (dt + np.log(-np.expm1(-dt))).astype(np.float32)


def _ssm_header(w, c, n_layer):
    w.add_context_length(1 << 20)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(n_layer)
    w.add_ssm_conv_kernel(c["d_conv"])
    w.add_ssm_inner_size(c["d_inner"])
    w.add_ssm_state_size(c["d_state"])
    w.add_layer_norm_rms_eps(1e-5)


def build_mamba(path, seed: int = 0, tokenizer: bool = False) -> Path:
    """Mamba-1: 3 layers, d_inner 128, d_state 16, d_conv 4, dt_rank 4."""
    c = MAMBA
    di, ds, dc, r = c["d_inner"], c["d_state"], c["d_conv"], c["dt_rank"]
    rng = np.random.default_rng(seed + zlib.crc32(b"mamba"))
    normal, linear, norm_w = weight_makers(rng)
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_name("tiny-mamba")
    _ssm_header(w, c, c["n_layer"])
    w.add_ssm_time_step_rank(r)
    w.add_ssm_dt_b_c_rms(False)
    n_vocab = _vocab_size(w, tokenizer)
    add_tensor(w, "token_embd.weight", normal((n_vocab, N_EMBD), 2.0 / math.sqrt(N_EMBD)), QT.Q8_0)
    add_tensor(w, "output_norm.weight", norm_w(N_EMBD))
    A = -np.tile(np.arange(1, ds + 1, dtype=np.float32), (di, 1))
    for i in range(c["n_layer"]):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_norm.weight", norm_w(N_EMBD))
        add_tensor(w, p + "ssm_in.weight", linear(N_EMBD, 2 * di), QT.Q8_0)
        k = 1.0 / math.sqrt(dc)
        add_tensor(w, p + "ssm_conv1d.weight", _uniform(rng, (di, dc), -k, k))
        add_tensor(w, p + "ssm_conv1d.bias", _uniform(rng, (di,), -k, k))
        add_tensor(w, p + "ssm_x.weight", linear(di, r + 2 * ds), QT.Q8_0)
        add_tensor(w, p + "ssm_dt.weight", _uniform(rng, (di, r), -1 / math.sqrt(r), 1 / math.sqrt(r)))
        add_tensor(w, p + "ssm_dt.bias", _dt_bias(rng, di))
        add_tensor(w, p + "ssm_a", A)
        add_tensor(w, p + "ssm_d", np.ones(di, np.float32))
        # the gated scan output is small (~0.25 rms): gain 4 keeps each layer's update O(1)
        add_tensor(w, p + "ssm_out.weight", 4 * linear(di, N_EMBD), QT.Q8_0)
    return finish_gguf(w, path)


def build_mamba2(path, seed: int = 0, tokenizer: bool = False) -> Path:
    """Mamba-2: 3 layers, d_inner 128 in 4 heads of 32, d_state 32, 2 groups (heads 0-1 read
    group 0, heads 2-3 group 1), grouped RMSNorm before ssm_out."""
    c = MAMBA2
    di, ds, dc, nh, ng = c["d_inner"], c["d_state"], c["d_conv"], c["n_head"], c["n_group"]
    conv_dim = di + 2 * ng * ds
    rng = np.random.default_rng(seed + zlib.crc32(b"mamba2"))
    normal, linear, norm_w = weight_makers(rng)
    w = gguf.GGUFWriter(str(path), "mamba2")
    w.add_name("tiny-mamba2")
    _ssm_header(w, c, c["n_layer"])
    w.add_ssm_time_step_rank(nh)
    w.add_ssm_group_count(ng)
    n_vocab = _vocab_size(w, tokenizer)
    add_tensor(w, "token_embd.weight", normal((n_vocab, N_EMBD), 2.0 / math.sqrt(N_EMBD)), QT.Q8_0)
    add_tensor(w, "output_norm.weight", norm_w(N_EMBD))
    for i in range(c["n_layer"]):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_norm.weight", norm_w(N_EMBD))
        add_tensor(w, p + "ssm_in.weight", linear(N_EMBD, di + conv_dim + nh), QT.Q8_0)  # z, xBC, dt
        k = 1.0 / math.sqrt(dc)
        add_tensor(w, p + "ssm_conv1d.weight", _uniform(rng, (conv_dim, dc), -k, k))
        add_tensor(w, p + "ssm_conv1d.bias", _uniform(rng, (conv_dim,), -k, k))
        add_tensor(w, p + "ssm_dt.bias", _dt_bias(rng, nh))
        add_tensor(w, p + "ssm_a", -_uniform(rng, (nh, 1), 1.0, 16.0))
        add_tensor(w, p + "ssm_d", np.ones((nh, 1), np.float32))
        add_tensor(w, p + "ssm_norm.weight", norm_w(di).reshape(ng, di // ng))
        add_tensor(w, p + "ssm_out.weight", linear(di, N_EMBD), QT.Q8_0)
    return finish_gguf(w, path)


# ---- hybrid: lfm2 -----------------------------------------------------------------------------

LFM2 = dict(n_head=2, n_ff=128, l_cache=3, head_count_kv=[0, 0, 1, 0, 0, 1])  # 0: short-conv layer


def build_lfm2(path, seed: int = 0, tokenizer: bool = False) -> Path:
    """6 layers: gated short convolutions (kernel 3) at 0, 1, 3, 4; attention (2 heads of 32,
    1 KV head, q/k norms) at 2, 5; SwiGLU FFN everywhere; the final norm is
    ``token_embd_norm``."""
    c = LFM2
    H, n_ff, lc, kv = c["n_head"], c["n_ff"], c["l_cache"], c["head_count_kv"]
    hd = N_EMBD // H  # lfm2 has no key_length: n_head * head_dim == n_embd
    rng = np.random.default_rng(seed + zlib.crc32(b"lfm2"))
    normal, linear, norm_w = weight_makers(rng)
    w = gguf.GGUFWriter(str(path), "lfm2")
    w.add_name("tiny-lfm2")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(len(kv))
    w.add_feed_forward_length(n_ff)
    w.add_head_count(H)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(lc)
    n_vocab = _vocab_size(w, tokenizer)
    add_tensor(w, "token_embd.weight", normal((n_vocab, N_EMBD), 2.0 / math.sqrt(N_EMBD)), QT.Q8_0)
    add_tensor(w, "token_embd_norm.weight", norm_w(N_EMBD))
    for i, n_kv in enumerate(kv):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_norm.weight", norm_w(N_EMBD))
        if n_kv == 0:
            k = 1.0 / math.sqrt(lc)
            add_tensor(w, p + "shortconv.conv.weight", _uniform(rng, (N_EMBD, lc), -k, k))
            add_tensor(w, p + "shortconv.in_proj.weight", linear(N_EMBD, 3 * N_EMBD), QT.Q8_0)  # B, C, x
            add_tensor(w, p + "shortconv.out_proj.weight", 2 * linear(N_EMBD, N_EMBD), QT.Q8_0)
        else:
            add_tensor(w, p + "attn_q.weight", linear(N_EMBD, H * hd), QT.Q8_0)
            add_tensor(w, p + "attn_k.weight", linear(N_EMBD, n_kv * hd), QT.Q8_0)
            add_tensor(w, p + "attn_v.weight", linear(N_EMBD, n_kv * hd), QT.Q8_0)
            add_tensor(w, p + "attn_output.weight", linear(H * hd, N_EMBD), QT.Q8_0)
            add_tensor(w, p + "attn_q_norm.weight", norm_w(hd))
            add_tensor(w, p + "attn_k_norm.weight", norm_w(hd))
        add_tensor(w, p + "ffn_norm.weight", norm_w(N_EMBD))
        add_tensor(w, p + "ffn_gate.weight", linear(N_EMBD, n_ff), QT.Q8_0)
        add_tensor(w, p + "ffn_up.weight", linear(N_EMBD, n_ff), QT.Q8_0)
        add_tensor(w, p + "ffn_down.weight", linear(n_ff, N_EMBD), QT.Q8_0)
    return finish_gguf(w, path)


# ---- hybrids: gated DeltaNet + gated attention (qwen35, qwen35moe, qwen3next) ---------------

# Small and varied: value heads per q/k head r = 2 (moe, next) and 3 (dense: the tiled
# mapping h % n_qk differs from the grouped one), state dim 32 (moe, next) and 16 (dense:
# fewer rows than the kernel's row block), head_dim 32 so that q4_0/q8_0 KV works.
QWEN35 = {
    "qwen35moe": dict(n_layer=4, interval=4, n_head=4, n_head_kv=2, head_dim=32, n_rot=16, d_state=32,
                      n_qk=2, n_v=4, d_conv=4, n_expert=8, n_expert_used=2, n_ff_exp=64, n_ff_shexp=64),
    "qwen35": dict(n_layer=6, interval=3, n_head=4, n_head_kv=1, head_dim=32, n_rot=16, d_state=16,
                   n_qk=2, n_v=6, d_conv=4, n_ff=128),
    "qwen3next": dict(n_layer=4, interval=4, n_head=4, n_head_kv=2, head_dim=32, n_rot=16, d_state=32,
                      n_qk=2, n_v=4, d_conv=4, n_expert=8, n_expert_used=2, n_ff_exp=64, n_ff_shexp=64),
}


def build_qwen35(path, arch: str = "qwen35moe", wtype: str = "f32", seed: int = 0, tokenizer: bool = False,
                 layout: str = "split", fused_experts: bool = False, mtp: bool = False) -> Path:
    """A gated-DeltaNet hybrid of ``arch`` (sizes in ``QWEN35``): DeltaNet layers with
    attention every ``interval``-th layer (per head [query | gate] q projection, q/k norms,
    partial NEOX rope on 16 of 32 dims; qwen35* with rope sections [3, 3, 2, 0]), FFN SwiGLU
    (qwen35) or 8 experts / 2 used + sigmoid-gated shared expert; untied output.

    Big matrices ``wtype``, the rest F32. qwen3next: fused ``ssm_ba`` and, with
    ``layout="ssm_in"``, the legacy fused ``ssm_in`` (the same weights as ``layout="split"``).
    ``fused_experts``: experts as one ``ffn_gate_up_exps``. ``mtp``: one extra
    multi-token-prediction block after the trunk (``nextn_predict_layers`` = 1), which a
    reader must skip; the trunk's weights do not change with it."""
    c = QWEN35[arch]
    qt = QTYPES[wtype]
    nl, H, Hkv, hd = c["n_layer"], c["n_head"], c["n_head_kv"], c["head_dim"]
    D, n_qk, n_v, K = c["d_state"], c["n_qk"], c["n_v"], c["d_conv"]
    r = n_v // n_qk
    rng = np.random.default_rng(seed + zlib.crc32(arch.encode()))
    normal, linear, norm_w = weight_makers(rng)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{wtype}")
    w.add_context_length(1 << 18)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(nl + (1 if mtp else 0))
    if mtp:
        w.add_nextn_predict_layers(1)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(c["n_rot"])
    if arch != "qwen3next":
        w.add_rope_dimension_sections([3, 3, 2, 0])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(K)
    w.add_ssm_state_size(D)
    w.add_ssm_group_count(n_qk)
    w.add_ssm_time_step_rank(n_v)
    w.add_ssm_inner_size(n_v * D)
    w.add_full_attention_interval(c["interval"])
    if "n_expert" in c:
        w.add_expert_count(c["n_expert"])
        w.add_expert_used_count(c["n_expert_used"])
        w.add_expert_feed_forward_length(c["n_ff_exp"])
        w.add_expert_shared_feed_forward_length(c["n_ff_shexp"])
    else:
        w.add_feed_forward_length(c["n_ff"])
    n_vocab = _vocab_size(w, tokenizer)
    add_tensor(w, "token_embd.weight", normal((n_vocab, N_EMBD), 1.0), qt)
    add_tensor(w, "output_norm.weight", norm_w(N_EMBD))
    add_tensor(w, "output.weight", 2 * linear(N_EMBD, n_vocab), qt)

    def attention(p):
        add_tensor(w, p + "attn_q.weight", linear(N_EMBD, H * 2 * hd), qt)  # per head [query | gate]
        add_tensor(w, p + "attn_k.weight", linear(N_EMBD, Hkv * hd), qt)
        add_tensor(w, p + "attn_v.weight", linear(N_EMBD, Hkv * hd), qt)
        add_tensor(w, p + "attn_output.weight", linear(H * hd, N_EMBD), qt)
        add_tensor(w, p + "attn_q_norm.weight", norm_w(hd))
        add_tensor(w, p + "attn_k_norm.weight", norm_w(hd))

    def ffn(p):
        if "n_expert" not in c:
            add_tensor(w, p + "ffn_gate.weight", linear(N_EMBD, c["n_ff"]), qt)
            add_tensor(w, p + "ffn_up.weight", linear(N_EMBD, c["n_ff"]), qt)
            add_tensor(w, p + "ffn_down.weight", linear(c["n_ff"], N_EMBD), qt)
            return
        E, ff, fs = c["n_expert"], c["n_ff_exp"], c["n_ff_shexp"]
        add_tensor(w, p + "ffn_gate_inp.weight", 3 * linear(N_EMBD, E))
        gate, up = linear(N_EMBD, E, ff), linear(N_EMBD, E, ff)
        if fused_experts:
            add_tensor(w, p + "ffn_gate_up_exps.weight", np.concatenate([gate, up], axis=1), qt)
        else:
            add_tensor(w, p + "ffn_gate_exps.weight", gate, qt)
            add_tensor(w, p + "ffn_up_exps.weight", up, qt)
        add_tensor(w, p + "ffn_down_exps.weight", linear(ff, E, N_EMBD), qt)
        add_tensor(w, p + "ffn_gate_inp_shexp.weight", normal((N_EMBD,), 1.0 / math.sqrt(N_EMBD)))
        add_tensor(w, p + "ffn_gate_shexp.weight", linear(N_EMBD, fs), qt)
        add_tensor(w, p + "ffn_up_shexp.weight", linear(N_EMBD, fs), qt)
        add_tensor(w, p + "ffn_down_shexp.weight", linear(fs, N_EMBD), qt)

    for i in range(nl):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_norm.weight", norm_w(N_EMBD))
        if (i + 1) % c["interval"] == 0:
            attention(p)
        else:
            qkv, z = linear(N_EMBD, 2 * n_qk * D + n_v * D), linear(N_EMBD, n_v * D)
            beta, alpha = linear(N_EMBD, n_v), linear(N_EMBD, n_v)
            if arch == "qwen3next" and layout == "ssm_in":
                # per q/k head [q | k | v (r heads) | z (r heads)]
                q3, k3 = qkv[:n_qk * D].reshape(n_qk, D, -1), qkv[n_qk * D:2 * n_qk * D].reshape(n_qk, D, -1)
                v3, z3 = qkv[2 * n_qk * D:].reshape(n_qk, r * D, -1), z.reshape(n_qk, r * D, -1)
                add_tensor(w, p + "ssm_in.weight", np.concatenate([q3, k3, v3, z3], 1).reshape(-1, N_EMBD), qt)
            else:
                add_tensor(w, p + "attn_qkv.weight", qkv, qt)
                add_tensor(w, p + "attn_gate.weight", z, qt)
            if arch == "qwen3next":  # per q/k head [beta (r) | alpha (r)]
                ba = np.concatenate([beta.reshape(n_qk, r, -1), alpha.reshape(n_qk, r, -1)], 1)
                add_tensor(w, p + "ssm_ba.weight", ba.reshape(2 * n_v, N_EMBD))
            else:
                add_tensor(w, p + "ssm_beta.weight", beta)
                add_tensor(w, p + "ssm_alpha.weight", alpha)
            k = 1.0 / math.sqrt(K)
            add_tensor(w, p + "ssm_conv1d.weight", _uniform(rng, (2 * n_qk * D + n_v * D, K), -k, k))
            add_tensor(w, p + "ssm_dt.bias", _dt_bias(rng, n_v))
            add_tensor(w, p + "ssm_a", -_uniform(rng, (n_v,), 1.0, 16.0))
            add_tensor(w, p + "ssm_norm.weight", norm_w(D))
            add_tensor(w, p + "ssm_out.weight", linear(n_v * D, N_EMBD), qt)
        add_tensor(w, p + "post_attention_norm.weight", norm_w(N_EMBD))
        ffn(p)
    if mtp:  # weights of its own, drawn last: the trunk is the same with or without it
        p = f"blk.{nl}."
        add_tensor(w, p + "attn_norm.weight", norm_w(N_EMBD))
        attention(p)
        add_tensor(w, p + "post_attention_norm.weight", norm_w(N_EMBD))
        ffn(p)
        add_tensor(w, p + "nextn.eh_proj.weight", linear(2 * N_EMBD, N_EMBD), qt)
        add_tensor(w, p + "nextn.enorm.weight", norm_w(N_EMBD))
        add_tensor(w, p + "nextn.hnorm.weight", norm_w(N_EMBD))
    return finish_gguf(w, path)


# ---- the catalogue and the session fixtures ---------------------------------------------------

# name -> builder(path). The models the engine and the CLI load whole (chat, gemma3-swa and
# the recurrent ones) carry the tiny tokenizer and chat template.
CATALOGUE = {
    "chat": lambda p: build_tiny(p, "qwen3", "q8_0", tokenizer=True),
    "fim": lambda p: build_tiny(p, "llama", "q8_0", tokenizer="fim"),
    "gemma3": lambda p: build_gemma3(p),
    "gemma3-swa": lambda p: build_gemma3(p, window=32, tokenizer=True),
    "gpt-oss": lambda p: build_gpt_oss(p),
    "qwen3moe-f32": lambda p: build_qwen3moe(p, "f32"),
    "qwen3moe-q8_0": lambda p: build_qwen3moe(p, "q8_0"),
    "qwen3moe-iq4": lambda p: build_qwen3moe(p, "iq4"),
    "qwen3moe-bf16": lambda p: build_qwen3moe(p, "f32", small="bf16"),
    "qwen3moe-f32-bf16": lambda p: build_qwen3moe(p, "f32", small="f32-bf16"),
    "mamba": lambda p: build_mamba(p, tokenizer=True),
    "mamba2": lambda p: build_mamba2(p, tokenizer=True),
    "lfm2": lambda p: build_lfm2(p, tokenizer=True),
    "qwen35moe": lambda p: build_qwen35(p, "qwen35moe", tokenizer=True),
    "qwen35moe-q8_0": lambda p: build_qwen35(p, "qwen35moe", "q8_0", tokenizer=True),
    "qwen35": lambda p: build_qwen35(p, "qwen35"),
    "qwen3next": lambda p: build_qwen35(p, "qwen3next"),
    "qwen3next-ssm_in": lambda p: build_qwen35(p, "qwen3next", layout="ssm_in"),
}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny_gguf")
    out = {}
    for name in VARIANTS:
        arch, wtype = name.split("-", 1)
        out[name] = build_tiny(d / f"tiny-{name}.gguf", arch, wtype)
    return out


@pytest.fixture(scope="session")
def built_model(tmp_path_factory):
    """``built_model(name) -> Path``: the ``CATALOGUE`` model, written on first use."""
    d = tmp_path_factory.mktemp("built_gguf")
    paths: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in paths:
            paths[name] = CATALOGUE[name](d / f"tiny-{name}.gguf")
        return paths[name]

    return get


# ---- helpers shared by the per-architecture tests ---------------------------------------------

def named_model_loader(paths):
    """``get(name, **cfg)``: load_model(paths[name], **cfg), loaded once per name and config."""
    cache = {}

    def get(name, **cfg):
        key = (name, tuple(sorted(cfg.items())))
        if key not in cache:
            cache[key] = load_model(paths[name], **cfg)
        return cache[key]

    return get


def model_loader(path, block_size):
    """``get(**cfg)``: load_model(path, block_size=block_size, **cfg), one model per config."""
    get = named_model_loader({None: path})
    return lambda **cfg: get(None, **{"block_size": block_size, **cfg})


def rand_tokens(n, seed=0, n_vocab=N_VOCAB):
    return np.random.default_rng(seed).integers(0, n_vocab, size=n).astype(np.int32)


def rel_err(a, b):
    """max |a - b| / max |b|."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def check_batched_equals_alone(m, toks):
    """One batch of three sequences (one with 12 tokens already in its cache) gives the same
    last logits as each sequence alone (on a fork). ``toks(n, seed)`` makes the tokens."""
    a, b, c = toks(19, 3), toks(5, 4), toks(13, 5)
    sa, sb, sc = m.new_state(), m.new_state(), m.new_state()
    m.forward([(sa, a[:12])])
    alone = []
    for st, t in ((sa, a[12:]), (sb, b), (sc, c)):
        f = st.fork()
        alone.append(m.forward([(f, t)])[0])
        f.release()
    got = m.forward([(sa, a[12:]), (sb, b), (sc, c)])
    np.testing.assert_allclose(got, np.stack(alone), rtol=1e-4, atol=1e-4)
    for s in (sa, sb, sc):
        s.release()
