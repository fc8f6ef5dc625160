"""Micro-benchmark of the quantized Linear kernels on SmolLM2-135M shapes.

Prints GB/s (weight bytes read) for decode matvecs (n=1) and GFLOP/s for prefill matmuls,
plus the matmul-only tokens/s bound for a SmolLM2-135M Q4_1 forward (30 layers + Q8_0 head).

    python bench/matmul.py [--threads 2] [--n 512] [--type Q4_1]
"""
from __future__ import annotations

import argparse
import time

import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as QT
import gguf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llmcore import quant, threads  # noqa: E402
from llmcore.gguf_file import Tensor  # noqa: E402

SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
# SmolLM2-135M: per layer q, k, v, o, gate, up, down (out, in); 30 layers; tied Q8_0 head
LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def make_linear(qt, out, inp, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out, inp)).astype(np.float32)
    raw = np.ascontiguousarray(gguf.quants.quantize(w, qt)).view(np.uint8).reshape(out, -1)
    return quant.Linear(Tensor(f"w{out}x{inp}", int(qt), (out, inp), raw))


def timeit(fn, min_time=0.3, min_reps=3):
    fn()
    reps, t0 = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        el = time.perf_counter() - t0
        if reps >= min_reps and el >= min_time:
            return el / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=512, help="prefill tokens")
    ap.add_argument("--type", default="Q4_1")
    a = ap.parse_args()
    threads.set_num_threads(a.threads)
    qt = QT[a.type]
    print(f"threads={a.threads} type={a.type} prefill n={a.n}")
    times1, timesn = {}, {}
    for out, inp in SHAPES + [s for s in LAYER if s not in SHAPES]:
        t = QT.Q8_0 if out == 49152 else qt
        lin = make_linear(t, out, inp)
        x1 = np.random.default_rng(1).standard_normal((1, inp)).astype(np.float32)
        xn = np.random.default_rng(2).standard_normal((a.n, inp)).astype(np.float32)
        y1 = np.empty((1, out), np.float32)
        yn = np.empty((a.n, out), np.float32)
        t1 = timeit(lambda: lin(x1, out=y1))
        tn = timeit(lambda: lin(xn, out=yn), min_reps=2)
        times1[(out, inp)], timesn[(out, inp)] = t1, tn
        if (out, inp) in SHAPES:
            print(f"{t.name:5s} {out:6d}x{inp:<5d} matvec {t1 * 1e6:8.1f} us {lin.nbytes / t1 / 1e9:6.1f} GB/s"
                  f" | prefill {tn * 1e3:7.2f} ms {2 * a.n * out * inp / tn / 1e9:6.1f} GFLOP/s")
    dec = 30 * sum(times1[s] for s in LAYER) + times1[(49152, 576)]
    pre = (30 * sum(timesn[s] for s in LAYER) + timesn[(49152, 576)]) / a.n
    print(f"SmolLM2-135M matmuls only: decode {1 / dec:6.1f} t/s, prefill {1 / pre:6.1f} t/s"
          f" (llama.cpp full model, 2 threads: ~230 / ~320)")


if __name__ == "__main__":
    main()
