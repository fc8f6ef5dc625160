#!/usr/bin/env python3
"""Batched decode at the model level (no HTTP): B sequences with ~--ctx-token contexts
advanced together, one forward per step, for B = 1, 2, 4, 8, 16, 32.

    PYTHONPATH=. python bench/batched_decode.py [-m smollm2] [--batches 1 2 4 8 16 32] \\
        [--ctx 600] [--steps 16] [-ctk f16|q8_0|q4_0] [--no-peer] [--append-results]

llmcore: all sequences are prefilled once (distinct random prompts, not timed); for each B
the first B of them decode --steps greedy steps at 1 thread (CPU time of the calling
thread per step: the OpenMP region runs on it, so this is the step's whole cost; min and
median) and at 2 threads (wall clock per step, median), then are cut back to their prompts.
A step is the forward and the greedy choice (``forward(argmax=...)``: the argmax the fused
step's head finds as it writes the logits, what the server's greedy requests take).
Aggregate t/s = B / step time. The 2-thread runs go in --rounds rounds, each over every B in
turn: a B's step time is the median of its rounds' medians, and "B / 1" (aggregate t/s over
one stream's) is taken within each round, then the median of the rounds (a shared host's
speed drifts between minutes, which a ratio of runs minutes apart would carry). The
"int8 share" column: the step's weight multiply-adds (B x the model's matrix elements) per
second over the int8 multiply-add probe (bench/int8peak.pyx) at the same thread count,
measured in the same run: where batched decode stands against the compute bound. Each round
starts with the memory read probe (bench/membw.pyx, as speed.py's bound), and a table of the
rounds puts one stream's step beside the time its weights take at that rate (how far the
denominator of the ratios is from memory's limit that minute) and each round's ratios.

llama.cpp (llama-cpp-python, bench/_peer_llamacpp.py ``LlamaCpp(n_seq=B).decode_parallel``):
the same prompt lengths, B sequences in one unified KV cache, one ``llama_decode`` per
step, prefill not timed, --steps steps at 2 threads (wall). It runs in a child process per B
with its own OpenMP settings (llama.cpp spins at barriers by default; llmcore sleeps).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # llmcore from this checkout

from _peer_llamacpp import available  # noqa: E402


def prompts_for(n_seq: int, ctx: int, n_vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(100, min(n_vocab, 30000), ctx).tolist() for _ in range(n_seq)]


# ---- llama.cpp, in a child process ---------------------------------------------------------

def _child(a) -> int:
    from _peer_llamacpp import LlamaCpp

    B = a.child
    m = LlamaCpp(a.model_path, a.threads, n_ctx=B * (a.ctx + a.steps + 8) + 256, n_batch=512, n_seq=B,
                 cache_type=a.cache_type)
    prompts = prompts_for(B, a.ctx, m.n_vocab, a.seed)
    out = []
    for _ in range(a.reps):
        dt = m.decode_parallel(prompts, a.steps)
        out.append(B * a.steps / dt)
    m.close()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def llamacpp_parallel(path: str, B: int, a) -> list[float]:
    env = dict(os.environ)
    if env.get("LLMCORE_SET_OMP_WAIT_POLICY") == "1":  # set by llmcore, not by the user
        env.pop("OMP_WAIT_POLICY", None)
    if env.get("LLMCORE_SET_GOMP_SPINCOUNT") == "1":
        env.pop("GOMP_SPINCOUNT", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(B), "--model-path", path,
           "-t", str(a.threads), "--ctx", str(a.ctx), "--steps", str(a.steps), "--reps", str(a.reps),
           "--seed", str(a.seed), "-ctk", a.cache_type]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"llama.cpp peer failed: {res.stderr.strip()[-500:]}")


# ---- llmcore ----------------------------------------------------------------------------------

class Batched:
    def __init__(self, path: str, ctx: int, n_max: int, seed: int, cache_type: str = "f16"):
        from llmcore import threads
        from llmcore.models import load_model

        self.threads = threads
        threads.set_num_threads(2)
        self.model = load_model(path, kv_type=cache_type)
        self.prompts = prompts_for(n_max, ctx, self.model.n_vocab, seed)
        self.states, self.first = [], []
        for p in self.prompts:
            st = self.model.new_state()
            arr = np.asarray(p, dtype=np.int32)
            for i in range(0, len(arr), 512):
                lg = self.model.forward([(st, arr[i:i + 512])])
            self.states.append(st)
            self.first.append(int(np.argmax(lg[0])))

    def run(self, B: int, steps: int, n_threads: int) -> list[float]:
        """Seconds per step (thread CPU time at 1 thread, wall clock otherwise)."""
        self.threads.set_num_threads(n_threads)
        clock = time.thread_time if n_threads == 1 else time.perf_counter
        sts, nxt = self.states[:B], list(self.first[:B])
        times = []
        for _ in range(steps):
            batch = [(s, np.array([t], dtype=np.int32)) for s, t in zip(sts, nxt)]
            t0 = clock()
            am = np.empty(B, dtype=np.int64)  # greedy: the argmax the step's head finds
            self.model.forward(batch, argmax=am)
            nxt = am.tolist()
            times.append(clock() - t0)
        for s, p in zip(sts, self.prompts):
            s.trim(len(p))
        return times


def _speed_probe(a, name: str, what: str, *warm_args):
    """speed.py's probe `name` (built from bench/membw.pyx), called once with warm_args so
    that it is compiled and paged in before the first round; None with --no-probe or without
    Cython / a compiler."""
    if a.no_probe:
        return None
    try:
        import speed

        probe = getattr(speed, name)
        probe(*warm_args)
        return probe
    except Exception as e:
        print(f"{what} unavailable ({type(e).__name__}: {e})", flush=True)
        return None


def _round_lines(rounds: list[dict], round_bw: list[float], a, wbytes: int,
                 round_rtt: list[float] | None = None) -> list[str]:
    """Per round: the memory probe, the core-to-core probe (when measured: where the host put
    the two threads' cores), one stream's step against the time its weights take at that
    bandwidth (the step also reads its K/V and runs the attention, the head and Python), and
    each B's ratio to one stream."""
    Bs = [B for B in a.batches if B != 1]
    rtt = round_rtt if round_rtt and len(round_rtt) == len(rounds) else None
    out = ["", f"Rounds ({a.threads} threads; one stream's bound: its {wbytes / 1e6:.1f} MB of weights at the "
           "probe's rate, K/V not counted" + ("; core round trip: a cache line between the two threads' "
                                              "cores and back" if rtt else "") + "):", "",
           "| round | memory probe GB/s | " + ("core round trip ns | " if rtt else "") + "B=1 ms | B=1 / bound | "
           + " | ".join(f"B={B} / 1" for B in Bs) + " |",
           "|---|---|" + ("---|" if rtt else "") + "---|---|" + "---|" * len(Bs)]
    for i, (rd, bw) in enumerate(zip(rounds, round_bw)):
        bound = wbytes / (bw * 1e9)
        out.append(f"| {i + 1} | {bw:.1f} | " + (f"{rtt[i]:.0f} | " if rtt else "") + f"{rd[1] * 1e3:.2f} | "
                   f"{bound / rd[1]:.2f} | " + " | ".join(f"{(B / rd[B]) / (1 / rd[1]):.2f}x" for B in Bs) + " |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads of the wall-clock runs")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--ctx", type=int, default=600, help="prompt tokens per sequence")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per B")
    ap.add_argument("--reps", type=int, default=1, help="llama.cpp repetitions per B")
    ap.add_argument("--rounds", type=int, default=1,
                    help="llmcore's multi-thread runs: rounds over every B (medians; B / 1 within a round)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-ctk", "--cache-type", default="f16", choices=("f16", "q8_0", "q4_0", "f32"),
                    help="K and V cache type of both engines (llama-server's -ctk / -ctv)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-probe", action="store_true", help="skip the int8 multiply-add and memory read probes")
    ap.add_argument("--append-results", action="store_true", help="append the table to bench/RESULTS.md")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a)

    from llmcore.pull import resolve_model

    path = str(resolve_model(a.model))
    why = "--no-peer" if a.no_peer else available()
    t_load = time.perf_counter()
    eng = Batched(path, a.ctx, max(a.batches), a.seed, a.cache_type)
    print(f"prefilled {max(a.batches)} x {a.ctx} tokens in {time.perf_counter() - t_load:.1f} s", flush=True)
    rows = []
    for B in a.batches:
        eng.run(B, 2, a.threads)  # warm-up (scratch buffers, page-in)
        cpu1 = eng.run(B, a.steps, 1)
        rows.append({"B": B, "cpu1_min": min(cpu1), "cpu1_med": statistics.median(cpu1)})
    # the multi-thread runs, B after B in each round: a ratio within a round compares minutes
    # of the same host speed
    membw_gbs = _speed_probe(a, "membw_gbs", "memory read probe", a.threads, 1)
    # where the host put the two cores (only a multi-thread run has two)
    core_rtt = _speed_probe(a, "core_round_trip_ns", "core round-trip probe", 2000, 1) if a.threads > 1 else None
    rounds, round_bw, round_rtt = [], [], []
    for _ in range(max(1, a.rounds)):
        if membw_gbs is not None:  # what memory gives this minute (one stream is bound by it)
            round_bw.append(membw_gbs(a.threads, reps=3))
        if core_rtt is not None:  # where the host put the two cores this minute (near / far)
            round_rtt.append(core_rtt())
        rounds.append({B: statistics.median(eng.run(B, a.steps, a.threads)) for B in a.batches})
    for r in rows:
        B = r["B"]
        r["wall_med"] = statistics.median(rd[B] for rd in rounds)
        if 1 in a.batches:
            ratios = sorted((B / rd[B]) / (1 / rd[1]) for rd in rounds)
            r["vs1"] = (statistics.median(ratios), ratios[0], ratios[-1])
        if why is None:
            r["peer"] = statistics.median(llamacpp_parallel(path, B, a))
        vs1 = r.get("vs1")
        print(f"B={B:3d}: llmcore 1t cpu/step {r['cpu1_min'] * 1e3:7.2f} ms (med {r['cpu1_med'] * 1e3:.2f}) "
              f"-> {B / r['cpu1_min']:7.1f} t/s; {a.threads}t wall/step {r['wall_med'] * 1e3:7.2f} ms "
              f"-> {B / r['wall_med']:7.1f} t/s"
              + (f" ({vs1[0]:.2f}x one stream, rounds {vs1[1]:.2f}-{vs1[2]:.2f})" if vs1 and B != 1 else "")
              + (f"; llama.cpp {a.threads}t {r['peer']:7.1f} t/s" if "peer" in r else ""), flush=True)
    peak = None
    if not a.no_probe:
        try:
            from speed import int8_gmacs, weight_macs_per_token

            peak = int8_gmacs(a.threads)
            macs = weight_macs_per_token(path)
            print(f"int8 probe: {peak:.0f} GMAC/s at {a.threads} threads; {macs / 1e6:.1f} M weight "
                  f"multiply-adds a token", flush=True)
            for r in rows:
                r["int8"] = r["B"] * macs / r["wall_med"] / 1e9 / peak
        except Exception as e:  # no Cython / compiler: the table without the share
            print(f"int8 probe unavailable ({type(e).__name__}: {e})", flush=True)
            peak = None
    load = os.getloadavg()[0]
    lines = [
        f"model {os.path.basename(path)}, {a.cache_type} K/V, prompts of {a.ctx} tokens, {a.steps} decode steps per B, "
        f"{max(1, a.rounds)} round(s) of the {a.threads}-thread runs, load average {load:.1f} at the end",
        "",
        f"| B | llmcore 1 thread CPU ms/step (min) | llmcore 1 thread t/s | llmcore {a.threads} threads wall "
        f"ms/step (median) | llmcore {a.threads} threads t/s | B / 1 (rounds' range) | int8 share "
        f"| llama.cpp {a.threads} threads t/s | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        B = r["B"]
        peer = r.get("peer")
        mine = B / r["wall_med"]
        vs1 = r.get("vs1")
        vs1_s = f"{vs1[0]:.2f}x ({vs1[1]:.2f}-{vs1[2]:.2f})" if vs1 and B != 1 else "-"
        lines.append(f"| {B} | {r['cpu1_min'] * 1e3:.2f} | {B / r['cpu1_min']:.1f} | {r['wall_med'] * 1e3:.2f} | "
                     f"{mine:.1f} | {vs1_s} | {'%.2f' % r['int8'] if 'int8' in r else '-'} | "
                     f"{'%.1f' % peer if peer else '-'} | "
                     f"{'%.2fx' % (mine / peer) if peer else '-'} |")
    if peak:
        lines.append(f"\nint8 probe (bench/int8peak.pyx): {peak:.0f} GMAC/s at {a.threads} threads, same run")
    if round_bw and 1 in a.batches:
        from speed import weight_bytes_per_token

        lines += _round_lines(rounds, round_bw, a, weight_bytes_per_token(path), round_rtt)
    if why is not None:
        lines.append(f"\n(llama.cpp not measured: {why})")
    table = "\n".join(lines)
    print()
    print(table)
    if a.append_results:
        cmd = "python bench/batched_decode.py " + " ".join(
            x for x in (argv if argv is not None else sys.argv[1:]) if x != "--append-results")
        res = os.path.join(HERE, "RESULTS.md")
        head = "## Batched decode (bench/batched_decode.py)"
        with open(res) as f:
            have = head in f.read()
        with open(res, "a") as f:
            if not have:
                f.write(f"\n{head}\n")
            f.write(f"\nCommand (from the repo root): `{cmd.strip()}` ({time.strftime('%Y-%m-%d %H:%M')})\n\n"
                    f"{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
