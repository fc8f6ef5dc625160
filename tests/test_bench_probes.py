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


def test_batched_decode_round_table_divides_within_each_round():
    from types import SimpleNamespace

    from batched_decode import _round_lines

    # two rounds of 2-thread step times (s) at B = 1, 8, 32, and the memory probe before each
    rounds = [{1: 0.0025, 8: 0.0050, 32: 0.0125}, {1: 0.0040, 8: 0.0060, 32: 0.0160}]
    lines = _round_lines(rounds, [40.0, 20.0], SimpleNamespace(threads=2, batches=[1, 8, 32]), 80_000_000)
    rows = [ln for ln in lines if ln.startswith("| 1 ") or ln.startswith("| 2 ")]
    # round 1: 80 MB at 40 GB/s = 2.0 ms bound against a 2.5 ms step; 8 x 2.5 / 5.0; 32 x 2.5 / 12.5
    assert rows[0] == "| 1 | 40.0 | 2.50 | 0.80 | 4.00x | 6.40x |"
    # round 2: 4.0 ms bound against 4.0 ms; 8 x 4 / 6; 32 x 4 / 16
    assert rows[1] == "| 2 | 20.0 | 4.00 | 1.00 | 5.33x | 8.00x |"


def test_batched_decode_round_table_shows_the_core_round_trip():
    from types import SimpleNamespace

    from batched_decode import _round_lines

    rounds = [{1: 0.0025, 8: 0.0050}, {1: 0.0040, 8: 0.0080}]
    a = SimpleNamespace(threads=2, batches=[1, 8])
    lines = _round_lines(rounds, [40.0, 20.0], a, 80_000_000, [112.4, 431.6])
    assert "| round | memory probe GB/s | core round trip ns | B=1 ms | B=1 / bound | B=8 / 1 |" in lines
    rows = [ln for ln in lines if ln.startswith("| 1 ") or ln.startswith("| 2 ")]
    assert rows == ["| 1 | 40.0 | 112 | 2.50 | 0.80 | 4.00x |", "| 2 | 20.0 | 432 | 4.00 | 1.00 | 4.00x |"]
    # no probe (or not one a round): the table without the column
    assert not any("core round trip" in ln for ln in _round_lines(rounds, [40.0, 20.0], a, 80_000_000, [112.4]))


@pytest.mark.skipif(importlib.util.find_spec("Cython") is None,
                    reason="the probe is built by pyximport, which needs Cython (pip install -e .[bench])")
def test_core_round_trip_probe_times_a_hand_over_between_two_threads():
    membw = load_probe("membw")
    ns = membw.core_round_trip_ns(500)
    # two pinned threads hand a line back and forth: tens of ns a round trip between two idle
    # cores, up to a scheduler slice where another process holds one (allowed: a busy CI host)
    assert ns == -1.0 or 10.0 < ns < 1e6
    from speed import core_round_trip_ns

    rtt = core_round_trip_ns(n=500, reps=1)
    assert rtt == -1.0 or rtt > 10.0
    # a hand-over count it cannot finish in its time budget stops at the budget
    import time

    t0 = time.perf_counter()
    ns = membw.core_round_trip_ns(10**12, 0.05)
    assert time.perf_counter() - t0 < 5.0
    assert ns == -1.0 or ns > 10.0
