#!/usr/bin/env python3
"""Prefill of short prompts (a chat turn's 30-200 tokens): llmcore's fused step against its
layer-by-layer path, and llama.cpp, in the same run.

    python bench/short_prompt.py [-m smollm2] [-t 2] [--tokens 32 66 100 128 200] [--reps 5]

A prompt of at most step.TOKENS_MAX tokens runs in the fused step (one parallel region for
all layers); a longer one layer by layer (a few hundred kernel calls, each waking the other
threads). Each figure is the best of --reps prefills of a new sequence (random tokens);
llama.cpp (llama-cpp-python, a child process with its own OpenMP settings) prefills the same
number of tokens into a cleared context.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's llmcore


def best_prefill_ms(model, n: int, reps: int, rng) -> float:
    out = []
    for _ in range(reps):
        st = model.new_state()
        toks = rng.integers(100, min(model.n_vocab, 30000), n).astype(np.int32)
        t = time.perf_counter()
        model.forward([(st, toks)])
        out.append(time.perf_counter() - t)
        st.release()
    return min(out) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs="+", default=[32, 66, 100, 128, 200])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-peer", action="store_true", help="llmcore only")
    a = ap.parse_args(argv)

    from llmcore import threads
    from llmcore.loader import load_gguf
    from llmcore.models import base
    from llmcore.pull import resolve_model

    threads.set_num_threads(a.threads)
    path = resolve_model(a.model)
    model = load_gguf(path).model
    limit = base.DECODE_STEP_TOKENS
    rng = np.random.default_rng(0)
    best_prefill_ms(model, 16, 2, rng)  # warm-up
    rows = []
    for n in a.tokens:
        fused, layered = [], []
        for _ in range(2):  # the two paths alternate, so they see the same load
            fused.append(best_prefill_ms(model, n, a.reps, rng))
            base.DECODE_STEP_TOKENS = 0
            try:
                layered.append(best_prefill_ms(model, n, a.reps, rng))
            finally:
                base.DECODE_STEP_TOKENS = limit
        row = {"n": n, "fused": min(fused) if n <= limit else None, "layered": min(layered)}
        if not a.no_peer:
            from _peer_llamacpp import measure_in_subprocess

            row["llama"] = n / max(measure_in_subprocess(str(path), a.threads, n, 1, reps=a.reps)["pp"]) * 1e3
        rows.append(row)
        print(f"{n} tokens: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items() if k != "n" and v),
              file=sys.stderr, flush=True)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"\n{path.name}, {a.threads} threads, best of {a.reps}; fused step up to {limit} tokens; load {load}")
    print("| tokens | llmcore as run (ms) | layer by layer (ms) | llama.cpp (ms) | llama.cpp / llmcore |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        run = r["fused"] if r["fused"] is not None else r["layered"]
        llama = r.get("llama")
        print(f"| {r['n']} | {run:.1f}{'' if r['fused'] is not None else ' (layer by layer)'} | {r['layered']:.1f} | "
              + (f"{llama:.1f} | {llama / run:.2f}x |" if llama else "- | - |"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
