"""bench/speed.py's compute-bound figures: the multiply-adds a token's matmuls do (from the
GGUF's matrices, an embedding table counted only where it is the output projection), and
the int8 probe (bench/int8peak.pyx) counting exactly the multiply-adds it runs."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from fixtures import HEAD_DIM, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_LAYER, N_VOCAB  # noqa: E402
from speed import int8_gmacs, load_probe, weight_macs_per_token  # noqa: E402


def per_layer_macs(hd: int) -> int:
    q, kv = N_HEAD * hd, N_HEAD_KV * hd
    return N_EMBD * q + 2 * N_EMBD * kv + q * N_EMBD + 3 * N_EMBD * N_FF


@pytest.mark.parametrize("name", ["llama-f32", "qwen3-q8_0"])
def test_weight_macs_per_token_counts_matrices_and_the_head(tiny_models, name):
    arch = name.split("-")[0]
    # llama: an untied output.weight (the embedding table is a lookup); qwen3: tied, the
    # table is the head. Either way one head of N_VOCAB x N_EMBD.
    want = N_LAYER * per_layer_macs(HEAD_DIM[arch]) + N_VOCAB * N_EMBD
    assert weight_macs_per_token(str(tiny_models[name])) == want


@pytest.mark.skipif(importlib.util.find_spec("Cython") is None,
                    reason="the probe is built by pyximport, which needs Cython (pip install -e .[bench])")
def test_int8_probe_counts_its_multiply_adds():
    int8peak = load_probe("int8peak")
    one = int8peak.int8_macs(1000, 1)
    # a build's path does 12 x 64 (AVX-512 VNNI), 6 x 32 (AVX2) or 1 (plain C) an iteration
    assert one in (1000 * 12 * 64, 1000 * 6 * 32, 1000)
    assert int8peak.int8_macs(1000, 2) == 2 * one
    assert int8peak.int8_macs(3000, 1) == 3 * one
    assert int8_gmacs(1, reps=1, iters=10_000) > 0
