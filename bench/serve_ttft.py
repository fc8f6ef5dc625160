#!/usr/bin/env python3
"""Time to first token for a repeated long prefix, with and without each cache layer.

    python bench/serve_ttft.py [--models smollm2 gemma3-270m] [--prefix-tokens 1500] [--reps 5]
    python bench/serve_ttft.py --conversation 4400 60000 [--models smollm2] [--reps 5]

Every request is a chat: one long system prompt (`--prefix-tokens`, the same each time)
plus a short question that changes each time. Two access patterns:

- back-to-back: the measured requests follow each other (slot prefix reuse can serve them);
- interleaved: before each measured request a distractor with a different system prompt
  runs on the same single slot (`-np 1`), so the slot no longer holds the prefix and
  only the RAM prompt cache can bring it back.

Configurations: all caches on (server defaults); `cache_prompt: false` in the request (no
reuse at all); `--cache-ram 0` (no RAM cache); and for a model with sliding-window layers
(gemma3-270m) `--ctx-checkpoints 0` (the SWA state cannot be rolled back to the end of
the prefix without a checkpoint, so the prompt is re-processed). Reported: median TTFT
(client clock, request sent -> first content chunk) and median prompt tokens the server
reused (`usage.prompt_tokens_details.cached_tokens`) over `--reps` requests, after one
warm-up request that puts the prefix in place.

With --conversation: a coding-agent history of user / assistant turns (about TOKENS
tokens), sent once cold, then --reps times with a new last user message: the time to first
token of a next turn whose history is cached (template render, tokenization, JSON, prefix
lookup and the forward of the new message at that depth), and the engine's own prompt time.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # llmcore from this checkout

from serve_load import _TOPICS, PromptMaker, ServerProcess, stream_chat  # noqa: E402


async def measure(base: str, prefix_tokens: int, reps: int, interleave: bool, cache_prompt: bool,
                  seed: int = 0) -> dict:
    async with aiohttp.ClientSession() as s:
        pm = PromptMaker()
        await pm.calibrate(s, base)
        system = "You answer questions about the notes below. Notes: " + pm.text(random.Random(seed), prefix_tokens)
        rng = random.Random(seed + 1)
        extra = {"temperature": 0.0, "cache_prompt": cache_prompt}

        def question(i: int) -> list:
            return [{"role": "system", "content": system},
                    {"role": "user", "content": f"Question {i}: what do the notes say about {rng.choice(_TOPICS)}?"}]

        async def distract(i: int) -> None:
            msgs = [{"role": "system", "content": f"You are a poet ({i}). " + pm.text(rng, 200)},
                    {"role": "user", "content": "Write one line."}]
            r = await stream_chat(s, base, msgs, 2, "distractor", extra=extra)
            if not r.ok:
                raise RuntimeError(f"distractor failed: {r.error}")

        warm = await stream_chat(s, base, question(0), 2, "warm", extra=extra)
        if not warm.ok:
            raise RuntimeError(f"warm-up failed: {warm.error}")
        ttfts, cached, prompt_n = [], [], []
        for i in range(1, reps + 1):
            if interleave:
                await distract(i)
            r = await stream_chat(s, base, question(i), 2, "ttft", extra=extra)
            if not r.ok:
                raise RuntimeError(f"request failed: {r.error}")
            ttfts.append(r.ttft)
            cached.append(r.cached_tokens)
            prompt_n.append(r.prompt_tokens)
        return {"ttft": statistics.median(ttfts), "cached": statistics.median(cached),
                "prompt": statistics.median(prompt_n), "cold": warm.ttft}


def conversation(pm: PromptMaker, n_tokens: int, seed: int = 0) -> list[dict]:
    """A coding-agent-like history of about n_tokens: a system prompt, then user / assistant
    turns of 60-800 tokens."""
    rng = random.Random(seed)
    msgs = [{"role": "system", "content": "You are a coding agent working in a repository. " + pm.text(rng, 300)}]
    n = 300
    while n < n_tokens:
        u, a = rng.randint(60, 400), rng.randint(60, 800)
        msgs.append({"role": "user", "content": pm.text(rng, u)})
        msgs.append({"role": "assistant", "content": pm.text(rng, a)})
        n += u + a + 10
    return msgs


async def measure_conversation(base: str, n_tokens: int, reps: int, seed: int = 0) -> dict:
    """TTFT of the next turn of an n_tokens conversation whose history is cached: each
    request is the same history plus a new short user message."""
    async with aiohttp.ClientSession() as s:
        pm = PromptMaker()
        await pm.calibrate(s, base)
        history = conversation(pm, n_tokens, seed)
        rng = random.Random(seed + 1)
        extra = {"temperature": 0.0}

        def turn(i: int) -> list:
            return history + [{"role": "user", "content": f"Step {i}: now look at {rng.choice(_TOPICS)}."}]

        warm = await stream_chat(s, base, turn(0), 2, "warm", extra=extra, timeout=7200.0)
        if not warm.ok:
            raise RuntimeError(f"warm-up failed: {warm.error}")
        ttfts, cached, prompt_n, prompt_ms = [], [], [], []
        for i in range(1, reps + 1):
            r = await stream_chat(s, base, turn(i), 2, "ttft", extra=extra, timeout=7200.0)
            if not r.ok:
                raise RuntimeError(f"request failed: {r.error}")
            ttfts.append(r.ttft)
            cached.append(r.cached_tokens)
            prompt_n.append(r.prompt_tokens)
            prompt_ms.append(float(r.timings.get("prompt_ms", 0.0)))
        return {"ttft": statistics.median(ttfts), "cached": statistics.median(cached),
                "prompt": statistics.median(prompt_n), "prompt_ms": statistics.median(prompt_ms),
                "cold": warm.ttft, "all": ttfts}


def main_conversation(a) -> int:
    from llmcore.pull import resolve_model

    rows = []
    for model in a.models:
        path = resolve_model(model)
        for n in a.conversation:
            args = ["-m", str(path), "-np", "1", "-c", str(n + 4096), "-t", str(a.threads), *a.server_arg]
            print("$ llmcore serve " + " ".join(args), file=sys.stderr, flush=True)
            with ServerProcess(args) as srv:
                r = asyncio.run(measure_conversation(srv.url, n, a.reps))
            rows.append({"model": path.name, "n": n, **r})
            print(f"  ~{n} tokens: TTFT {r['ttft'] * 1e3:.0f} ms (engine prompt {r['prompt_ms']:.0f} ms), cached "
                  f"{r['cached']:.0f}/{r['prompt']:.0f} tok, cold {r['cold']:.1f} s; all "
                  + ", ".join(f"{t * 1e3:.0f}" for t in r["all"]), file=sys.stderr, flush=True)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"\nconversation TTFT, -np 1, {a.threads} threads, median of {a.reps} after a cold warm-up; "
          f"load average at end {load}\n")
    print("| model | history | median TTFT ms | engine prompt ms | prompt tokens reused / total | cold TTFT s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | ~{r['n']} | {r['ttft'] * 1e3:.0f} | {r['prompt_ms']:.0f} | "
              f"{r['cached']:.0f} / {r['prompt']:.0f} | {r['cold']:.1f} |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3-270m"])
    ap.add_argument("--prefix-tokens", type=int, default=1500)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--server-arg", action="append", default=[], help="extra argument for llmcore serve (repeatable)")
    ap.add_argument("--conversation", type=int, nargs="+", default=None, metavar="TOKENS",
                    help="instead: TTFT of the next turn of a conversation of about TOKENS tokens whose "
                         "history is cached (e.g. 4400 60000)")
    a = ap.parse_args(argv)
    if a.conversation:
        return main_conversation(a)

    from llmcore.pull import resolve_model

    rows = []
    for model in a.models:
        path = resolve_model(model)
        base_args = ["-m", str(path), "-np", "1", "-c", str(4 * a.prefix_tokens + 4096), "-t", str(a.threads),
                     *a.server_arg]
        swa = "gemma" in model
        configs = [("all caches on", [], True), ("cache_prompt: false", [], False), ("--cache-ram 0", ["--cache-ram", "0"], True)]
        if swa:
            configs.append(("--ctx-checkpoints 0", ["--ctx-checkpoints", "0"], True))
        servers: dict[tuple, list] = {}
        for name, extra_args, cp in configs:
            servers.setdefault(tuple(extra_args), []).append((name, cp))
        for extra_args, runs in servers.items():
            args = base_args + list(extra_args)
            print("$ llmcore serve " + " ".join(args), file=sys.stderr, flush=True)
            with ServerProcess(args) as srv:
                for name, cp in runs:
                    for inter in (False, True):
                        r = asyncio.run(measure(srv.url, a.prefix_tokens, a.reps, inter, cp))
                        row = {"model": path.name, "config": name, "pattern": "interleaved" if inter else "back-to-back",
                               **r}
                        rows.append(row)
                        print(f"  {name:22s} {row['pattern']:12s} TTFT {r['ttft'] * 1e3:8.0f} ms, cached "
                              f"{r['cached']:.0f}/{r['prompt']:.0f} tok (cold {r['cold'] * 1e3:.0f} ms)",
                              file=sys.stderr, flush=True)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"\nprefix ~{a.prefix_tokens} tokens, -np 1, {a.threads} threads, median of {a.reps}; load average at end {load}\n")
    print("| model | configuration | pattern | median TTFT ms | prompt tokens reused / total |")
    print("|---|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['config']} | {r['pattern']} | {r['ttft'] * 1e3:.0f} | "
              f"{r['cached']:.0f} / {r['prompt']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
