#!/usr/bin/env python3
"""Replicas on Ray Serve (`llmcore serve --replicas N`): aggregate throughput of one vs two
replicas, and the cache hit rate of prefix-affinity routing against Ray Serve's default
power-of-two routing on a multi-turn workload.

    python bench/cluster.py throughput [-m smollm2] [--streams 8] [--gen 64] [-np 4]
    python bench/cluster.py routing [-m smollm2] [--conversations 16] [--turns 4] [-np 2]
    python bench/cluster.py all        # both, the defaults above

Every server is `llmcore serve` as a subprocess on a free port (a local Ray instance
started and stopped with it), greedy, one thread per engine (`-t 1`).

throughput: the same workload against one engine in the server's process (no Ray, the
reference), one replica and two replicas, each with `-np` slots: `--streams` streamed
chats at once (distinct prompts, ignore_eos, `--gen` tokens each, no prompt reuse),
`--rounds` times, the three servers up side by side and measured in turn; aggregate
decode = tokens after each stream's first, over the span from the earliest first token to
the latest last one (client clock), median over rounds; and the CPU time the server's
processes (front end, Ray, replicas) spent per token.

routing: two replicas, once with `--routing prefix`, once with `--routing power_of_two`.
`--conversations` chats share one system prompt; turn after turn, each conversation sends
its whole history plus a new question: every conversation takes its turn, in a new seeded
random order each round, `--concurrency` requests in flight, so a conversation returns
after all the others ran. Hit rate = prompt tokens reused (usage.prompt_tokens_details.cached_tokens)
over prompt tokens, for the returning turns (turn 2 on) and for all; "history reused" =
returning turns whose reuse covered their previous turn's whole prompt (only the replica
that served it can).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # llmcore from this checkout

from serve_load import PromptMaker, ServerProcess, stream_chat  # noqa: E402
from serve_throughput import window_rate  # noqa: E402


def serve_args(path, np_: int, replicas: int, extra=()) -> list[str]:
    args = ["-m", str(path), "-t", "1", "-np", str(np_), "--temp", "0", *extra]
    return args + (["--replicas", str(replicas)] if replicas else [])


# ---- throughput -------------------------------------------------------------------------------
async def throughput_round(base: str, prompts: list[str], n_gen: int) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        res = await asyncio.gather(*[
            stream_chat(s, base, [{"role": "user", "content": p}], n_gen, "tput",
                        extra={"temperature": 0.0, "cache_prompt": False}) for p in prompts])
    bad = [r.error for r in res if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} stream(s) failed: {bad[:3]}")
    return window_rate(res)[0]


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and every process under it (a server's
    Ray instance and replicas), from /proc."""
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)] = int(fields[1])
        cpu[int(d)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo += [c for c, pp in parent.items() if pp == p]
    return total


def throughput(a, path) -> list[dict]:
    """The three servers run side by side, idle but for the one measured; rounds go
    A B C, A B C, ... so each sees the machine's load as the others do."""
    setups = (("one engine, no Ray", 0), ("1 replica", 1), ("2 replicas", 2))
    servers = []
    try:
        for label, replicas in setups:
            args = serve_args(path, a.parallel, replicas, ["-c", str(a.parallel * (a.prompt_tokens + a.gen + 64) + 256)])
            print(f"$ llmcore serve {' '.join(args)}", file=sys.stderr)
            servers.append((label, ServerProcess(args).start()))

        async def prompts(url):
            async with aiohttp.ClientSession() as s:
                pm = PromptMaker()
                await pm.calibrate(s, url)
            rng = random.Random(0)
            return [f"Story {i}: " + pm.text(rng, a.prompt_tokens) for i in range(a.streams)]

        texts = asyncio.run(prompts(servers[0][1].url))
        for _, srv in servers:
            asyncio.run(throughput_round(srv.url, texts[:2], 4))  # warm-up
        rates = {label: [] for label, _ in servers}
        cpu = {label: [] for label, _ in servers}
        for _ in range(a.rounds):
            for label, srv in servers:
                c0 = tree_cpu_s(srv.proc.pid)
                rates[label].append(asyncio.run(throughput_round(srv.url, texts, a.gen)))
                cpu[label].append(tree_cpu_s(srv.proc.pid) - c0)
    finally:
        for _, srv in servers:
            srv.stop()
    rows = []
    n_tokens = a.streams * a.gen
    for label, _ in setups:
        rows.append({"setup": label, "rate": statistics.median(rates[label]), "all": rates[label],
                     "cpu_per_token_ms": 1e3 * statistics.median(cpu[label]) / n_tokens})
        print(f"  {label}: {rows[-1]['rate']:.1f} tok/s (rounds: {', '.join(f'{r:.1f}' for r in rates[label])}), "
              f"{rows[-1]['cpu_per_token_ms']:.1f} ms CPU per token", file=sys.stderr)
    return rows


# ---- routing ------------------------------------------------------------------------------------
async def conversations(base: str, a) -> dict:
    rng = random.Random(a.seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        pm = PromptMaker()
        await pm.calibrate(s, base)
        system = "You are a patient tutor. Keep answers short. Course notes: " + pm.text(rng, a.system_tokens)
        chats = [[{"role": "system", "content": system},
                  {"role": "user", "content": f"Student {c}: " + pm.text(rng, a.question_tokens)}]
                 for c in range(a.conversations)]
        last_prompt = [0] * a.conversations
        stats = {"first": [0, 0], "returning": [0, 0], "history_reused": 0, "n_returning": 0}
        sem = asyncio.Semaphore(a.concurrency)

        async def one(c: int, turn: int) -> None:
            async with sem:
                r = await stream_chat(s, base, chats[c], a.gen, "chat", extra={"temperature": 0.0})
            if not r.ok:
                raise RuntimeError(f"conversation {c}: {r.error}")
            key = "first" if turn == 0 else "returning"
            stats[key][0] += r.cached_tokens
            stats[key][1] += r.prompt_tokens
            if turn > 0:
                stats["n_returning"] += 1
                stats["history_reused"] += r.cached_tokens >= last_prompt[c]
                if a.verbose and r.cached_tokens < last_prompt[c]:
                    print(f"  conversation {c} turn {turn}: reused {r.cached_tokens} of its previous "
                          f"{last_prompt[c]} tokens (from {r.timings.get('cache_source')})", file=sys.stderr)
            last_prompt[c] = r.prompt_tokens
            chats[c] += [{"role": "assistant", "content": r.text},
                         {"role": "user", "content": "And then? " + pm.text(rng, a.question_tokens // 2)}]

        t0 = time.perf_counter()
        for turn in range(a.turns):  # every conversation takes its turn, in a new order each time
            order = list(range(a.conversations))
            rng.shuffle(order)
            await asyncio.gather(*[one(c, turn) for c in order])
        stats["wall_s"] = time.perf_counter() - t0
    return stats


def routing(a, path) -> list[dict]:
    rows = []
    for policy in ("prefix", "power_of_two"):
        args = serve_args(path, a.parallel, 2, ["--routing", policy, "-c", str(a.ctx)])
        print(f"$ llmcore serve {' '.join(args)}", file=sys.stderr)
        with ServerProcess(args) as srv:
            st = asyncio.run(conversations(srv.url, a))
        (fc, fp), (rc, rp) = st["first"], st["returning"]
        row = {"routing": policy, "returning": rc / rp if rp else 0.0, "all": (fc + rc) / max(1, fp + rp),
               "history": f"{st['history_reused']}/{st['n_returning']}", "wall_s": st["wall_s"]}
        rows.append(row)
        print(f"  {policy}: returning turns {100 * row['returning']:.1f}% of prompt tokens reused, "
              f"all turns {100 * row['all']:.1f}%, history reused {row['history']}, {row['wall_s']:.1f} s",
              file=sys.stderr)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["throughput", "routing", "all"])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-np", "--parallel", type=int, default=None, help="slots per engine (4 / 2)")
    ap.add_argument("--streams", type=int, default=8, help="throughput: concurrent streams")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen", type=int, default=None, help="tokens per answer (64 / 16)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4, help="routing: requests in flight")
    ap.add_argument("--system-tokens", type=int, default=96)
    ap.add_argument("--question-tokens", type=int, default=48)
    ap.add_argument("-c", "--ctx", type=int, default=16384, help="routing: each replica's -c")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true", help="routing: every turn that missed its history")
    a = ap.parse_args(argv)

    from llmcore.pull import resolve_model

    path = resolve_model(a.model)
    out = []
    if a.what in ("throughput", "all"):
        b = argparse.Namespace(**{**vars(a), "parallel": a.parallel or 4, "gen": a.gen or 64})
        rows = throughput(b, path)
        base = rows[0]["rate"]
        out += [f"aggregate decode, {b.streams} streams x {b.gen} tokens, -np {b.parallel}, -t 1 per engine "
                f"(median of {b.rounds} rounds; CPU: every process of the server, Ray's included):",
                "| setup | tok/s | vs one engine | CPU ms per token |", "|---|---:|---:|---:|"]
        out += [f"| {r['setup']} | {r['rate']:.1f} | {r['rate'] / base:.2f}x | {r['cpu_per_token_ms']:.1f} |"
                for r in rows]
    if a.what in ("routing", "all"):
        b = argparse.Namespace(**{**vars(a), "parallel": a.parallel or 2, "gen": a.gen or 16})
        rows = routing(b, path)
        out += ["", f"prompt reuse, 2 replicas (-np {b.parallel}, -t 1), {b.conversations} conversations x "
                    f"{b.turns} turns, {b.concurrency} in flight:",
                "| routing | returning turns: tokens reused | all turns | history reused | wall s |",
                "|---|---:|---:|---:|---:|"]
        out += [f"| {r['routing']} | {100 * r['returning']:.1f}% | {100 * r['all']:.1f}% | {r['history']} "
                f"| {r['wall_s']:.1f} |" for r in rows]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
