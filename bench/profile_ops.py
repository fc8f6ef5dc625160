#!/usr/bin/env python3
"""Where a forward's CPU time goes, per op, for any model (exclusive times: an op's own time
without the ops it calls, so the lines add up to the total).

    python bench/profile_ops.py MODEL [--pp 512] [--batch 8 --ctx 64] [-n 3] [-t 1]

MODEL: a GGUF path or a known name. Times one prefill of --pp tokens from empty and, with
--batch B, one batched decode step of B sequences of --ctx tokens; the fastest of -n runs.
At -t 1 the clock is the calling thread's CPU time (robust on a shared machine); user and
system CPU time of the whole process are printed too (system time is page faults of fresh
buffers, mostly). Ops are wrapped at the Python level: weight matmuls by tensor name (the
layer number dropped), the MoE's pieces, the DeltaNet kernel, attention, norms.
"""
from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's llmcore


class Profiler:
    """Exclusive time per label: a wrapped call's time minus that of the wrapped calls inside it."""

    def __init__(self, clock):
        self.clock = clock
        self.acc = collections.defaultdict(int)
        self.cnt = collections.Counter()
        self.stack = []  # child time accumulated per open call

    def clear(self):
        self.acc.clear()
        self.cnt.clear()

    def run(self, label, f, *args, **kw):
        self.stack.append(0)
        t0 = self.clock()
        try:
            return f(*args, **kw)
        finally:
            dt = self.clock() - t0
            child = self.stack.pop()
            self.acc[label] += dt - child
            self.cnt[label] += 1
            if self.stack:
                self.stack[-1] += dt

    def wrap(self, obj, name, label):
        """Wrap obj.name; label: a string or a function of the call's arguments."""
        f = getattr(obj, name)
        prof = self

        def w(*args, **kw):
            lab = label(*args, **kw) if callable(label) else label
            return prof.run(lab, f, *args, **kw)
        setattr(obj, name, w)


def short(name: str) -> str:
    nm = name.split(".", 2)[-1] if name.startswith("blk.") else name
    return "+".join(p.split(".")[-2] if p.count(".") else p for p in nm.split("+")) if "+" in nm else nm


class Proxy:
    """A kernel module whose functions are wrapped (modules' attributes are read-only)."""

    def __init__(self, mod):
        self._mod = mod

    def __getattr__(self, k):
        return getattr(self._mod, k)


def instrument(prof: Profiler):
    from llmcore import _kernels, nn, quant
    from llmcore.models import layers as L
    from llmcore.models import moe as M

    prof.wrap(quant.Linear, "__call__", lambda self, *a, **k: "lin " + short(self.name))
    mm = L.matmul_into
    L.matmul_into = lambda lin, x, y: prof.run("lin " + short(lin.name), mm, lin, x, y)
    for mod in list(sys.modules.values()):  # modules that imported matmul_into by name
        if getattr(mod, "__name__", "").startswith("llmcore.models") and getattr(mod, "matmul_into", None) is mm:
            mod.matmul_into = L.matmul_into
    prof.wrap(quant.ExpertLinear, "grouped", lambda self, *a, **k: "experts " + short(self.name).replace("+", "/"))
    prof.wrap(M.MoE, "route", "moe route (router + top-k)")
    prof.wrap(M.MoE, "experts", "moe gather + act")
    prof.wrap(M.MoE, "__call__", "moe (rest: shared gate, adds)")
    prof.wrap(M, "group_by_expert", "moe group_by_expert")
    prof.wrap(M, "combine", "moe combine")
    prof.wrap(L.GatedFFN, "__call__", "ffn (rest: act)")
    prof.wrap(L.Embedding, "__call__", "embedding")
    prof.wrap(L, "rms_norm_into", "rms_norm (+add)")
    for fn in ("rms_norm", "add_rms_norm", "rope", "silu_mul", "attention"):
        if hasattr(nn, fn):
            prof.wrap(nn, fn, fn)
    if _kernels.ENABLED:
        from llmcore.models import deltanet as DN
        if DN._dn is not None:
            p, gdn = Proxy(DN._dn), DN._dn.gated_delta_net
            p.gated_delta_net = lambda *a, **k: prof.run("deltanet kernel", gdn, *a, **k)
            DN._dn = p
        prof.wrap(DN.GatedDeltaNet, "__call__", "deltanet (rest)")
        att = _kernels.load("attention")
        p = Proxy(att)
        for fn in ("qkv_post", "attention"):
            if hasattr(att, fn):
                setattr(p, fn, (lambda f, lab: (lambda *a, **k: prof.run(lab, f, *a, **k)))(getattr(att, fn), "attn " + fn))
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("llmcore") and getattr(mod, "_attention", None) is att:
                mod._attention = p
    try:
        from llmcore.models import gated_attention as GA
        prof.wrap(GA.GatedAttention, "__call__", "attention layer (rest: gate)")
    except ImportError:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--pp", type=int, default=512, help="prefill tokens (0: none)")
    ap.add_argument("--ub", type=int, default=512, help="prefill tokens per forward call")
    ap.add_argument("--batch", type=int, default=0, help="sequences of a decode step (0: none)")
    ap.add_argument("--ctx", type=int, default=64, help="context of each decode sequence")
    ap.add_argument("-n", type=int, default=3)
    a = ap.parse_args(argv)
    from llmcore import threads
    from llmcore.models import load_model
    from llmcore.pull import resolve_model

    threads.set_num_threads(a.threads)
    path = a.model if os.path.exists(a.model) else str(resolve_model(a.model))
    model = load_model(path)
    clock = time.thread_time_ns if a.threads == 1 else time.perf_counter_ns
    prof = Profiler(clock)
    instrument(prof)
    rng = np.random.default_rng(0)
    nv = model.n_vocab
    prompt = rng.integers(300, nv, max(a.pp, 1)).astype(np.int32)
    ctxs = [rng.integers(300, nv, a.ctx + 1).astype(np.int32) for _ in range(a.batch)]

    def one(kind):
        if kind == "prefill":
            sts = [model.new_state()]
        else:
            sts = [model.new_state() for _ in ctxs]
            for st, p in zip(sts, ctxs):
                model.forward([(st, p[:a.ctx])])
        prof.clear()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0, w0 = clock(), time.perf_counter_ns()
        if kind == "prefill":
            for i in range(0, a.pp, a.ub):
                model.forward([(sts[0], prompt[i:i + a.ub])])
        else:
            np.argmax(model.forward([(st, p[a.ctx:]) for st, p in zip(sts, ctxs)]), axis=1)
        tot, wall = clock() - t0, time.perf_counter_ns() - w0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        for st in sts:
            st.release()
        return tot, wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, dict(prof.acc), dict(prof.cnt)

    kinds = (["prefill"] if a.pp else []) + (["decode"] if a.batch else [])
    for kind in kinds:
        one(kind)  # warm-up
        best = min((one(kind) for _ in range(a.n)), key=lambda r: r[0])
        tot, wall, ut, stm, acc, cnt = best
        what = f"pp {a.pp} (ubatch {a.ub})" if kind == "prefill" else f"{a.batch} sequences at ctx {a.ctx}"
        print(f"\n== {kind}: {what}, {a.threads} thread(s): {tot / 1e6:.1f} ms "
              f"(wall {wall / 1e6:.1f} ms; process user {ut * 1e3:.0f} ms, system {stm * 1e3:.0f} ms)")
        other = tot - sum(acc.values())
        for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
            print(f"  {k:36s} {v / 1e6:8.2f} ms  {100 * v / tot:5.1f}%  x{cnt[k]}")
        print(f"  {'(python / other)':36s} {other / 1e6:8.2f} ms  {100 * other / tot:5.1f}%")


if __name__ == "__main__":
    main()
