#!/usr/bin/env python3
"""Prompt processing and generation speed: llmcore vs llama.cpp, same model, same threads.

    python bench/speed.py [-m smollm2] [-t 2] [--pp 512] [--tg 128] [--reps 5]
    python bench/speed.py --busy [-m smollm2] [-t 2] [--tg 128] [--reps 5]

The two engines alternate rep by rep, so they see the same machine load; llama.cpp runs in a
child process with its own OpenMP settings (llmcore makes its OpenMP threads sleep at
barriers; llama.cpp's default is to spin, which is what its users get). Reports
medians over --reps runs, the ratio llmcore / llama.cpp, and generation against the
memory-bandwidth bound (bytes of weights read per token / measured read bandwidth).

--busy: generation on a shared machine. One competing busy process (a Python busy loop)
runs throughout; each rep times tg at 1 thread and at -t threads (decode steps choosing
their thread count by measured speed, as the server's engine does), for both engines
(llama.cpp at 1 and -t threads, its own default wait policy). On a 2-core machine -t 2 must
stay at least as fast as 1 thread: a thread descheduled at a barrier must not stall the step.
llmcore also runs at -t threads forced on every step, and the decode step times of its three
kinds of run are summarized (mean, median, 99th percentile): what the thread choice weighs.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
# this checkout's llmcore (not whichever one is installed), and bench/ for the helpers
sys.path[:0] = [os.path.dirname(BENCH), BENCH]

from _peer_llamacpp import available, measure_in_subprocess  # noqa: E402


def load_probe(name: str):
    """bench/<name>.pyx (membw, int8peak), compiled by pyximport on first use (needs Cython
    and a C compiler with OpenMP: pip install -e .[bench])."""
    import importlib

    import pyximport

    importers = pyximport.install(language_level=3)
    try:
        return importlib.import_module(name)
    finally:
        pyximport.uninstall(*importers)


def load_membw():
    return load_probe("membw")


def membw_gbs(n_threads: int, reps: int = 5) -> float:
    membw = load_membw()
    buf = np.ones(512 * 1024 * 1024 // 8, dtype=np.uint64)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        membw.read_xor(buf, n_threads)
        best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best / 1e9


def core_round_trip_ns(n: int = 20000, reps: int = 3) -> float:
    """The core-to-core probe (bench/membw.pyx): a cache line's round trip between the two
    threads' cores in ns, median of reps (-1.0 without two threads)."""
    membw = load_membw()
    return float(np.median([membw.core_round_trip_ns(n) for _ in range(reps)]))


def int8_gmacs(n_threads: int, reps: int = 5, iters: int = 2_000_000) -> float:
    """The int8 multiply-add probe (bench/int8peak.pyx) at n_threads: GMAC/s, best of reps."""
    int8peak = load_probe("int8peak")
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        macs = int8peak.int8_macs(iters, n_threads)
        best = max(best, macs / (time.perf_counter() - t0) / 1e9)
    return best


def weight_bytes_per_token(path) -> int:
    """Bytes of weights one decode step streams: every tensor, except that the embedding
    table costs one row unless it doubles as the output projection (tied)."""
    from llmcore.gguf_file import GGUFFile

    g = GGUFFile(path)
    total = sum(t.nbytes for t in g.tensors.values())
    if "output.weight" in g.tensors and "token_embd.weight" in g.tensors:
        total -= g.tensors["token_embd.weight"].nbytes
    return total


def weight_macs_per_token(path) -> int:
    """Multiply-adds of one token's matmuls: every weight matrix's elements (the embedding
    table only where it doubles as the output projection: otherwise a lookup). Dense models;
    an MoE model's experts count whole, so there it is an upper bound."""
    from llmcore.gguf_file import GGUFFile

    g = GGUFFile(path)
    return sum(math.prod(int(d) for d in t.shape) for name, t in g.tensors.items()
               if len(t.shape) >= 2 and not (name == "token_embd.weight" and "output.weight" in g.tensors))


class LLMCore:
    def __init__(self, path, n_threads: int, ub: int = 512, **cfg):
        from llmcore import threads
        from llmcore.models import load_model

        threads.set_num_threads(n_threads)
        self.n_threads = n_threads
        # decode steps pick their thread count by measured speed, as the server's engine does
        self.adaptive = threads.AdaptiveThreads(n_threads)
        self.model = load_model(path, **cfg)
        self.path = path
        self.ub = ub
        self.steps_at: dict[int, int] = {}  # decode steps run at each thread count
        self.step_times: list[float] = []  # seconds of each decode step of the last generate

    def prefill(self, toks) -> float:
        from llmcore import threads

        threads.set_num_threads(self.n_threads)
        st = self.model.new_state()
        arr = np.asarray(toks, dtype=np.int32)
        t0 = time.perf_counter()
        for i in range(0, len(arr), self.ub):
            self.model.forward([(st, arr[i:i + self.ub])])
        dt = time.perf_counter() - t0
        st.release()
        return dt

    def generate(self, toks, n: int, n_threads: int | None = None) -> float:
        """Seconds for n greedy tokens after toks; n_threads fixes the thread count (default:
        chosen per step by measured speed, up to the model's threads)."""
        st = self.model.new_state()
        am = np.empty(1, dtype=np.int64)  # greedy: the argmax the step's head finds, as the engine takes it
        self.model.forward([(st, np.asarray(toks, dtype=np.int32))], argmax=am)
        t = int(am[0])
        from llmcore import threads

        self.step_times = []
        t0 = time.perf_counter()
        for _ in range(n):
            nt = self.adaptive.choose(1) if n_threads is None else n_threads
            self.steps_at[nt] = self.steps_at.get(nt, 0) + 1
            threads.set_num_threads(nt)
            ts = time.perf_counter()
            self.model.forward([(st, np.array([t], dtype=np.int32))], argmax=am)
            self.step_times.append(time.perf_counter() - ts)
            if n_threads is None:  # the choice learns from its own steps only, as in the engine
                self.adaptive.record(1, nt, self.step_times[-1])
            t = int(am[0])
        dt = time.perf_counter() - t0
        st.release()
        return dt

    def weight_bytes_per_token(self) -> int:
        return weight_bytes_per_token(self.path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens")
    ap.add_argument("--tg", type=int, default=128, help="generated tokens")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--busy", action="store_true",
                    help="generation at 1 and -t threads with one competing busy process")
    a = ap.parse_args(argv)
    if a.busy:
        return busy_main(a)

    from llmcore.pull import resolve_model

    path = str(resolve_model(a.model))
    rng = np.random.default_rng(0)
    mine = LLMCore(path, a.threads)
    n_vocab = mine.model.n_vocab
    prompt = rng.integers(100, min(n_vocab, 30000), a.pp).tolist()
    short = prompt[:16]
    why = None if not a.no_peer else "--no-peer"
    why = why or available()
    peer = why is None

    res = {"llmcore": {"pp": [], "tg": []}, "llama.cpp": {"pp": [], "tg": []}}
    # one warm-up each (page in the mmap, JIT-free but caches cold)
    mine.prefill(prompt[:64]); mine.generate(short, 4)
    for r in range(a.reps):
        res["llmcore"]["pp"].append(a.pp / mine.prefill(prompt))
        res["llmcore"]["tg"].append(a.tg / mine.generate(short, a.tg))
        if peer:
            got = measure_in_subprocess(path, a.threads, a.pp, a.tg)
            res["llama.cpp"]["pp"] += got["pp"]
            res["llama.cpp"]["tg"] += got["tg"]
        print(f"rep {r + 1}/{a.reps}: " + ", ".join(
            f"{k} pp {v['pp'][-1]:.1f} tg {v['tg'][-1]:.1f}" for k, v in res.items() if v["pp"]), flush=True)
    bw = membw_gbs(a.threads)
    bpt = mine.weight_bytes_per_token()
    bound = bw * 1e9 / bpt
    med = {k: {m: statistics.median(v[m]) for m in v} for k, v in res.items() if v["pp"]}
    print()
    print(f"model {os.path.basename(path)}, {a.threads} threads, pp{a.pp} / tg{a.tg}, median of {a.reps}")
    print(f"memory read bandwidth {bw:.1f} GB/s; weights read per token {bpt / 1e6:.1f} MB; "
          f"bound {bound:.0f} t/s")
    print(f"| engine | pp{a.pp} t/s | tg{a.tg} t/s | tg / bandwidth bound |")
    print("|---|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v['pp']:.1f} | {v['tg']:.1f} | {v['tg'] / bound:.2f} |")
    if "llama.cpp" in med:
        l, p = med["llmcore"], med["llama.cpp"]
        print(f"| llmcore / llama.cpp | {l['pp'] / p['pp']:.2f}x | {l['tg'] / p['tg']:.2f}x | |")
    else:
        print(f"(llama.cpp not measured: {why})")
    return 0


def busy_main(a) -> int:
    """--busy (see the module docstring)."""
    import subprocess

    from llmcore.pull import resolve_model

    path = str(resolve_model(a.model))
    mine = LLMCore(path, a.threads)
    rng = np.random.default_rng(0)
    short = rng.integers(100, min(mine.model.n_vocab, 30000), 16).tolist()
    why = "--no-peer" if a.no_peer else available()
    nts = sorted({1, a.threads})
    res = {(e, nt): [] for e in ("llmcore", "llama.cpp") for nt in nts}
    # llmcore's runs: 1 thread, -t threads chosen per step (the engine's way), -t forced
    kinds = [(1, 1), (a.threads, None)] + ([(a.threads, a.threads)] if a.threads > 1 else [])
    forced: list[float] = []
    steps: dict[str, list[float]] = {}
    mine.generate(short, 4)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        for r in range(a.reps):
            for nt, fix in (kinds if r % 2 == 0 else kinds[::-1]):  # alternate the order: same load for all
                tps = a.tg / mine.generate(short, a.tg, fix)
                label = f"{nt} thread{'s' if nt > 1 else ''}" + (" forced" if nt > 1 and fix else "")
                steps.setdefault(label, []).extend(mine.step_times)
                if nt > 1 and fix:
                    forced.append(tps)
                    continue
                res[("llmcore", nt)].append(tps)
            for nt in (nts if r % 2 == 0 else nts[::-1]):
                if why is None:
                    res[("llama.cpp", nt)] += measure_in_subprocess(path, nt, 16, a.tg)["tg"]
            print(f"rep {r + 1}/{a.reps}: " + ", ".join(
                f"{e} {nt}t tg {v[-1]:.1f}" for (e, nt), v in res.items() if v)
                + (f", llmcore {a.threads}t forced tg {forced[-1]:.1f}" if forced else ""), flush=True)
    finally:
        hog.terminate()
        hog.wait()
    print()
    print(f"model {os.path.basename(path)}, tg{a.tg}, one competing busy process, median of {a.reps}; "
          f"llmcore at {a.threads} threads chooses 1 or {a.threads} per step by measured speed "
          f"(decode steps per thread count, all runs: {dict(sorted(mine.steps_at.items()))})")
    print("| engine | " + " | ".join(f"tg{a.tg} {nt} thread{'s' if nt > 1 else ''} t/s" for nt in nts)
          + f" | {a.threads} threads / 1 thread |")
    print("|---" * (len(nts) + 2) + "|")
    for e in ("llmcore", "llama.cpp"):
        if not res[(e, 1)]:
            print(f"| {e} | not measured: {why} |")
            continue
        med = [statistics.median(res[(e, nt)]) for nt in nts]
        print(f"| {e} | " + " | ".join(f"{m:.1f}" for m in med) + f" | {med[-1] / med[0]:.2f}x |")
    if forced:
        one = statistics.median(res[("llmcore", 1)])
        print(f"| llmcore, {a.threads} threads on every step | | {statistics.median(forced):.1f} "
              f"| {statistics.median(forced) / one:.2f}x |")
    print()
    print("llmcore decode step times under the busy process, ms (all reps):")
    print("| run | steps | mean | median | 99th percentile |")
    print("|---|---:|---:|---:|---:|")
    for label, v in steps.items():
        ms = np.asarray(v) * 1e3
        print(f"| {label} | {len(ms)} | {ms.mean():.3f} | {np.median(ms):.3f} | {np.percentile(ms, 99):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
