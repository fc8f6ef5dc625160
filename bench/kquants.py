#!/usr/bin/env python3
"""K-quant / MXFP4 kernel speed: raw GGUF layout vs the repacked 16-row layout, per shape.

    python bench/kquants.py [-t 1] [-n 1] [--reps 200] [--types Q4_K,Q6_K] [--shapes 640x1024,...]

Min-of-reps (the machine is shared), GB/s of weight bytes read and the grouped expert kernel
vs one call per expert. Defaults are the gemma-3-270m decode shapes and the tiny-qwen3moe
output projection (49152 x 256 Q4_K).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]  # this checkout's llmcore; the tests' weight makers

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

from llmcore._kernels import kquants as kq  # noqa: E402


def rand_weight(rng, qt, rows, cols):
    from test_kquants import rand_weight as rw

    return rw(rng, qt, rows, cols)


def best(f, reps):
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        t = min(t, time.perf_counter() - t0)
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", "--tokens", type=int, default=1)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K,MXFP4")
    ap.add_argument("--shapes", default="640x1024,640x2048,2048x640,49152x256")
    ap.add_argument("--experts", type=int, default=8, help="grouped: active experts (0: skip)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"kquants simd {kq.SIMD_LEVEL}, {a.threads} thread(s), {a.tokens} token(s), min of {a.reps}")
    print("| type | rows x cols | raw us | repacked us | raw GB/s | repacked GB/s | speedup |")
    print("|---|---|---|---|---|---|---|")
    for tn in a.types.split(","):
        qt = QT[tn]
        bs, _ = gguf.GGML_QUANT_SIZES[qt]
        for sh in a.shapes.split(","):
            rows, cols = (int(v) for v in sh.split("x"))
            if cols % (256 if qt != QT.MXFP4 else 32):
                continue
            w = rand_weight(rng, qt, rows, cols)
            x = rng.standard_normal((a.tokens, cols)).astype(np.float32)
            y = np.empty((a.tokens, rows), np.float32)
            res = []
            for repack in (False, True):
                p = kq.pack(w, int(qt), repack=repack)
                reps = max(3, min(a.reps, int(2e8 / max(1, p.nbytes))))
                dt = best(lambda: kq.matmul(p, x, y, a.threads), reps)
                res.append((dt, p.nbytes))
            (t0, b0), (t1, b1) = res
            print(f"| {tn} | {rows}x{cols} | {t0 * 1e6:.1f} | {t1 * 1e6:.1f} | {b0 / t0 / 1e9:.1f} | "
                  f"{b1 / t1 / 1e9:.1f} | {t0 / t1:.2f}x |", flush=True)
    if a.experts:
        print()
        print("| type | experts x (rows x cols), tokens/expert | per-expert calls us | grouped us |")
        print("|---|---|---|---|")
        for tn in a.types.split(","):
            qt = QT[tn]
            rows, cols = 768, 512
            packs = [kq.pack(rand_weight(rng, qt, rows, cols), int(qt)) for _ in range(a.experts)]
            for per in (1, 16):
                offs = np.arange(0, (a.experts + 1) * per, per, dtype=np.int64)
                x = rng.standard_normal((int(offs[-1]), cols)).astype(np.float32)
                y = np.empty((len(x), rows), np.float32)

                def loop():
                    for i, p in enumerate(packs):
                        kq.matmul(p, x[offs[i]:offs[i + 1]], y[offs[i]:offs[i + 1]], a.threads)

                t0 = best(loop, a.reps)
                t1 = best(lambda: kq.matmul_grouped(packs, offs, x, y, a.threads), a.reps)
                print(f"| {tn} | {a.experts} x ({rows}x{cols}), {per} | {t0 * 1e6:.1f} | {t1 * 1e6:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
