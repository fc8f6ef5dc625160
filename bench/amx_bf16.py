#!/usr/bin/env python3
"""The AMX-BF16 prefill paths against the kernels they replace, in one process, alternated
rep by rep: weight matmuls of a prefill chunk (the int8 kernels: VNNI, AMX-INT8) and a
prompt's attention tiles (the f32 tile kernel). Needs a CPU with AMX-BF16.

    python bench/amx_bf16.py [-t 2] [-n 512] [--reps 7] [--rounds 3]

Matmuls: gemma-3-270m's and SmolLM2's prefill shapes (gate+up, down, o, q) in their GGUF
types, random weights; ms a call (min over reps, median over rounds) and GFLOP/s. Attention:
bench/attn_prefill.py's cases (one layer), ms a call, the two kernels alternated.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as QT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "tests"))

from kquants import best  # noqa: E402  (bench/kquants.py: min over reps)

# (name, type, rows, cols): a layer's prefill matmuls
SHAPES = [
    ("gemma gate+up", "Q5_0", 4096, 640),
    ("gemma down", "Q6_K", 640, 2048),
    ("gemma down", "Q4_K", 640, 2048),
    ("gemma o", "Q4_K", 640, 1024),
    ("gemma q", "Q5_0", 1024, 640),
    ("SmolLM2 gate+up", "Q4_1", 3072, 576),
    ("SmolLM2 down", "Q4_1", 576, 1536),
    ("SmolLM2 q", "Q4_1", 576, 576),
]
ATTN_CASES = ["gemma-pp512", "smollm2-pp512", "smollm2-4k"]


def _weights(qt, rows, cols, rng):
    from llmcore._kernels import kquants, quants
    if qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        from test_kquants import rand_weight
        return kquants, kquants.pack(rand_weight(rng, qt, rows, cols), int(qt))
    import gguf
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    raw = np.ascontiguousarray(gguf.quants.quantize(w, qt)).view(np.uint8).reshape(rows, -1)
    return quants, quants.pack(raw, int(qt))


def _time(fn, reps):
    fn()  # warm-up: buffers grown, weights in cache
    return best(fn, reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=512, help="tokens of the prefill chunk")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    from llmcore._kernels import attention, kquants, quants
    if not (quants.AMX_BF16 and kquants.AMX_BF16):
        print("AMX-BF16 is not in use here (the CPU lacks it, Linux refused the tile state, or "
              "LLMCORE_NO_AMX_BF16 / LLMCORE_NO_AMX is set): nothing to compare")
        return 1
    rng = np.random.default_rng(0)
    print(f"matmuls, {a.n} tokens, {a.threads} threads, min of {a.reps} reps, median of {a.rounds} rounds")
    print("| shape | type | int8 ms | AMX-BF16 ms | int8 / AMX-BF16 | AMX-BF16 GFLOP/s |")
    print("|---|---|---:|---:|---:|---:|")
    for name, tname, rows, cols in SHAPES:
        qt = QT[tname]
        mod, pk = _weights(qt, rows, cols, rng)
        x = rng.standard_normal((a.n, cols)).astype(np.float32)
        y = np.empty((a.n, rows), np.float32)
        t = {0: [], 1: []}
        for _ in range(a.rounds):
            for on in (0, 1):
                mod._set_amx_bf16(on)
                t[on].append(_time(lambda: mod.matmul(pk, x, y, a.threads), a.reps))
        mod._set_amx_bf16(1)
        t8, tb = float(np.median(t[0])), float(np.median(t[1]))
        print(f"| {name} | {tname} | {t8 * 1e3:.3f} | {tb * 1e3:.3f} | {t8 / tb:.2f}x | "
              f"{2 * a.n * rows * cols / tb / 1e9:.0f} |")
    import attn_prefill
    print(f"\nprompt attention tiles (bench/attn_prefill.py cases, one layer), {a.threads} threads")
    print("| case | f32 tiles ms | AMX-BF16 ms | f32 / AMX-BF16 |")
    print("|---|---:|---:|---:|")
    from llmcore import nn, threads
    threads.set_num_threads(a.threads)
    for case in ATTN_CASES:
        cfg = attn_prefill.CASES[case]
        (q, k_pool, v_pool, tables, seg, q_pos), _ = attn_prefill.build(**cfg, bs=32, kv_type="f16")
        out = np.empty((q.shape[0], cfg["H"], cfg["D"]), np.float32)

        def run():
            nn.attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 1.0 / np.sqrt(cfg["D"]),
                         window=cfg["window"], out=out)
        t = {0: [], 1: []}
        for _ in range(a.rounds):
            for on in (0, 1):
                attention._set_amx_bf16(on)
                t[on].append(_time(run, a.reps))
        attention._set_amx_bf16(1)
        tf, tb = float(np.median(t[0])), float(np.median(t[1]))
        print(f"| {case} | {tf * 1e3:.2f} | {tb * 1e3:.2f} | {tf / tb:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
