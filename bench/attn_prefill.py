#!/usr/bin/env python3
"""The prefill (tile) attention kernel alone: CPU time and GFLOPS of one causal prefill
chunk against a long cached context, through llmcore.nn.attention.

    python bench/attn_prefill.py [--case smollm2-16k|smollm2-pp512|gemma-pp512|...] [-t 1] [-n 5]

Cases (f16 KV, block size 32 unless --bs):
  smollm2-16k    2048 query rows at positions 14336..16383 (the end of a 16k prefill), H=9, KVH=3, D=64
  smollm2-4k     512 query rows at positions 3584..4095
  smollm2-pp512  512 query rows at positions 0..511
  gemma-pp512    512 query rows at 0..511, H=4, KVH=1, D=256
  gemma-swa      512 rows at 1536..2047 with a 512-token window, H=4, KVH=1, D=256
  smollm2-next-turn  13 rows at 61249..61261 (a cached 60k agent history's next turn)

FLOPs count 2 * (D + Dv) per visible (query head, key) pair (QK^T and P.V), the causal mask
included. At -t 1 the calling thread's CPU time is reported (robust to a loaded machine);
otherwise wall time. Prints min and median over -n runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's llmcore

CASES = {
    "smollm2-16k": dict(H=9, KVH=3, D=64, n_q=2048, ctx=16384, window=0),
    "smollm2-4k": dict(H=9, KVH=3, D=64, n_q=512, ctx=4096, window=0),
    "smollm2-pp512": dict(H=9, KVH=3, D=64, n_q=512, ctx=512, window=0),
    "gemma-pp512": dict(H=4, KVH=1, D=256, n_q=512, ctx=512, window=0),
    "gemma-swa": dict(H=4, KVH=1, D=256, n_q=512, ctx=2048, window=512),
    # a cached agent history's next turn: 13 new tokens (39 rows a kv head) at a 60k depth
    "smollm2-next-turn": dict(H=9, KVH=3, D=64, n_q=13, ctx=61262, window=0),
}


def build(H, KVH, D, n_q, ctx, window, bs, kv_type, seed=0):
    from llmcore import nn

    r = np.random.default_rng(seed)
    nb = (ctx + bs - 1) // bs
    ids = r.permutation(nb + 3)[:nb].astype(np.int32)
    k_pool = nn.make_kv_pool(kv_type, nb + 3, bs, KVH, D)
    v_pool = nn.make_kv_pool(kv_type, nb + 3, bs, KVH, D)
    pos = np.arange(ctx, dtype=np.int32)
    nn.kv_store(k_pool, kv_type, ids, pos, r.standard_normal((ctx, KVH, D), dtype=np.float32))
    nn.kv_store(v_pool, kv_type, ids, pos, r.standard_normal((ctx, KVH, D), dtype=np.float32))
    q_pos = np.arange(ctx - n_q, ctx, dtype=np.int32)
    q = r.standard_normal((n_q, H, D), dtype=np.float32)
    tables = ids.reshape(1, -1)
    seg = np.array([0, n_q], np.int32)
    lo = np.maximum(0, q_pos - window + 1) if window else np.zeros_like(q_pos)
    pairs = int((q_pos - lo + 1).sum()) * H
    return (q, k_pool, v_pool, tables, seg, q_pos), pairs * 2 * 2 * D


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="repeatable; default: all")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--kv", default="f16")
    a = ap.parse_args(argv)
    from llmcore import nn, threads

    threads.set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    for name in a.case or list(CASES):
        cfg = CASES[name]
        case, flops = build(**cfg, bs=a.bs, kv_type=a.kv)
        q, k_pool, v_pool, tables, seg, q_pos = case
        scale = 1.0 / np.sqrt(cfg["D"])
        out = np.empty((q.shape[0], cfg["H"], cfg["D"]), np.float32)
        nn.attention(q, k_pool, v_pool, a.kv, tables, seg, q_pos, scale, window=cfg["window"], out=out)
        ts = []
        for _ in range(a.n):
            t0 = clock()
            nn.attention(q, k_pool, v_pool, a.kv, tables, seg, q_pos, scale, window=cfg["window"], out=out)
            ts.append(clock() - t0)
        ts.sort()
        med = ts[len(ts) // 2]
        print(f"{name:14s} -t {a.threads} kv {a.kv} bs {a.bs}: min {ts[0] * 1e3:8.1f} ms  median {med * 1e3:8.1f} ms"
              f"  {flops / ts[0] / 1e9:6.1f} GFLOPS (at min)", flush=True)


if __name__ == "__main__":
    main()
