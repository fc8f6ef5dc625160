#!/usr/bin/env python3
"""A/B of two builds of the attention extension in one process: batched decode attention
(8 sequences x 600 tokens, SmolLM2's 9 heads / 3 kv heads of 64, --layers K/V pools), the
builds interleaved rep by rep, thread CPU time at 1 thread (robust on a shared host).

    python bench/attn_ab.py DIR_A DIR_B [--kv q4_0] [--reps 31]
    python bench/attn_ab.py DIR_A DIR_B --prefill smollm2-4k --kv f16 [--reps 9]
    python bench/attn_ab.py DIR_A DIR_B --verify 4 --ctx 2444 --kv f16

--prefill CASE: a prefill chunk of bench/attn_prefill.py's cases (tile items) instead.
--verify K: a speculative verify (K + 1 rows of one sequence, decode bits) at --ctx keys.

DIR_A, DIR_B: folders holding a built attention extension (copies of
llmcore/_kernels/attention*.so before and after a change). Prints whether their outputs are
identical and the ms per layer call (min and median of the reps)."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--kv", default="q4_0", choices=("f32", "f16", "q8_0", "q4_0"))
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--layers", type=int, default=4,
                    help="K/V pools a step walks (4: ~4 MB, in cache; 30: the model's ~33 MB, from memory)")
    ap.add_argument("--prefill", metavar="CASE", help="a prefill case of bench/attn_prefill.py instead")
    ap.add_argument("--verify", type=int, metavar="K",
                    help="a speculative verify instead: K drafted tokens and the last one (K + 1 rows a "
                         "sequence, each with a one-token decode's bits) of one sequence at --ctx")
    ap.add_argument("--ctx", type=int, default=600, help="context of each sequence (keys)")
    ap.add_argument("--bs", type=int, default=32, help="the K/V pools' block size (tokens)")
    ap.add_argument("--heads", type=int, nargs=3, default=(9, 3, 64), metavar=("H", "KVH", "D"),
                    help="query heads, kv heads, head size (SmolLM2's; gemma-3-270m: 4 1 256)")
    a = ap.parse_args(argv)
    from _ab import load_build
    from attn_decode import build_layer

    from llmcore import nn, threads

    threads.set_num_threads(1)
    mods = {name: load_build(folder, "attention") for name, folder in (("A", a.a), ("B", a.b))}
    if a.prefill:
        return prefill_ab(a, mods)
    r = np.random.default_rng(0)
    (H, KVH, D), seqs, ctx = a.heads, 8, a.ctx
    rows = 1  # query rows a sequence
    if a.verify is not None:
        seqs, rows = 1, a.verify + 1
    layers = [build_layer(r, H, KVH, D, seqs, ctx, a.bs, a.kv) for _ in range(a.layers)]
    q = r.standard_normal((seqs * rows, H, D), dtype=np.float32)
    seg = np.arange(0, seqs * rows + 1, rows, dtype=np.int32)
    q_pos = np.tile(np.arange(ctx - rows, ctx, dtype=np.int32), seqs)
    decode = np.ones(seqs, np.uint8)
    outs, res = {}, {k: [] for k in mods}
    for name, mod in mods.items():
        nn._attention = mod
        out = np.empty((seqs * rows, H, D), np.float32)
        kp, vp, ids = layers[0]
        nn.attention(q, kp, vp, a.kv, ids, seg, q_pos, D ** -0.5, out=out, decode_seqs=decode)
        outs[name] = out
    same = np.array_equal(outs["A"], outs["B"])
    print(f"outputs identical: {same} (max abs difference {np.abs(outs['A'] - outs['B']).max():.3g})")
    out = np.empty((seqs * rows, H, D), np.float32)
    passes = 5 if a.layers < 10 else 1  # over the pools a rep: a few layers' in cache take several
    for _ in range(a.reps):
        for name, mod in mods.items():
            nn._attention = mod
            t0 = time.thread_time()
            for _ in range(passes):
                for kp, vp, ids in layers:
                    nn.attention(q, kp, vp, a.kv, ids, seg, q_pos, D ** -0.5, out=out, decode_seqs=decode)
            res[name].append((time.thread_time() - t0) / (passes * len(layers)))
    for name, ts in res.items():
        ts.sort()
        print(f"{name} ({getattr(a, name.lower())}): min {ts[0] * 1e3:.4f} ms  median {ts[len(ts) // 2] * 1e3:.4f} ms "
              f"per layer call, kv {a.kv}")
    print_ratio(res)


def print_ratio(res):
    """B's time over A's, at the min and the median (res: sorted times per build)."""
    print(f"B / A: {res['B'][0] / res['A'][0]:.3f} (min), {res['B'][len(res['B']) // 2] / res['A'][len(res['A']) // 2]:.3f} (median)")


def prefill_ab(a, mods):
    from attn_prefill import CASES, build

    from llmcore import nn

    cfg = CASES[a.prefill]
    (q, kp, vp, tables, seg, q_pos), flops = build(**cfg, bs=32, kv_type=a.kv)
    scale = 1.0 / np.sqrt(cfg["D"])
    outs, res = {}, {k: [] for k in mods}
    for name, mod in mods.items():
        nn._attention = mod
        outs[name] = nn.attention(q, kp, vp, a.kv, tables, seg, q_pos, scale, window=cfg["window"])
    diff = np.abs(outs["A"] - outs["B"]).max()
    print(f"outputs identical: {np.array_equal(outs['A'], outs['B'])} (max abs difference {diff:.3g})")
    for _ in range(a.reps):
        for name, mod in mods.items():
            nn._attention = mod
            t0 = time.thread_time()
            nn.attention(q, kp, vp, a.kv, tables, seg, q_pos, scale, window=cfg["window"])
            res[name].append(time.thread_time() - t0)
    for name, ts in res.items():
        ts.sort()
        print(f"{name} ({getattr(a, name.lower())}): min {ts[0] * 1e3:.2f} ms  median {ts[len(ts) // 2] * 1e3:.2f} ms"
              f"  {flops / ts[0] / 1e9:.1f} GFLOPS (at min), {a.prefill} kv {a.kv}")
    print_ratio(res)


if __name__ == "__main__":
    main()
