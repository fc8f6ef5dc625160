#!/usr/bin/env python3
"""The decode attention kernel alone: one new token per sequence against its cached context,
layer after layer (each layer its own K/V pools, so the K/V come from memory as in a real
step), through llmcore.nn.attention.

    python bench/attn_decode.py [--case smollm2-16k|smollm2-b8|...] [-t 2] [-n 5]

Cases (f16 KV, block size 32 unless --bs), SmolLM2-135M's attention (H=9, KVH=3, D=64):
  smollm2-16k   1 sequence at a 16384-token depth, 30 layers (377 MB of K/V per step)
  smollm2-4k    1 sequence at 4096, 30 layers
  smollm2-b8    8 sequences at 600 tokens each, 30 layers (batched decode's shape)
  smollm2-b32   32 sequences at 600 tokens each, 30 layers
  qwen35-16k    Qwen3.5/3.6-35B-A3B's attention layers (H=16, KVH=2, D=256), 10 layers, 16k depth
  qwen35-b8     the same, 8 sequences at 2048 tokens
  qwen3moe-4k   Qwen3-30B-A3B's (H=32, KVH=4, D=128), 48 layers, 4k depth

K/V storage is what the block pool makes (huge pages; --small-pages: the heap's 4 KiB pages),
block ids shuffled (--contiguous: in order). Prints the time of a step (all layers) and the K/V bytes read per second, min and median,
as a share of the memory read probe (bench/membw.pyx) measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's llmcore

CASES = {
    "smollm2-16k": dict(H=9, KVH=3, D=64, seqs=1, ctx=16384, layers=30),
    "smollm2-4k": dict(H=9, KVH=3, D=64, seqs=1, ctx=4096, layers=30),
    "smollm2-b8": dict(H=9, KVH=3, D=64, seqs=8, ctx=600, layers=30),
    "smollm2-b32": dict(H=9, KVH=3, D=64, seqs=32, ctx=600, layers=30),
    # the attention layers of Qwen3.5/3.6-35B-A3B (every 4th of 40): 16 heads / 2 kv heads x 256
    "qwen35-16k": dict(H=16, KVH=2, D=256, seqs=1, ctx=16384, layers=10),
    "qwen35-b8": dict(H=16, KVH=2, D=256, seqs=8, ctx=2048, layers=10),
    # Qwen3-30B-A3B: 32 heads / 4 kv heads x 128, 48 layers (a 4k depth)
    "qwen3moe-4k": dict(H=32, KVH=4, D=128, seqs=1, ctx=4096, layers=48),
}


def make_pool(kv_type, n_blocks, bs, KVH, D, small_pages):
    """A layer's K or V storage as the engine's block pool makes it (a huge-page mapping),
    or on the malloc heap's 4 KiB pages (small_pages)."""
    from llmcore import nn
    from llmcore.hugepages import huge_page_mapping

    pool = nn.make_kv_pool(kv_type, n_blocks, bs, KVH, D)
    if small_pages:
        return pool
    return np.frombuffer(huge_page_mapping(pool.nbytes), dtype=pool.dtype).reshape(pool.shape)


def build_layer(r, H, KVH, D, seqs, ctx, bs, kv_type, contiguous=False, small_pages=False):
    from llmcore import nn

    nbs = (ctx + bs - 1) // bs
    nb = nbs * seqs
    ids = (np.arange(nb) if contiguous else r.permutation(nb + 3)[:nb]).astype(np.int32).reshape(seqs, nbs)
    k_pool = make_pool(kv_type, nb + 3, bs, KVH, D, small_pages)
    v_pool = make_pool(kv_type, nb + 3, bs, KVH, D, small_pages)
    pos = np.arange(ctx, dtype=np.int32)
    for s in range(seqs):
        nn.kv_store(k_pool, kv_type, ids[s], pos, r.standard_normal((ctx, KVH, D), dtype=np.float32))
        nn.kv_store(v_pool, kv_type, ids[s], pos, r.standard_normal((ctx, KVH, D), dtype=np.float32))
    return k_pool, v_pool, ids


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="repeatable; default: all")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--contiguous", action="store_true", help="each sequence's blocks in order (default: shuffled)")
    ap.add_argument("--small-pages", action="store_true", help="K/V on 4 KiB heap pages, not the pool's huge pages")
    ap.add_argument("--layers", type=int, help="layers (K/V pools) per step; 1: the K/V stay in cache")
    ap.add_argument("--no-probe", action="store_true", help="skip the memory read probe (the peer of the GB/s column)")
    a = ap.parse_args(argv)
    from llmcore import nn, threads

    threads.set_num_threads(a.threads)
    probe = None  # the memory read probe (GB/s at -t threads), measured once
    for name in a.case or list(CASES):
        cfg = dict(CASES[name])
        if a.layers:
            cfg["layers"] = a.layers
        r = np.random.default_rng(0)
        H, D, seqs, ctx = cfg["H"], cfg["D"], cfg["seqs"], cfg["ctx"]
        layers = [build_layer(r, H, cfg["KVH"], D, seqs, ctx, a.bs, a.kv, a.contiguous, a.small_pages) for _ in range(cfg["layers"])]
        kv_bytes = sum(k.nbytes * seqs * ((ctx + a.bs - 1) // a.bs) / k.shape[0] * 2 for k, _, _ in layers)
        q = r.standard_normal((seqs, H, D), dtype=np.float32)
        seg = np.arange(seqs + 1, dtype=np.int32)
        q_pos = np.full(seqs, ctx - 1, np.int32)
        out = np.empty((seqs, H, D), np.float32)
        scale = 1.0 / np.sqrt(D)
        decode = np.ones(seqs, np.uint8)

        def step():
            for k_pool, v_pool, ids in layers:
                nn.attention(q, k_pool, v_pool, a.kv, ids, seg, q_pos, scale, out=out, decode_seqs=decode)

        step()
        ts = []
        for _ in range(a.n):
            t0 = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        med = ts[len(ts) // 2]
        if probe is None and not a.no_probe:
            try:
                from speed import membw_gbs
                probe = membw_gbs(a.threads)
            except Exception as e:  # no Cython / compiler: the GB/s column alone
                print(f"memory probe unavailable ({type(e).__name__}: {e})", flush=True)
                a.no_probe = True
        vs = f" = {kv_bytes / ts[0] / 1e9 / probe:.2f} of the probe's {probe:.1f}" if probe else ""
        print(f"{name:12s} -t {a.threads} kv {a.kv} bs {a.bs}: step min {ts[0] * 1e3:7.2f} ms  median {med * 1e3:7.2f} ms"
              f"  K/V {kv_bytes / 1e6:6.1f} MB  {kv_bytes / ts[0] / 1e9:5.1f} GB/s (at min){vs}", flush=True)


if __name__ == "__main__":
    main()
