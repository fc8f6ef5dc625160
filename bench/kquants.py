#!/usr/bin/env python3
"""Speed of the repacked weight kernels (K-quants and MXFP4: pyx/kquants.pyx; IQ4_NL and
IQ4_XS: pyx/iquants.pyx): raw GGUF layout vs the repacked 16-row layout, per shape, and
llama.cpp's matmul of the same weights and tokens in the same run.

    python bench/kquants.py [-t 1] [-n 1] [--reps 200] [--types Q4_K,IQ4_XS] [--shapes 640x1024,...]

Min-of-reps (the machine is shared), GB/s of weight bytes read and the grouped expert kernel
vs one call per expert. Defaults are the gemma-3-270m decode shapes and the tiny-qwen3moe
output projection (49152 x 256 Q4_K). The llama.cpp column is its ggml graph for one
matmul (tests/ggml_ops.py: the ggml library of llama-cpp-python, weights not repacked,
activations quantized inside, like llama.cpp's own runs); "-" where it is not installed.
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

from llmcore import quant  # noqa: E402


def rand_weight(rng, qt, rows, cols):
    if qt in (QT.IQ4_NL, QT.IQ4_XS):
        from test_iquants import rand_weight as rw
    else:
        from test_kquants import rand_weight as rw
    return rw(rng, qt, rows, cols)


def best(f, reps):
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        t = min(t, time.perf_counter() - t0)
    return t


def llama_cpp_time(w, qt, x, n_threads, reps):
    """llama.cpp's time for y = x @ W.T, or None where llama-cpp-python is missing."""
    import ggml_ops

    if ggml_ops.available() is not None:
        return None
    mm = ggml_ops.MulMat(w, int(qt), len(x), n_threads)
    mm.set_x(x)
    return best(mm.run, reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", "--tokens", type=int, default=1)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K,MXFP4,IQ4_NL,IQ4_XS")
    ap.add_argument("--shapes", default="640x1024,640x2048,2048x640,49152x256")
    ap.add_argument("--experts", type=int, default=8, help="grouped: active experts (0: skip)")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp's column")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    levels = sorted({quant.kernel_for(QT[t]).SIMD_LEVEL for t in a.types.split(",")})
    print(f"simd {'/'.join(levels)}, {a.threads} thread(s), {a.tokens} token(s), min of {a.reps}")
    print("| type | rows x cols | raw us | repacked us | raw GB/s | repacked GB/s | speedup | llama.cpp us |")
    print("|---|---|---|---|---|---|---|---|")
    for tn in a.types.split(","):
        qt = QT[tn]
        mod = quant.kernel_for(qt)
        bs, _ = gguf.GGML_QUANT_SIZES[qt]
        for sh in a.shapes.split(","):
            rows, cols = (int(v) for v in sh.split("x"))
            if cols % (256 if qt not in (QT.MXFP4, QT.IQ4_NL) else 32):
                continue
            w = rand_weight(rng, qt, rows, cols)
            x = rng.standard_normal((a.tokens, cols)).astype(np.float32)
            y = np.empty((a.tokens, rows), np.float32)
            res = []
            for repack in (False, True):
                p = mod.pack(w, int(qt), repack=repack)
                reps = max(3, min(a.reps, int(2e8 / max(1, p.nbytes))))
                dt = best(lambda: mod.matmul(p, x, y, a.threads), reps)
                res.append((dt, p.nbytes))
            (t0, b0), (t1, b1) = res
            tl = None if a.no_llama else llama_cpp_time(w, qt, x, a.threads, reps)
            print(f"| {tn} | {rows}x{cols} | {t0 * 1e6:.1f} | {t1 * 1e6:.1f} | {b0 / t0 / 1e9:.1f} | "
                  f"{b1 / t1 / 1e9:.1f} | {t0 / t1:.2f}x | {'-' if tl is None else f'{tl * 1e6:.1f}'} |", flush=True)
    if a.experts:
        print()
        print("| type | experts x (rows x cols), tokens/expert | per-expert calls us | grouped us |")
        print("|---|---|---|---|")
        for tn in a.types.split(","):
            qt = QT[tn]
            mod = quant.kernel_for(qt)
            rows, cols = 768, 512
            packs = [mod.pack(rand_weight(rng, qt, rows, cols), int(qt)) for _ in range(a.experts)]
            for per in (1, 16):
                offs = np.arange(0, (a.experts + 1) * per, per, dtype=np.int64)
                x = rng.standard_normal((int(offs[-1]), cols)).astype(np.float32)
                y = np.empty((len(x), rows), np.float32)

                def loop():
                    for i, p in enumerate(packs):
                        mod.matmul(p, x[offs[i]:offs[i + 1]], y[offs[i]:offs[i + 1]], a.threads)

                t0 = best(loop, a.reps)
                t1 = best(lambda: mod.matmul_grouped(packs, offs, x, y, a.threads), a.reps)
                print(f"| {tn} | {a.experts} x ({rows}x{cols}), {per} | {t0 * 1e6:.1f} | {t1 * 1e6:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
