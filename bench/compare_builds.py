#!/usr/bin/env python3
"""Speed of two llmcore checkouts (e.g. a commit before and after a change), paired.

    python bench/compare_builds.py OLD_DIR NEW_DIR [-m smollm2] [-t 2] [--pairs 10]

Each checkout must be built in place (`python setup.py build_ext --inplace`). One worker
process per checkout loads the model once with that checkout's llmcore; the two then take
turns (ABBA order) on the same prompt-processing and generation calls, so every pair sees the
same machine load. Reports per side the median tokens/s and CPU ms per token, and the
median of the per-pair new/old ratios: on a shared, noisy machine the ratios and the CPU
times say more than the absolute numbers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

WORKER = r"""
import os, sys, time
repo = os.getcwd()
sys.path[:0] = [repo, os.path.join(repo, "bench")]
import numpy as np
import llmcore
assert llmcore.__file__.startswith(repo), llmcore.__file__
from llmcore.engine import Engine  # noqa: F401  (the checkout imports as a whole)
from llmcore.models import load_model
from llmcore.pull import resolve_model
from llmcore import threads
model, nt = sys.argv[1], int(sys.argv[2])
threads.set_num_threads(nt)
m = load_model(str(resolve_model(model)))
rng = np.random.default_rng(0)
prompt = rng.integers(100, min(m.n_vocab, 30000), 512).astype(np.int32)

def prefill(toks):
    st = m.new_state()
    t0 = time.perf_counter()
    m.forward([(st, toks)])
    dt = time.perf_counter() - t0
    st.release()
    return dt

def generate(n):
    st = m.new_state()
    logits = m.forward([(st, prompt[:16])])
    t0 = time.perf_counter()
    for _ in range(n):
        tok = np.array([int(np.argmax(logits[0]))], np.int32)
        logits = m.forward([(st, tok)])
    dt = time.perf_counter() - t0
    st.release()
    return dt

prefill(prompt[:64]); generate(4)
print("ready", llmcore.__file__, flush=True)
for line in sys.stdin:
    cmd = line.split()
    c0 = time.process_time()
    if cmd[0] == "pp":
        n, dt = len(prompt), prefill(prompt)
    else:
        n = int(cmd[1]); dt = generate(n)
    print(n / dt, (time.process_time() - c0) / n * 1e3, flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--tg", type=int, default=64, help="generated tokens per call")
    args = ap.parse_args()
    workers = {}
    for side, repo in (("old", args.old), ("new", args.new)):
        repo = os.path.abspath(repo)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = repo
        workers[side] = subprocess.Popen([sys.executable, "-c", WORKER, args.model, str(args.threads)],
                                         cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, env=env)
        print(side, workers[side].stdout.readline().strip(), flush=True)

    def ask(side: str, cmd: str) -> tuple[float, float]:
        w = workers[side]
        w.stdin.write(cmd + "\n")
        w.stdin.flush()
        a, b = w.stdout.readline().split()
        return float(a), float(b)

    tps = {(s, c): [] for s in workers for c in ("pp", "tg")}
    cpu = {(s, c): [] for s in workers for c in ("pp", "tg")}
    ratio = {"pp": [], "tg": []}
    cpu_ratio = {"pp": [], "tg": []}
    for r in range(args.pairs):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for c, cmd in (("pp", "pp"), ("tg", f"tg {args.tg}")):
            got = {s: ask(s, cmd) for s in order}
            for s, (v, ms) in got.items():
                tps[(s, c)].append(v)
                cpu[(s, c)].append(ms)
            ratio[c].append(got["new"][0] / got["old"][0])
            cpu_ratio[c].append(got["new"][1] / got["old"][1])
    for w in workers.values():
        w.stdin.close()
        w.wait()
    med = statistics.median
    print(f"{args.model} -t {args.threads}, {args.pairs} pairs")
    print(f"{'':6}{'old t/s':>10}{'new t/s':>10}{'new/old':>9}{'old CPU ms/tok':>16}{'new CPU ms/tok':>16}{'new/old':>9}")
    for c, name in (("pp", "pp512"), ("tg", f"tg{args.tg}")):
        print(f"{name:6}{med(tps[('old', c)]):10.1f}{med(tps[('new', c)]):10.1f}{med(ratio[c]):9.3f}"
              f"{med(cpu[('old', c)]):16.3f}{med(cpu[('new', c)]):16.3f}{med(cpu_ratio[c]):9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
