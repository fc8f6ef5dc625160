#!/usr/bin/env python3
"""Speed at depth: prefill of a long prompt and generation behind it, llmcore vs llama.cpp.

    python bench/depth.py [-m smollm2] [-t 2] [-d 16384] [--tg 32] [--reps 3] [--peer-fa auto]

What llama-bench's ``-d`` measures, on one sequence, from an empty cache each rep:

- ``pp{d}``: prefill of d prompt tokens in ubatches of --ub (512) tokens, t/s over the
  whole prompt (attention cost grows with the position, so this is the long-prompt figure);
- ``pp{ub} @ d-{ub}``: the last ubatch of that prefill alone (llama-bench ``pp512 @ d``);
- ``tg{n} @ d``: n greedy tokens generated after the d-token prompt.

The two engines alternate rep by rep so they see the same machine load; llama.cpp runs in
a child process (bench/_peer_llamacpp.py) with its own OpenMP settings and flash attention
as --peer-fa says (auto: llama.cpp's default, which turns it on for the CPU; both: off and
on in turn, each row reported). Both engines' process CPU time per phase is reported too (on
a shared machine wall clock can lie: at -t 1 tokens per CPU-second is what the work costs
whatever else runs; at more threads llama.cpp's spinning threads count in its CPU time).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
# this checkout's llmcore (not whichever one is installed), and bench/ for the helpers
sys.path[:0] = [os.path.dirname(BENCH), BENCH]

from _peer_llamacpp import available, measure_depth_in_subprocess  # noqa: E402


def prompt_tokens(n: int, n_vocab: int, seed: int = 0) -> list[int]:
    """The prompt both engines see: n random ids (the same as the peer's, same seed)."""
    return np.random.default_rng(seed).integers(100, min(n_vocab, 30000), n).tolist()


class LLMCoreDepth:
    def __init__(self, path: str, n_threads: int, depth: int, tg: int, ub: int, kv_type: str):
        from llmcore import threads
        from llmcore.models import load_model

        threads.set_num_threads(n_threads)
        self.n_threads = n_threads
        self.model = load_model(path, kv_type=kv_type)
        # the K/V pools sized for the run up front, as the server's memory plan sizes them for
        # its context and llama.cpp for n_ctx: an unlimited pool doubles by copying when it
        # fills (at a 16384-token prompt, on the first generated token: ~0.3 s inside tg32)
        for pool in self.model.pools.values():
            pool.max_blocks = pool.blocks_for(depth + tg) + 2
        self.ub = ub

    def run(self, toks: list[int], n_gen: int) -> dict:
        """One rep: prefill (per-ubatch times), then n_gen greedy steps."""
        from llmcore import threads

        threads.set_num_threads(self.n_threads)
        st = self.model.new_state()
        arr = np.asarray(toks, dtype=np.int32)
        chunks = []
        c0, t0 = time.process_time(), time.perf_counter()
        logits = None
        for i in range(0, len(arr), self.ub):
            ts = time.perf_counter()
            logits = self.model.forward([(st, arr[i:i + self.ub])])
            chunks.append(time.perf_counter() - ts)
        pp_wall, pp_cpu = time.perf_counter() - t0, time.process_time() - c0
        t = int(np.argmax(logits[0]))
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n_gen):
            logits = self.model.forward([(st, np.array([t], dtype=np.int32))])
            t = int(np.argmax(logits[0]))
        tg_wall, tg_cpu = time.perf_counter() - t0, time.process_time() - c0
        st.release()
        last = min(self.ub, len(arr))
        return {"pp": len(arr) / pp_wall, "pp_last": last / chunks[-1], "tg": n_gen / tg_wall,
                "pp_cpu": len(arr) / pp_cpu, "tg_cpu": n_gen / tg_cpu}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-d", "--depth", type=int, default=16384, help="prompt tokens (the depth)")
    ap.add_argument("--tg", type=int, default=32, help="tokens generated at depth")
    ap.add_argument("--ub", type=int, default=512, help="prefill ubatch (both engines)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kv-type", default="f16", help="llmcore KV type (llama.cpp runs f16)")
    ap.add_argument("--peer-fa", choices=("auto", "on", "off", "both"), default="auto",
                    help="llama.cpp flash attention (auto: its default)")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--no-mine", action="store_true", help="skip llmcore (peer only)")
    a = ap.parse_args(argv)

    from llmcore.pull import resolve_model

    path = str(resolve_model(a.model))
    why = "--no-peer" if a.no_peer else available()
    fas = [] if why else (["off", "on"] if a.peer_fa == "both" else [a.peer_fa])
    mine = None if a.no_mine else LLMCoreDepth(path, a.threads, a.depth, a.tg, a.ub, a.kv_type)
    # the peer draws the same prompt (same seed) from its own vocabulary size
    toks = prompt_tokens(a.depth, mine.model.n_vocab) if mine else []
    engines = ([f"llmcore ({a.kv_type} KV)"] if mine else []) + [f"llama.cpp (FA {fa})" for fa in fas]
    res: dict[str, dict[str, list[float]]] = {e: {} for e in engines}

    def add(engine, got):
        for k, v in got.items():
            res[engine].setdefault(k, []).append(v)

    if mine:
        mine.run(toks[:1024], 2)  # warm-up: page in the weights
    for r in range(a.reps):
        if mine:
            add(engines[0], mine.run(toks, a.tg))
        for fa in fas:
            got = measure_depth_in_subprocess(path, a.threads, a.depth, a.tg, ub=a.ub, flash_attn=fa)
            add(f"llama.cpp (FA {fa})", {k: v[0] for k, v in got.items()})
        print(f"rep {r + 1}/{a.reps}: " + "; ".join(
            f"{e} pp {v['pp'][-1]:.1f} last {v['pp_last'][-1]:.1f} tg {v['tg'][-1]:.2f} "
            f"(per CPU-s pp {v['pp_cpu'][-1]:.1f} tg {v['tg_cpu'][-1]:.2f})"
            for e, v in res.items() if v), flush=True)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    d, ub = a.depth, a.ub
    print()
    print(f"model {os.path.basename(path)}, {a.threads} threads, depth {d}, ubatch {ub}, median of {a.reps}; "
          f"load average at end {load}")
    print(f"| engine | pp{d} t/s | pp{ub} @ d{d - ub} t/s | tg{a.tg} @ d{d} t/s | pp{d} per CPU-s | tg per CPU-s |")
    print("|---|---|---|---|---|---|")
    med = {e: {k: statistics.median(v) for k, v in m.items()} for e, m in res.items() if m}
    for e, m in med.items():
        print(f"| {e} | {m['pp']:.1f} | {m['pp_last']:.1f} | {m['tg']:.2f} | {m['pp_cpu']:.1f} | {m['tg_cpu']:.2f} |")
    if mine and len(med) > 1:
        me = med[engines[0]]
        for e in engines[1:]:
            p = med[e]
            print(f"| llmcore / {e} | {me['pp'] / p['pp']:.2f}x | {me['pp_last'] / p['pp_last']:.2f}x | "
                  f"{me['tg'] / p['tg']:.2f}x | {me['pp_cpu'] / p['pp_cpu']:.2f}x | {me['tg_cpu'] / p['tg_cpu']:.2f}x |")
    if why:
        print(f"(llama.cpp not measured: {why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
