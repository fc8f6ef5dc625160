#!/usr/bin/env python3
"""A/B of two builds of the quants (weight matmul) extension in one process: SmolLM2-135M's
matmul shapes at T tokens a call, the builds interleaved rep by rep, thread CPU time at 1
thread (robust on a shared host).

    python bench/matmul_ab.py DIR_A DIR_B [--type Q4_1] [--tokens 8] [--reps 21] [--copies 1]

DIR_A, DIR_B: folders holding a built quants (or, --module kquants, kquants) extension
(copies of llmcore/_kernels/quants*.so before and after a change). Prints the largest difference of
their outputs (relative to the output's scale) and the us per pass over the shapes (min and
median of the reps). --copies N: N copies of each weight (from memory rather than cache)."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (out, in) of one SmolLM2 layer's q, k, v, o, gate+up, down
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (3072, 576), (576, 1536)]
# the K-quants (256-value super-blocks): gemma-3-270m's o and down projections
SHAPES_K = [(640, 1024), (640, 2048)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--type", default="Q4_1")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--module", default="quants", help="the kernel extension (quants; kquants for the K-quants)")
    a = ap.parse_args(argv)
    from _ab import load_build
    from matmul import make_raw

    from llmcore import threads

    threads.set_num_threads(1)
    qt = QT[a.type]
    global SHAPES
    if a.module == "kquants":
        SHAPES = SHAPES_K
    mods = {name: load_build(folder, a.module) for name, folder in (("A", a.a), ("B", a.b))}
    r = np.random.default_rng(0)
    raws = [make_raw(qt, o, i, seed=s) for s, (o, i) in enumerate(SHAPES)]
    packs = {name: [[m.pack(raw, int(qt)) for raw in raws] for _ in range(a.copies)] for name, m in mods.items()}
    xs = {i: r.standard_normal((a.tokens, i), dtype=np.float32) for _, i in SHAPES}
    ys = [np.empty((a.tokens, o), np.float32) for o, _ in SHAPES]
    outs = {}
    for name, m in mods.items():
        outs[name] = []
        for p, (o, i) in zip(packs[name][0], SHAPES):
            y = np.empty((a.tokens, o), np.float32)
            m.matmul(p, xs[i], y, 1)
            outs[name].append(y)
    diff = max(float(np.abs(ya - yb).max() / np.abs(ya).max()) for ya, yb in zip(outs["A"], outs["B"]))
    print(f"outputs: largest difference {diff:.3g} of the output's scale "
          f"({'identical' if diff == 0 else 'differ'})")
    res = {k: [] for k in mods}
    passes = max(1, 20 // a.copies)
    for _ in range(a.reps):
        for name, m in mods.items():
            t0 = time.thread_time()
            for _ in range(passes):
                for copy in packs[name]:
                    for p, (o, i), y in zip(copy, SHAPES, ys):
                        m.matmul(p, xs[i], y, 1)
            res[name].append((time.thread_time() - t0) / (passes * a.copies))
    macs = sum(o * i for o, i in SHAPES) * a.tokens
    for name, ts in res.items():
        ts.sort()
        print(f"{name} ({getattr(a, name.lower())}): min {ts[0] * 1e6:.1f} us  median {ts[len(ts) // 2] * 1e6:.1f} us "
              f"a pass over the shapes, {a.type}, {a.tokens} tokens ({macs / ts[0] / 1e9:.1f} GMAC/s at the min)")
    print(f"B / A: {res['B'][0] / res['A'][0]:.3f} (min), "
          f"{res['B'][len(res['B']) // 2] / res['A'][len(res['A']) // 2]:.3f} (median)")


if __name__ == "__main__":
    main()
