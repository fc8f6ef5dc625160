#!/usr/bin/env python3
"""Per-op CPU time of one SmolLM2 decode step and one prefill (min over N runs).

    python bench/profile_step.py [-t 1] [--ctx 128] [--pp 512] [-n 20] [--batch B] [--verify K]

--batch B times a batched decode step: B sequences of --ctx tokens each advance one token.
--verify K times a speculative verify step instead: K drafted tokens and the last sampled
one (K+1 rows, every position's logits, each with a one-token decode's bits); --no-lanes
runs its attention rows through the rows kernel instead of the lanes form (A/B).
A model whose decode steps run fused (pyx/step.pyx, one kernel call) reports that call's
phases instead of per-op times (thread 0's wall time up to the end of each phase;
LLMCORE_FUSED_STEP=0 times the layer-by-layer path).

Times with the calling thread's CPU clock (robust to a loaded machine at -t 1); at -t 2
the wall clock is reported too. Ops are wrapped at the Python level (nn.*, Linear.__call__
by weight name, the head), so the remainder is Python overhead of the layer code.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's llmcore


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=128, help="context length before the decode step")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--batch", type=int, default=1, help="sequences in the decode step")
    ap.add_argument("--verify", type=int, default=0,
                    help="K: the step is a speculative verify of K drafted tokens (K+1 rows, every logit)")
    ap.add_argument("-ctk", "--cache-type", default="f16", help="KV cache type (f16, q8_0, q4_0, f32)")
    ap.add_argument("--no-lanes", action="store_true",
                    help="verify rows through the rows kernel, not its lanes form (same bits; A/B)")
    a = ap.parse_args(argv)
    if a.no_lanes:
        from llmcore import _kernels

        for mod in ("attention", "step"):
            _kernels.load(mod)._set_lanes_min_rows(2**31 - 1)
    from llmcore import _kernels, nn, quant, threads
    from llmcore.models import load_model
    from llmcore.models import layers as L
    from llmcore.pull import resolve_model

    threads.set_num_threads(a.threads)
    model = load_model(str(resolve_model(a.model)), kv_type=a.cache_type)
    clock = time.thread_time_ns if a.threads == 1 else time.perf_counter_ns
    acc = collections.defaultdict(int)
    cnt = collections.Counter()

    def wrap(obj, name, label=None):
        f = getattr(obj, name)

        def w(*args, **kw):
            t0 = clock()
            try:
                return f(*args, **kw)
            finally:
                k = label or name
                acc[k] += clock() - t0
                cnt[k] += 1
        setattr(obj, name, w)

    for fn in ("rms_norm", "add_rms_norm", "rope", "silu_mul", "kv_store", "attention"):
        if hasattr(nn, fn):
            wrap(nn, fn)
    if _kernels.ENABLED:  # kernels called directly by the layers' fused decode path
        attention, activations = _kernels.load("attention"), _kernels.load("activations")
        wrap(attention, "qkv_post")
        wrap(activations, "act_rows")
        wrap(attention, "attention", "attention (kernel)")
        quants = _kernels.load("quants")
        wrap(quants, "matmul_glu", "ffn gate+up+act (matmul_glu)")
    if hasattr(L, "rms_norm_into"):
        wrap(L, "rms_norm_into", "rms_norm (+add)")
    if hasattr(L, "post_add_norm_into"):
        wrap(L, "post_add_norm_into", "rms_norm (post+add+pre)")
    if hasattr(L, "matmul_into"):
        mm = L.matmul_into

        def mmw(lin, x, y):
            t0 = clock()
            try:
                return mm(lin, x, y)
            finally:
                nm = lin.name.split(".", 2)[-1] if lin.name.startswith("blk.") else lin.name
                nm = "+".join(p.split(".")[-2] for p in nm.split("+")) if "+" in nm else nm
                acc["lin " + nm] += clock() - t0
                cnt["lin " + nm] += 1
        L.matmul_into = mmw
    lin_call = quant.Linear.__call__

    def lin(self, x, out=None):
        t0 = clock()
        try:
            return lin_call(self, x, out)
        finally:
            nm = self.name.split(".", 2)[-1] if self.name.startswith("blk.") else self.name
            nm = "+".join(p.split(".")[-2] for p in nm.split("+")) if "+" in nm else nm
            acc["lin " + nm] += clock() - t0
            cnt["lin " + nm] += 1
    quant.Linear.__call__ = lin
    emb = L.Embedding.__call__

    def embw(self, ids):
        t0 = clock()
        try:
            return emb(self, ids)
        finally:
            acc["embedding"] += clock() - t0
            cnt["embedding"] += 1
    L.Embedding.__call__ = embw

    step = model.decode_step()
    if step is not None:
        step_kernel = _kernels.load("step")
        step.prof = np.zeros(len(step_kernel.PHASES))
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 30000, max(a.pp, a.ctx + 1 + a.verify)).astype(np.int32)
    # distinct contexts per sequence of a batched step
    prompts = [prompt] + [rng.integers(100, 30000, a.ctx + 1 + a.verify).astype(np.int32) for _ in range(a.batch - 1)]

    def run(kind):
        best = None
        for _ in range(a.n if kind == "decode" else max(2, a.n // 5)):
            sts = [model.new_state() for _ in (prompts if kind == "decode" else prompts[:1])]
            if kind == "decode":
                for st, p in zip(sts, prompts):
                    model.forward([(st, p[: a.ctx])])
            acc.clear(); cnt.clear()
            if step is not None:
                step.prof[:] = 0
            t0, w0 = clock(), time.perf_counter_ns()
            if kind == "decode" and a.verify:
                lg = model.forward([(st, p[a.ctx:a.ctx + a.verify + 1]) for st, p in zip(sts, prompts)],
                                   n_logits=[a.verify + 1] * len(sts))
                np.argmax(lg, axis=1).tolist()
            elif kind == "decode":
                lg = model.forward([(st, p[a.ctx:a.ctx + 1]) for st, p in zip(sts, prompts)])
                np.argmax(lg, axis=1).tolist()
            else:
                model.forward([(sts[0], prompt[: a.pp])])
            tot, wall = clock() - t0, time.perf_counter_ns() - w0
            if step is not None and kind == "decode":
                for name, ns in zip(step_kernel.PHASES, step.prof):
                    acc["step: " + name] += int(ns)
                    cnt["step: " + name] += 1
            for st in sts:
                st.release()
            if best is None or tot < best[0]:
                best = (tot, wall, dict(acc), dict(cnt))
        tot, wall, ac, cn = best
        what = (f"ctx {a.ctx}, {a.batch} sequence(s)" + (f", verify of {a.verify} drafted" if a.verify else "")
                if kind == "decode" else f"pp {a.pp}")
        print(f"\n== {kind} ({what}), "
              f"{a.threads} thread(s): total {tot / 1e6:.2f} ms (wall {wall / 1e6:.2f} ms)")
        other = tot - sum(ac.values())
        for k, v in sorted(ac.items(), key=lambda kv: -kv[1]):
            print(f"  {k:28s} {v / 1e6:8.3f} ms  {100 * v / tot:5.1f}%  x{cn[k]}")
        print(f"  {'(python / other)':28s} {other / 1e6:8.3f} ms  {100 * other / tot:5.1f}%")

    run("decode")
    if a.batch == 1 and a.pp > 0:  # (--pp 0: the decode step only)
        run("prefill")


if __name__ == "__main__":
    main()
