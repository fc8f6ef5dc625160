"""Tiny random GGUF models for tests, written with gguf.GGUFWriter (nothing downloaded).

    build_tiny(path, arch="llama"|"qwen3", wtype="f32"|"f16"|"q8_0"|"q4_0", seed=0)

2 layers, n_embd 64, vocab 256, GQA (4 heads / 2 kv heads). llama: head_dim 16, untied
``output.weight``; qwen3: head_dim 32 (q dim 128 != n_embd, so key_length matters), q/k
norms, tied embedding. Norms stay F32 like llama.cpp. Weights follow the conformance
fixtures' "numerically sane" init (logit std ~2, activations O(1)).

Use the session fixture ``tiny_models`` (import it into a test module:
``from fixtures import tiny_models  # noqa: F401``); it maps names such as
``"llama-f32"`` or ``"qwen3-q8_0"`` to file paths.
"""
from __future__ import annotations

import math
import zlib
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


def _quant(data: np.ndarray, qt: QT) -> np.ndarray:
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qt == QT.F32:
        return data
    if qt == QT.F16:
        return data.astype(np.float16)
    return gguf.quants.quantize(data, qt)


def build_tiny(path, arch: str = "llama", wtype: str = "f32", seed: int = 0, context_length: int = 512,
               rope_base: float = 10000.0) -> Path:
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
    w.add_vocab_size(N_VOCAB)
    if arch == "llama":
        w.add_rope_dimension_count(hd)
    else:
        w.add_key_length(hd)
        w.add_value_length(hd)

    tensors: list[tuple[str, np.ndarray, QT]] = []

    def add(name, data, t=QT.F32):
        tensors.append((name, data, t))

    add("token_embd.weight", normal((N_VOCAB, N_EMBD), 2.0 / np.sqrt(N_EMBD)), qt)
    add("output_norm.weight", norm_w(N_EMBD))
    if arch == "llama":
        add("output.weight", normal((N_VOCAB, N_EMBD), 2.0 / np.sqrt(N_EMBD)), qt)
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
        q = _quant(data, t)
        w.add_tensor(name, q, raw_dtype=t if t not in (QT.F32, QT.F16) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny_gguf")
    out = {}
    for name in VARIANTS:
        arch, wtype = name.split("-", 1)
        out[name] = build_tiny(d / f"tiny-{name}.gguf", arch, wtype)
    return out


# ---- helpers shared by the per-architecture tests (test_gemma3, test_gpt_oss) ----------------

def weight_makers(rng):
    """(normal, linear, norm_w) drawing from ``rng`` in call order: the conformance fixtures'
    "numerically sane" float32 init. ``linear(n_in, *n_out)`` is (*n_out, n_in) with std
    1/sqrt(n_in); ``norm_w(n, scale=1.0)`` is scale * (1 + 0.1 N(0, 1))."""
    def normal(shape, std):
        return (rng.standard_normal(size=shape) * std).astype(np.float32)

    def linear(n_in, *n_out):
        return normal((*n_out, n_in), 1.0 / math.sqrt(n_in))

    def norm_w(n, scale=1.0):
        return (scale * (1.0 + 0.1 * rng.standard_normal(size=(n,)))).astype(np.float32)

    return normal, linear, norm_w


def finish_gguf(w, path):
    """Write header, KV data and tensors of GGUFWriter ``w``, close it, return ``path``."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


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
