#!/usr/bin/env python3
"""Load benchmark and soak of any OpenAI-compatible server, with evalscope perf's flags
where they mean the same (``llmcore bench load ...`` or ``python bench/load.py ...``).

    llmcore bench load --url http://127.0.0.1:8080 --parallel 1 2 4 8 16 32 \\
        --number 8 16 32 64 64 64 --dataset random --min-prompt-length 128 \\
        --max-prompt-length 512 --min-tokens 64 --max-tokens 64 --prefix-length 64 \\
        --stream --turns 2 --output runs/llmcore
    llmcore bench load --url http://127.0.0.1:8080 --parallel 8 --duration 10 --output runs/soak

One level per ``--parallel`` value: that many workers send ``--number`` requests in all.
A request is one turn of a conversation (``--turns``): a worker that got an answer comes
back with the history plus a new user message, so the server sees returning conversations
(its caches are exercised); ``--prefix-length`` tokens of system prompt are shared by all
conversations. Prompt lengths are in tokens, calibrated with the server's /tokenize when
it has one (llama-server, llmcore; else about one token per word). Requests ask for
exactly the drawn number of output tokens (``max_tokens`` + ``ignore_eos``).

Reported per level: requests ok / failed, TTFT mean / p50 / p99, TPOT (time per output
token after the first), inter-token latency, output and total tokens/s, requests/s, and
the share of prompt tokens served from cache (``usage.prompt_tokens_details.cached_tokens``
or ``timings.cache_n``). A rich table with a progress bar while it runs; ``--output DIR``
gets ``results.json`` and ``load.png`` (throughput and TTFT against concurrency;
``--compare OTHER/results.json`` draws another run beside it, e.g. llama-server's).

Soak (``--duration MIN``): the first ``--parallel`` value, requests until the time is up,
the server's RSS sampled every second (its pid from ``--pid``, /props "pid", or the
process listening on the URL's port when local) and /metrics every 5 s. It fails on a
failed request, a dead server, or an RSS above what the server announced at start
(/props "memory": KV pools + checkpoints + recurrent state over the RSS it had before the
first request, plus ``--slack-mib``); it reports the memory outside the caches (RSS
minus the caches' bytes from /metrics) at the start, middle and end (a plateau, or not).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or "
         "one had by word but not what all were we when your can said there use an each which she do how "
         "their if will up other about out many then them these so some her would make like him into time "
         "has look two more write go see number no way could people my than first water been call who oil "
         "its now find long down day did get come made may part over new sound take only little work know "
         "place year live me back give most very after thing our just name good sentence man think say great "
         "where help through much before line right too mean old any same tell boy follow came want show also "
         "around form three small set put end does another well large must big even such because turn here "
         "why ask went men read need land different home us move try kind hand picture again change off play "
         "spell air away animal house point page letter mother answer found study still learn should america "
         "world").split()


# ---- the workload ---------------------------------------------------------------------------

@dataclass
class Args:
    url: str
    api: str = "openai"
    model: str = ""
    api_key: str | None = None
    parallel: list[int] = field(default_factory=lambda: [1])
    number: list[int] = field(default_factory=lambda: [8])
    dataset: str = "random"
    min_prompt_length: int = 64
    max_prompt_length: int = 256
    min_tokens: int = 32
    max_tokens: int = 32
    prefix_length: int = 0
    turns: int = 2
    stream: bool = True
    seed: int = 0
    output: str | None = None
    label: str = ""
    compare: list[str] = field(default_factory=list)
    duration: float = 0.0  # minutes; > 0: soak
    pid: int | None = None
    slack_mib: int = 256
    read_timeout: float = 600.0
    quiet: bool = False


@dataclass
class Result:
    """One request."""

    ok: bool
    turn: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)  # seconds between content chunks
    error: str = ""
    t_end: float = 0.0
    prompt_estimated: bool = False  # the server reported no usage: tokens per word x words

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


@dataclass
class Level:
    """What one concurrency level measured."""

    parallel: int
    requests: int = 0
    ok: int = 0
    failed: int = 0
    seconds: float = 0.0
    ttft_mean: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    tpot_mean: float | None = None
    tpot_p99: float | None = None
    itl_mean: float | None = None
    itl_p99: float | None = None
    latency_mean: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tps: float = 0.0
    total_tps: float = 0.0
    rps: float = 0.0
    cache_share: float = 0.0
    errors: list[str] = field(default_factory=list)
    returning_ttft_p50: float | None = None  # turns > 1: the conversations that came back
    prompt_estimated: bool = False  # prompt tokens estimated by the client (no usage reported)

    @staticmethod
    def of(parallel: int, results: list[Result], seconds: float) -> "Level":
        ok = [r for r in results if r.ok]
        lv = Level(parallel, len(results), len(ok), len(results) - len(ok), seconds)
        ttft = [r.ttft for r in ok]
        tpot = [r.tpot for r in ok if r.tpot is not None]
        itl = [x for r in ok for x in r.itl]
        lv.ttft_mean = statistics.fmean(ttft) if ttft else None
        lv.ttft_p50, lv.ttft_p99 = _pct(ttft, 50), _pct(ttft, 99)
        lv.tpot_mean, lv.tpot_p99 = (statistics.fmean(tpot) if tpot else None), _pct(tpot, 99)
        lv.itl_mean, lv.itl_p99 = (statistics.fmean(itl) if itl else None), _pct(itl, 99)
        lv.latency_mean = statistics.fmean(r.latency for r in ok) if ok else None
        lv.output_tokens = sum(r.output_tokens for r in ok)
        lv.prompt_tokens = sum(r.prompt_tokens for r in ok)
        lv.cached_tokens = sum(r.cached_tokens for r in ok)
        if seconds > 0:
            lv.output_tps = lv.output_tokens / seconds
            lv.total_tps = (lv.output_tokens + lv.prompt_tokens) / seconds
            lv.rps = lv.ok / seconds
        lv.cache_share = lv.cached_tokens / lv.prompt_tokens if lv.prompt_tokens else 0.0
        lv.errors = sorted({r.error for r in results if not r.ok})[:10]
        lv.prompt_estimated = any(r.prompt_estimated for r in ok)
        back = [r.ttft for r in ok if r.turn > 1]
        lv.returning_ttft_p50 = _pct(back, 50)
        return lv


class Prompts:
    """Random text sized in tokens (evalscope's ``--dataset random``)."""

    def __init__(self, tokens_per_word: float, seed: int):
        self.tpw = max(0.2, tokens_per_word)
        self.rng = random.Random(seed)

    def text(self, n_tokens: int) -> str:
        n_words = max(1, round(n_tokens / self.tpw))
        return " ".join(self.rng.choice(WORDS) for _ in range(n_words))


# ---- the client -----------------------------------------------------------------------------

class Client:
    def __init__(self, a: Args, session: aiohttp.ClientSession):
        self.a = a
        self.s = session
        u = urllib.parse.urlsplit(a.url)
        self.base = f"{u.scheme}://{u.netloc}"
        path = u.path.rstrip("/")
        default = "/v1/completions" if a.api == "completions" else "/v1/chat/completions"
        self.endpoint = self.base + (path if path and path not in ("/v1",) else default)
        self.headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}

    async def get_json(self, path: str) -> Any:
        try:
            async with self.s.get(self.base + path, headers=self.headers,
                                  timeout=aiohttp.ClientTimeout(total=10)) as r:
                return await r.json(content_type=None) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def get_text(self, path: str) -> str | None:
        try:
            async with self.s.get(self.base + path, headers=self.headers,
                                  timeout=aiohttp.ClientTimeout(total=10)) as r:
                return await r.text() if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    async def tokens_per_word(self) -> tuple[float, str]:
        """The server's tokens per word of WORDS text (its /tokenize), else 1.0."""
        sample = " ".join(random.Random(1).choice(WORDS) for _ in range(400))
        for path, key in (("/tokenize", "content"), ("/extras/tokenize", "input")):
            try:
                async with self.s.post(self.base + path, json={key: sample, "add_special": False},
                                       headers=self.headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
                    if r.status == 200:
                        toks = (await r.json(content_type=None)).get("tokens")
                        if toks:
                            return len(toks) / 400, path
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
                continue
        return 1.0, "assumed"

    async def model_id(self) -> str:
        if self.a.model:
            return self.a.model
        d = await self.get_json("/v1/models")
        try:
            return d["data"][0]["id"]
        except (TypeError, KeyError, IndexError):
            return "model"

    async def request(self, messages: list[dict], max_tokens: int, turn: int,
                      est_prompt: int = 0) -> tuple[Result, str]:
        a = self.a
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "stream": a.stream,
                                "temperature": 0.0, "ignore_eos": True, "min_tokens": max_tokens}
        if a.stream:
            body["stream_options"] = {"include_usage": True}
        if a.api == "completions":
            body["prompt"] = "\n".join(m["content"] for m in messages)
        else:
            body["messages"] = messages
        res = Result(False, turn)
        text: list[str] = []
        t0 = time.perf_counter()
        last = None
        try:
            async with self.s.post(self.endpoint, json=body, headers=self.headers,
                                   timeout=aiohttp.ClientTimeout(total=a.read_timeout)) as r:
                if r.status != 200:
                    res.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                    return res, ""
                if not a.stream:
                    self._usage(res, await r.json(content_type=None), text)
                    res.ttft = time.perf_counter() - t0
                else:
                    done = False
                    async for raw in r.content:
                        line = raw.decode("utf-8", "replace").strip()
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True
                            break
                        ev = json.loads(data)
                        if "error" in ev:
                            res.error = f"error event: {str(ev['error'])[:200]}"
                            return res, ""
                        if self._usage(res, ev, text):
                            now = time.perf_counter()
                            if last is None:
                                res.ttft = now - t0
                            else:
                                res.itl.append(now - last)
                            last = now
                    if not done:
                        res.error = "stream ended without [DONE]"
                        return res, ""
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            res.error = f"{type(e).__name__}: {str(e)[:200]}"
            return res, ""
        res.latency = time.perf_counter() - t0
        res.t_end = time.time()
        if not res.output_tokens:
            res.output_tokens = len(res.itl) + (1 if last is not None else 0)
        if not res.prompt_tokens:  # a server without usage in streams: the client's estimate
            res.prompt_tokens, res.prompt_estimated = est_prompt, True
        res.ok = True
        return res, "".join(text)

    @staticmethod
    def _usage(res: Result, ev: dict, text: list[str]) -> bool:
        """Read one response object (a chunk or the whole body); True if it carried text."""
        got = False
        for ch in ev.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content") or (ch.get("message") or {}).get("content") \
                or ch.get("text") or ""
            if piece:
                text.append(piece)
                got = True
        u = ev.get("usage")
        if u:
            res.prompt_tokens = int(u.get("prompt_tokens") or 0)
            res.output_tokens = int(u.get("completion_tokens") or 0)
            res.cached_tokens = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        t = ev.get("timings")
        if t and "cache_n" in t:
            res.cached_tokens = int(t["cache_n"])
            res.prompt_tokens = res.prompt_tokens or int(t.get("cache_n", 0)) + int(t.get("prompt_n", 0))
        return got


class Conversations:
    """Conversations handed to workers: a worker keeps one for its turns, then takes the
    next; each turn is one request."""

    def __init__(self, a: Args, prompts: Prompts, seed: int):
        self.a = a
        self.p = prompts
        self.rng = random.Random(seed)
        self.system = prompts.text(a.prefix_length) if a.prefix_length > 0 else None

    def new(self) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        n = self.rng.randint(self.a.min_prompt_length, max(self.a.min_prompt_length, self.a.max_prompt_length))
        msgs.append({"role": "user", "content": self.p.text(max(1, n - self.a.prefix_length))})
        return msgs

    def next_turn(self, msgs: list[dict], answer: str) -> list[dict]:
        n = self.rng.randint(self.a.min_prompt_length, max(self.a.min_prompt_length, self.a.max_prompt_length))
        return msgs + [{"role": "assistant", "content": answer},
                       {"role": "user", "content": self.p.text(max(8, n // 4))}]

    def max_tokens(self) -> int:
        return self.rng.randint(self.a.min_tokens, max(self.a.min_tokens, self.a.max_tokens))


async def run_level(client: Client, convs: Conversations, parallel: int, number: int | None,
                    until: float | None, on_result) -> tuple[list[Result], float]:
    """`parallel` workers until `number` requests were sent (or time `until` passed)."""
    results: list[Result] = []
    sent = 0
    t0 = time.perf_counter()

    async def worker():
        nonlocal sent
        msgs, turn = None, 0
        while (number is None or sent < number) and (until is None or time.time() < until):
            sent += 1
            if msgs is None or turn >= client.a.turns:
                msgs, turn = convs.new(), 0
            turn += 1
            est = round(sum(len(m["content"].split()) for m in msgs) * convs.p.tpw)
            res, answer = await client.request(msgs, convs.max_tokens(), turn, est)
            results.append(res)
            on_result(res)
            msgs = convs.next_turn(msgs, answer) if res.ok else None

    await asyncio.gather(*(worker() for _ in range(parallel)))
    return results, time.perf_counter() - t0


# ---- the server's memory (soak) -------------------------------------------------------------

def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def pid_listening(port: int) -> int | None:
    """The local process listening on TCP `port` (Linux /proc), None if not found."""
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def plan_bytes(props: dict | None) -> int | None:
    """What the server says its caches may take (llmcore's /props "memory": the KV pools,
    the checkpoint budget and the recurrent state of all slots)."""
    if not isinstance(props, dict):
        return None
    m = props.get("memory") or (props.get("cache") or {}).get("memory")
    if not isinstance(m, dict) or "kv_max_bytes" not in m:
        return None
    return int(m.get("kv_max_bytes") or 0) + int(m.get("checkpoints_max_bytes") or 0) + int(m.get("state_max_bytes") or 0)


def cache_bytes(metrics_text: str | None) -> int | None:
    """Bytes the caches hold now, from llmcore's /metrics (KV in use: slots and RAM cache
    blocks, checkpoints' own copies; RAM-cache copies of recurrent state)."""
    if not metrics_text:
        return None
    vals = {}
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition(" ")
            try:
                vals[k] = float(v.split()[0])
            except (ValueError, IndexError):
                pass
    if "llmcore:kv_used_bytes" not in vals:
        return None
    return int(vals.get("llmcore:kv_allocated_bytes", vals["llmcore:kv_used_bytes"])
               + vals.get("llmcore:checkpoints_live_bytes", 0) + vals.get("llmcore:state_bytes", 0))


@dataclass
class Soak:
    seconds: float = 0.0
    pid: int | None = None
    rss_start: int | None = None
    rss_peak: int | None = None
    rss_end: int | None = None
    plan: int | None = None
    limit: int | None = None  # rss_start + plan + slack
    outside: list[tuple[float, int]] = field(default_factory=list)  # (t, RSS - caches)
    rss: list[tuple[float, int]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


async def sample_memory(client: Client, soak: Soak, stop: asyncio.Event, t0: float) -> None:
    last_metrics = 0.0
    cached = None
    while not stop.is_set():
        now = time.time()
        if soak.pid is not None:
            r = rss_bytes(soak.pid)
            if r is None:
                soak.failures.append(f"the server (pid {soak.pid}) died at {now - t0:.0f} s")
                stop.set()
                return
            soak.rss.append((now - t0, r))
            soak.rss_peak = max(soak.rss_peak or 0, r)
            if soak.limit is not None and r > soak.limit and not any("RSS" in f for f in soak.failures):
                soak.failures.append(f"RSS {r / 2**20:.0f} MiB at {now - t0:.0f} s is above the plan "
                                     f"({soak.limit / 2**20:.0f} MiB: start + announced caches + slack)")
        if now - last_metrics >= 5:
            last_metrics = now
            if await client.get_json("/health") is None:
                soak.failures.append(f"/health did not answer at {now - t0:.0f} s")
            cached = cache_bytes(await client.get_text("/metrics"))
            if cached is not None and soak.rss:
                soak.outside.append((now - t0, soak.rss[-1][1] - cached))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


# ---- reporting ------------------------------------------------------------------------------

def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.0f}"


def table(levels: list[Level], title: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("parallel", "ok", "failed", "TTFT mean", "TTFT p50", "TTFT p99", "TPOT ms", "ITL ms",
                "ITL p99", "out tok/s", "total tok/s", "req/s", "cached", "back TTFT p50"):
        t.add_column(col, justify="right")
    for lv in levels:
        t.add_row(str(lv.parallel), str(lv.ok), str(lv.failed), _ms(lv.ttft_mean), _ms(lv.ttft_p50),
                  _ms(lv.ttft_p99), _ms(lv.tpot_mean), _ms(lv.itl_mean), _ms(lv.itl_p99),
                  f"{lv.output_tps:.1f}", f"{lv.total_tps:.1f}", f"{lv.rps:.2f}", f"{100 * lv.cache_share:.0f}%",
                  _ms(lv.returning_ttft_p50))
    return t


def plot(out: Path, runs: list[dict]) -> Path | None:
    """load.png: output and total tokens/s and TTFT (p50, p99) against concurrency, one
    colour per run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot", file=sys.stderr)
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    xs: set[int] = set()
    for i, run in enumerate(runs):
        lv = run["levels"]
        x = [v["parallel"] for v in lv]
        xs.update(x)
        name, col = run.get("label") or run.get("url", ""), f"C{i}"
        axes[0].plot(x, [v["output_tps"] for v in lv], marker="o", color=col, label=name)
        axes[1].plot(x, [v["total_tps"] for v in lv], marker="o", color=col, label=name)
        axes[2].plot(x, [1e3 * (v["ttft_p50"] or 0) for v in lv], marker="o", color=col, label=f"{name} p50")
        axes[2].plot(x, [1e3 * (v["ttft_p99"] or 0) for v in lv], marker=".", ls="--", color=col, label=f"{name} p99")
    ttfts = [v for ln in axes[2].get_lines() for v in ln.get_ydata() if v > 0]
    if ttfts and max(ttfts) / min(ttfts) > 50:  # from ms to minutes: a log scale shows both
        axes[2].set_yscale("log")
    for ax, title, yl in ((axes[0], "output throughput", "output tokens/s"),
                          (axes[1], "total throughput (prompt + output)", "tokens/s"),
                          (axes[2], "time to first token", "TTFT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(xs), [str(v) for v in sorted(xs)])
        ax.set_xlabel("concurrency (parallel requests)")
        ax.set_ylabel(yl)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "load.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_soak(out: Path, soak: Soak) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    if soak.rss:
        ax.plot([t / 60 for t, _ in soak.rss], [r / 2**20 for _, r in soak.rss], label="RSS")
    if soak.outside:
        ax.plot([t / 60 for t, _ in soak.outside], [r / 2**20 for _, r in soak.outside], label="RSS outside the caches")
    if soak.limit:
        ax.axhline(soak.limit / 2**20, color="r", ls="--", label="plan limit")
    ax.set_xlabel("minutes")
    ax.set_ylabel("MiB")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- the run --------------------------------------------------------------------------------

async def run(a: Args) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, quiet=a.quiet, width=None if sys.stderr.isatty() else 160)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        client = Client(a, session)
        client.model = await client.model_id()
        tpw, how = await client.tokens_per_word()
        props = await client.get_json("/props")
        convs = Conversations(a, Prompts(tpw, a.seed), a.seed)
        report: dict[str, Any] = {"label": a.label, "url": a.url, "model": client.model, "args": asdict(a),
                                  "tokens_per_word": tpw, "token_count": how, "levels": [], "started": time.time()}
        console.print(f"[bold]{a.url}[/] model {client.model}; prompt lengths in tokens by {how} "
                      f"({tpw:.2f} tokens/word)")
        levels: list[Level] = []
        soak = None
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                      TimeElapsedColumn(), console=console, transient=False) as prog:
            if a.duration > 0:
                soak = Soak(pid=a.pid or (props or {}).get("pid") or _local_pid(a.url))
                soak.plan = plan_bytes(props)
                soak.rss_start = rss_bytes(soak.pid) if soak.pid else None
                if soak.rss_start is not None and soak.plan is not None:
                    soak.limit = soak.rss_start + soak.plan + (a.slack_mib << 20)
                if soak.pid is None:
                    console.print("[yellow]soak: the server's pid is unknown (--pid): RSS not sampled[/]")
                par = a.parallel[0]
                t0 = time.time()
                until = t0 + 60 * a.duration
                task = prog.add_task(f"soak at {par}", total=int(60 * a.duration), info="")
                stop = asyncio.Event()
                sampler = asyncio.create_task(sample_memory(client, soak, stop, t0))
                n_done = [0, 0]

                def on_result(r: Result) -> None:
                    n_done[0 if r.ok else 1] += 1
                    if not r.ok and not any(r.error in f for f in soak.failures):
                        soak.failures.append(f"request failed: {r.error}")
                    rss = soak.rss[-1][1] / 2**20 if soak.rss else 0
                    prog.update(task, completed=int(time.time() - t0),
                                info=f"{n_done[0]} ok {n_done[1]} failed RSS {rss:.0f} MiB")

                async def watch():
                    while time.time() < until and not stop.is_set():
                        prog.update(task, completed=int(time.time() - t0))
                        await asyncio.sleep(1)

                watcher = asyncio.create_task(watch())
                runner = asyncio.create_task(run_level(client, convs, par, None, until, on_result))
                done, _ = await asyncio.wait({runner, sampler}, return_when=asyncio.FIRST_COMPLETED)
                if runner not in done:  # the sampler stopped: the server died
                    runner.cancel()
                    results, secs = [], time.time() - t0
                else:
                    results, secs = runner.result()
                stop.set()
                await asyncio.gather(sampler, return_exceptions=True)
                watcher.cancel()
                soak.seconds = time.time() - t0
                soak.rss_end = soak.rss[-1][1] if soak.rss else None
                levels.append(Level.of(par, results, secs))
            else:
                numbers = a.number if len(a.number) == len(a.parallel) else [a.number[0]] * len(a.parallel)
                for par, num in zip(a.parallel, numbers):
                    task = prog.add_task(f"parallel {par}", total=num, info="")
                    counts = [0, 0]

                    def on_result(r: Result, task=task, counts=counts) -> None:
                        counts[0 if r.ok else 1] += 1
                        prog.update(task, advance=1, info=f"{counts[1]} failed" if counts[1] else "")

                    results, secs = await run_level(client, convs, par, num, None, on_result)
                    levels.append(Level.of(par, results, secs))
        report["levels"] = [asdict(lv) for lv in levels]
        if soak is not None:
            report["soak"] = {**asdict(soak), "passed": soak.passed}
        report["passed"] = all(lv.failed == 0 for lv in levels) and (soak is None or soak.passed)
        console.print(table(levels, f"{a.label or a.url}: {client.model}"))
        if soak is not None:
            _print_soak(console, soak)
        if a.output:
            out = Path(a.output)
            out.mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps(report, indent=1))
            runs = [report] + [json.loads(Path(p).read_text()) for p in a.compare]
            for r in runs[1:]:
                console.print(table([Level(**{k: v for k, v in lv.items()}) for lv in r["levels"]],
                                    f"{r.get('label') or r.get('url')}: {r.get('model')} (--compare)"))
            made = [plot(out, runs)] if soak is None else [plot_soak(out, soak)]
            console.print(f"wrote {out / 'results.json'}" + "".join(f", {p}" for p in made if p))
        return report


def _local_pid(url: str) -> int | None:
    u = urllib.parse.urlsplit(url)
    if u.hostname in ("127.0.0.1", "localhost", "::1"):
        return pid_listening(u.port or (443 if u.scheme == "https" else 80))
    return None


def _print_soak(console, soak: Soak) -> None:
    mib = lambda b: "-" if b is None else f"{b / 2**20:.0f} MiB"  # noqa: E731
    console.print(f"soak {soak.seconds / 60:.1f} min: RSS start {mib(soak.rss_start)}, peak {mib(soak.rss_peak)}, "
                  f"end {mib(soak.rss_end)}; announced caches {mib(soak.plan)}, limit {mib(soak.limit)}")
    if soak.outside:
        n = len(soak.outside)
        pts = [soak.outside[0], soak.outside[n // 2], soak.outside[-1]]
        console.print("memory outside the caches: " + ", ".join(f"{mib(b)} at {t / 60:.1f} min" for t, b in pts))
    console.print("[green]soak passed[/]" if soak.passed else "[red]soak failed:[/] " + "; ".join(soak.failures))


def parse_args(argv: list[str] | None = None) -> Args:
    p = argparse.ArgumentParser(prog="llmcore bench load", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="server base URL or endpoint URL")
    p.add_argument("--api", default="openai", choices=["openai", "completions"],
                   help="openai: /v1/chat/completions; completions: /v1/completions")
    p.add_argument("--model", default="", help="model id (default: the server's first in /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--parallel", type=int, nargs="+", default=[1], help="concurrency levels")
    p.add_argument("--number", type=int, nargs="+", default=[8],
                   help="requests per level (one value for every level, or one per level)")
    p.add_argument("--dataset", default="random", choices=["random"])
    p.add_argument("--min-prompt-length", type=int, default=64, help="tokens")
    p.add_argument("--max-prompt-length", type=int, default=256, help="tokens")
    p.add_argument("--min-tokens", type=int, default=32, help="output tokens")
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens")
    p.add_argument("--prefix-length", type=int, default=0, help="tokens of system prompt shared by all")
    p.add_argument("--turns", type=int, default=2, help="turns per conversation (they come back)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", "--outputs-dir", dest="output", default=None,
                   help="directory for results.json and the PNG")
    p.add_argument("--label", default="", help="name of this run in tables and plots")
    p.add_argument("--compare", nargs="*", default=[], help="results.json of other runs to draw beside this one")
    p.add_argument("--duration", type=float, default=0.0, help="soak: minutes at the first --parallel value")
    p.add_argument("--pid", type=int, default=None, help="soak: the server's pid (else /props or the port)")
    p.add_argument("--slack-mib", type=int, default=256, help="soak: RSS allowed above start + announced caches")
    p.add_argument("--read-timeout", type=float, default=600.0)
    p.add_argument("--quiet", action="store_true")
    ns = p.parse_args(argv)
    if len(ns.number) not in (1, len(ns.parallel)):
        p.error("--number takes one value or one per --parallel value")
    return Args(**vars(ns))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    report = asyncio.run(run(a))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
