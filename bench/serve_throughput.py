#!/usr/bin/env python3
"""Aggregate generation speed of `llmcore serve` at 1, 2, 4, 8, 16, 32 concurrent streams,
against llama.cpp's batched decode of as many sequences, measured in the same run.

    python bench/serve_throughput.py [-m smollm2] [-t 2] [--streams 1 2 4 8 16 32] \\
        [--prompt-tokens 32] [--gen 48] [--reps 1] [--no-peer]

llmcore: one server (`-np` = the largest N, greedy, q8_0/f16 KV as given), then for each N
that many streamed chat requests at once (ignore_eos, `--gen` tokens each, distinct
prompts). Three client-clock figures:
- decode (the headline, what llama.cpp's figure below is): tokens received while all N
  streams are decoding, i.e. between the latest first token and the earliest last one, over
  that span. The requests arrive together but not in one instant: the first is prefilled
  alone, the others in the next steps, so the first stream's first token comes a whole
  prefill of N - 1 prompts before the last stream's;
- burst: tokens after each stream's first, from the earliest first token to the latest last
  one (that prefill of the other prompts falls inside it: with short answers it is a large
  share of the span);
- end to end: every generated token over the span from sending the requests to the last token.
The server's own numbers (sum of `timings.predicted_n` / longest `predicted_ms`) are shown too.

llama.cpp (llama-cpp-python, bench/_peer_llamacpp.py): N sequences of the same prompt
lengths in one context, advanced together, one `llama_decode` per step; the prefill is
not timed. The two alternate at each N so they see the same machine load. With --reps R
every N is measured R times (the Ns in turn, R rounds) and the medians are reported.
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

from serve_load import PromptMaker, ServerProcess, get_json, stream_chat  # noqa: E402


def window_rate(results) -> tuple[float, float]:
    """(aggregate tokens/s, seconds), the burst: tokens after each stream's first, over the
    span from the earliest first token to the latest last token."""
    firsts = [r.chunk_times[0] for r in results if r.chunk_times]
    lasts = [r.chunk_times[-1] for r in results if r.chunk_times]
    if len(firsts) != len(results):
        return 0.0, 0.0
    a, b = min(firsts), max(lasts)
    n = sum(max(r.completion_tokens, len(r.chunk_times)) - 1 for r in results)
    return (n / (b - a) if b > a else 0.0), b - a


def decode_rate(results) -> tuple[float, float]:
    """(aggregate tokens/s, seconds) while every stream is decoding: tokens received after
    the latest first token up to the earliest last one, over that span. A content chunk can
    carry several tokens (the server hands a stream's tokens over at most every
    --stream-interval-ms): a stream's chunks count as its tokens / chunks each. One stream:
    its first token to its last, as `window_rate` (up to the first chunk's share)."""
    if not results or any(not r.chunk_times for r in results):
        return 0.0, 0.0
    a = max(r.chunk_times[0] for r in results)
    b = min(r.chunk_times[-1] for r in results)
    if b <= a:
        return 0.0, 0.0
    n = 0.0
    for r in results:
        per_chunk = max(r.completion_tokens, len(r.chunk_times)) / len(r.chunk_times)
        n += per_chunk * sum(1 for t in r.chunk_times if a < t <= b)
    return n / (b - a), b - a


async def llmcore_round(base: str, prompts: list[str], n_gen: int) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        t0 = time.perf_counter()
        res = await asyncio.gather(*[
            stream_chat(s, base, [{"role": "user", "content": p}], n_gen, "tput",
                        extra={"temperature": 0.0, "cache_prompt": False}) for p in prompts])
        wall = time.perf_counter() - t0
    bad = [r.error for r in res if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} stream(s) failed: {bad[:3]}")
    rate, win = decode_rate(res)
    burst, _ = window_rate(res)
    last = max(r.chunk_times[-1] for r in res)
    e2e = sum(r.completion_tokens for r in res) / (last - t0)
    pred_n = sum(int(r.timings.get("predicted_n") or 0) for r in res)
    pred_ms = max(float(r.timings.get("predicted_ms") or 0) for r in res)
    return {"rate": rate, "window_s": win, "wall_s": wall, "burst": burst, "e2e": e2e,
            "server_rate": pred_n / (pred_ms / 1e3) if pred_ms > 0 else 0.0,
            "prompt_tokens": statistics.mean(r.prompt_tokens for r in res),
            "tokens": sum(r.completion_tokens for r in res)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--ctk", default="f16")
    ap.add_argument("--reps", type=int, default=1, help="rounds over the Ns; medians are reported")
    ap.add_argument("--server-args", default="", help="more `llmcore serve` arguments (one string)")
    ap.add_argument("--no-peer", action="store_true", help="llmcore only")
    a = ap.parse_args(argv)

    from llmcore.pull import resolve_model

    path = resolve_model(a.model)
    peer_err = None
    if not a.no_peer:
        from _peer_llamacpp import LlamaCpp, available

        peer_err = available()
    n_max = max(a.streams)
    args = ["-m", str(path), "-np", str(n_max), "-c", str(n_max * (a.prompt_tokens + a.gen + 64) + 256),
            "-t", str(a.threads), "-ctk", a.ctk, "-ctv", a.ctk, "--temp", "0"] + a.server_args.split()
    print("$ llmcore serve " + " ".join(args), file=sys.stderr)
    with ServerProcess(args) as srv:
        base = srv.url

        async def setup():
            async with aiohttp.ClientSession() as s:
                pm = PromptMaker()
                await pm.calibrate(s, base)
                rng = random.Random(0)
                texts = [f"Story {i}: " + pm.text(rng, a.prompt_tokens) for i in range(n_max)]
                toks = []
                for t in texts:
                    async with s.post(base + "/tokenize", json={"content": t, "add_special": True}) as r:
                        toks.append((await r.json())["tokens"])
                return texts, toks

        texts, toks = asyncio.run(setup())
        asyncio.run(llmcore_round(base, texts[:2], 4))  # warm-up
        runs: dict[int, list[dict]] = {n: [] for n in a.streams}
        for rep in range(a.reps):
            for n in a.streams:
                lc = asyncio.run(llmcore_round(base, texts[:n], a.gen))
                row = {"n": n, "llmcore": lc["rate"], "burst": lc["burst"], "e2e": lc["e2e"],
                       "server": lc["server_rate"], "ptoks": lc["prompt_tokens"]}
                if not a.no_peer and peer_err is None:
                    peer = LlamaCpp(str(path), a.threads, n_ctx=n * (a.prompt_tokens + a.gen + 96) + 256, n_seq=n)
                    try:
                        ptoks = [t[: int(lc["prompt_tokens"])] for t in toks[:n]]
                        sec = peer.decode_parallel(ptoks, a.gen)
                    finally:
                        peer.close()
                    row["llama"] = n * a.gen / sec
                runs[n].append(row)
                print(f"N={n:3d}: llmcore {row['llmcore']:7.1f} tok/s (burst {row['burst']:7.1f}, end to end "
                      f"{row['e2e']:7.1f}, server {row['server']:7.1f})"
                      + (f", llama.cpp {row['llama']:7.1f} tok/s, ratio {row['llmcore'] / row['llama']:.2f}"
                         if "llama" in row else ""), file=sys.stderr, flush=True)
    rows = [{k: (statistics.median(r[k] for r in rs) if k != "n" else n) for k in rs[0]}
            for n, rs in runs.items()]
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"\nmodel {path.name}, {a.threads} threads, ~{rows[0]['ptoks']:.0f} prompt tokens (chat), {a.gen} generated "
          f"per stream, KV {a.ctk}; load average at end {' '.join(load)}"
          + (f"; medians of {a.reps} rounds" if a.reps > 1 else ""))
    if peer_err:
        print(f"llama.cpp: {peer_err}")
    print("\n| streams | llmcore decode tok/s | burst | end to end | server timings | llama.cpp decode tok/s "
          "| llmcore / llama.cpp |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        llama = f"{r['llama']:.1f}" if "llama" in r else "-"
        ratio = f"{r['llmcore'] / r['llama']:.2f}" if "llama" in r else "-"
        print(f"| {r['n']} | {r['llmcore']:.1f} | {r['burst']:.1f} | {r['e2e']:.1f} | {r['server']:.1f} | {llama} "
              f"| {ratio} |")
    by_n = {r["n"]: r for r in rows}
    if 1 in by_n and 8 in by_n:
        one, eight = by_n[1], by_n[8]
        s = (f"\n8 streams / 1 stream: llmcore decode {eight['llmcore'] / one['llmcore']:.2f}x (burst "
             f"{eight['burst'] / one['burst']:.2f}x, end to end {eight['e2e'] / one['e2e']:.2f}x)")
        if "llama" in one:
            s += f", llama.cpp {eight['llama'] / one['llama']:.2f}x"
        print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
