"""Micro-benchmark of the quantized Linear kernels on SmolLM2-135M shapes.

Prints GB/s (weight bytes read) for decode matvecs (n=1) and GFLOP/s for prefill matmuls,
plus the matmul-only tokens/s bound for a SmolLM2-135M Q4_1 forward (30 layers + Q8_0 head).
These reuse one weight, which then sits in cache; ``--stream`` measures what a decode step
sees instead: matvecs over copies of each weight that add up to --stream-mb (more than the
caches), next to the memory read probe (bench/membw.pyx), both in CPU time at --threads 1.

    python bench/matmul.py [--threads 2] [--n 512] [--type Q4_1] [--stream]
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


def make_raw(qt, out, inp, seed=0) -> np.ndarray:
    """GGUF bytes (out, row bytes) of a random weight: gguf-py's quantizer, random blocks for
    the K-quants (gguf-py has no quantizer for them)."""
    rng = np.random.default_rng(seed)
    if qt in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
        from test_kquants import rand_weight

        return rand_weight(rng, qt, out, inp)
    w = rng.standard_normal((out, inp)).astype(np.float32)
    return np.ascontiguousarray(gguf.quants.quantize(w, qt)).view(np.uint8).reshape(out, -1)


def make_linear(qt, out, inp, seed=0, raw=None):
    raw = make_raw(qt, out, inp, seed) if raw is None else raw
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


# decode matvec shapes of the two real models: SmolLM2 (Q4_1, Q8_0 head), gemma-3-270m
# (Q5_0 / Q8_0 projections, Q4_K / Q6_K down and output projections, Q8_0 head)
STREAM = [("Q4_1", 3072, 576), ("Q4_1", 576, 1536), ("Q8_0", 49152, 576), ("Q5_0", 4096, 640),
          ("Q8_0", 256, 640), ("Q4_K", 640, 1024), ("Q6_K", 640, 2048), ("Q8_0", 262144, 640)]


def stream(a) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from speed import load_membw

    membw = load_membw()
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    buf = np.ones(512 * 1024 * 1024 // 8, dtype=np.uint64)

    def probe():
        best = float("inf")
        for _ in range(3):
            t0 = clock()
            membw.read_xor(buf, a.threads)
            best = min(best, clock() - t0)
        return buf.nbytes / best / 1e9

    print(f"streaming decode matvecs, {a.threads} thread(s), {'CPU' if a.threads == 1 else 'wall'} time; "
          f"read probe {probe():.1f} GB/s")
    for name, out, inp in STREAM:
        qt = QT[name]
        raw = make_raw(qt, out, inp)
        one = make_linear(qt, out, inp, raw=raw)
        n_copies = max(1, int(a.stream_mb * 1e6 // one.nbytes))
        lins = [one] + [make_linear(qt, out, inp, raw=raw.copy()) for _ in range(n_copies - 1)]
        x = np.random.default_rng(1).standard_normal((1, inp)).astype(np.float32)
        y = np.empty((1, out), np.float32)
        best = float("inf")
        for _ in range(3):
            t0 = clock()
            for lin in lins:
                lin(x, out=y)
            best = min(best, clock() - t0)
        gbs = sum(lin.nbytes for lin in lins) / best / 1e9
        print(f"{name:5s} {out:6d}x{inp:<5d} x{n_copies:<4d} {gbs:6.1f} GB/s ({best / n_copies * 1e6:8.1f} us per call)"
              f" | probe {probe():.1f} GB/s", flush=True)
        del lins, one, raw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=512, help="prefill tokens")
    ap.add_argument("--type", default="Q4_1")
    ap.add_argument("--stream", action="store_true", help="streaming decode matvecs vs the read probe")
    ap.add_argument("--stream-mb", type=float, default=300.0)
    ap.add_argument("--prefetch", type=int, default=None,
                    help="bytes the weight kernels prefetch ahead (0: off; default: the kernels' own)")
    a = ap.parse_args()
    threads.set_num_threads(a.threads)
    from llmcore._kernels import kquants as _kq, quants as _q

    if a.prefetch is not None:
        _q._set_prefetch(a.prefetch)
        _kq._set_prefetch(a.prefetch)

    print(f"kernels: {_q.SIMD_LEVEL}{' + AMX tiles' if getattr(_q, 'AMX', False) else ''}")
    if a.stream:
        stream(a)
        return
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
