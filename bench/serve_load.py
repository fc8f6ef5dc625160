#!/usr/bin/env python3
"""Load test of `llmcore serve` over HTTP only: many concurrent streamed chat requests,
all cache layers on, bad input in the middle, server memory sampled.

    python bench/serve_load.py                      # the full workload (slow on 2 cores)
    python bench/serve_load.py --clients 12 -np 4 -c 8192 --ctk f16 --ctv f16 \\
        --prompt-tokens 64 160 --gen-tokens 8 16    # a quick run
    python bench/serve_load.py --url http://host:8080 ...   # against a running server

The full form starts `llmcore serve -m smollm2 -np 32 -c 4500000 -ctk q4_0 -ctv q4_0` on
a free port, waits for /health, then runs `--clients` concurrent clients. Each client
sends one streamed chat request; a quarter of them come back for a second turn (their
first answer plus a new question), so the server sees returning conversations. Prompts
are sized in tokens (calibrated with /tokenize): half share one system prompt (prefix
reuse across slots and the RAM cache), the rest have their own.

Every stream is checked: HTTP 200, every `data:` frame parses as JSON, no in-band error,
a finish_reason, a usage frame, `[DONE]` last, completion_tokens == max_tokens (requests
use ignore_eos). While the load runs, a misbehaving client sends malformed JSON, a prompt
longer than the context, and a stream it drops after two chunks; each must get its proper
answer (400, 400, cancellation) and the server must keep serving: a last request after
the load must succeed and the process must still be alive.

Memory: the server's RSS is sampled from /proc every 0.2 s, and its KV in use from
/metrics every second. The server announces at start-up (GET /props `cache.memory`, and
its "memory:" log line) the most its caches may take; the RSS growth over the load (peak
minus RSS after loading) must stay within that, plus a little slack for request buffers.

The same code runs in CI on a small configuration (tests/test_load.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------
# the server process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process (Linux /proc), None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssSampler:
    """Samples a process's RSS on a thread (the event loop may be busy) every `every` s."""

    def __init__(self, pid: int, every: float = 0.2):
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            r = rss_bytes(self.pid)
            if r is not None:
                self.samples.append((time.time(), r))
            self._stop.wait(self.every)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2)

    @property
    def peak(self) -> int | None:
        return max((r for _, r in self.samples), default=None)


class ServerProcess:
    """`python -m llmcore.cli serve ARGS --port P` as a subprocess; log to a file."""

    def __init__(self, args: list[str], port: int | None = None, env: dict | None = None,
                 log_path: str | Path | None = None):
        self.args = list(args)
        self.port = port or free_port()
        self.env = {**os.environ, **(env or {})}
        self.env["PYTHONPATH"] = str(REPO) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="llmcore-serve-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cmd(self) -> list[str]:
        return [sys.executable, "-m", "llmcore.cli", "serve", "--host", "127.0.0.1",
                "--port", str(self.port), *self.args]

    def start(self, timeout: float = 300.0) -> "ServerProcess":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=str(REPO))
        t0 = time.time()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before /health:\n{self.log_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except urllib.error.HTTPError as e:
                if e.code != 503:  # 503 = still loading; anything else: the load failed
                    self.stop()
                    raise RuntimeError(f"server /health answered {e.code}: {e.read()[:500]!r}\n"
                                       f"{self.log_text()[-3000:]}") from None
            except Exception:  # noqa: BLE001 - not up yet (refused)
                pass
            if time.time() - t0 > timeout:
                self.stop()
                raise TimeoutError(f"server not healthy after {timeout:.0f} s:\n{self.log_text()[-3000:]}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


_UNITS = {"b": 1, "bytes": 1, "kib": 2**10, "kb": 10**3, "mib": 2**20, "mb": 10**6,
          "gib": 2**30, "gb": 10**9}
_BUDGET_KEYS = ("memory_budget_bytes", "mem_budget_bytes", "memory_limit_bytes", "budget_bytes",
                "limit_bytes", "memory_budget", "mem_budget")
_BUDGET_RE = re.compile(
    r"(?i)(?:memory|ram)[^\n]{0,40}?(?:budget|limit|at most|up to|max(?:imum)?)[^\n]{0,40}?"
    r"([\d][\d.,]*)\s*(GiB|MiB|KiB|GB|MB|kB|bytes|B)\b")


def announced_memory(props: dict | None, log_text: str = "") -> tuple[int, str] | None:
    """The most memory the server says its caches may take: (bytes, where it was found).

    llmcore's GET /props has `cache.memory` (the engine's memory plan): KV pools up to
    `kv_max_bytes` (slots and RAM prompt cache share the pools) plus checkpoints up to
    `checkpoints_max_bytes` plus the slots' recurrent state `state_max_bytes` (hybrid and
    recurrent models); their sum is the announcement. Other shapes: a key such as
    `memory_budget_bytes`, or a start-up log line like "memory budget: 12.5 GiB". This is
    what the caches may add on top of the loaded model, so compare it with RSS growth."""
    def scan(d, path=""):
        if not isinstance(d, dict):
            return None
        if isinstance(d.get("kv_max_bytes"), (int, float)):
            total = (int(d["kv_max_bytes"]) + int(d.get("checkpoints_max_bytes") or 0)
                     + int(d.get("state_max_bytes") or 0))
            return total, f"/props {path}kv_max_bytes + checkpoints_max_bytes + state_max_bytes"
        for k in _BUDGET_KEYS:
            v = d.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return int(v), f"/props {path}{k}"
        for k, v in d.items():
            if isinstance(v, dict) and any(w in k.lower() for w in ("mem", "budget", "cache")):
                hit = scan(v, f"{path}{k}.")
                if hit:
                    return hit
        return None

    hit = scan(props or {})
    if hit:
        return hit
    for line in log_text.splitlines()[:200]:
        m = _BUDGET_RE.search(line)
        if m:
            return int(float(m.group(1).replace(",", "")) * _UNITS[m.group(2).lower()]), f"log: {line.strip()[-120:]}"
    return None


def memory_line(log_text: str) -> str:
    """The server's start-up memory report (log line "memory: ..."), if any."""
    for line in log_text.splitlines()[:200]:
        if "memory:" in line:
            return line.split("memory:", 1)[1].strip()
    return ""


# ---------------------------------------------------------------------------------------
# prompts

_WORDS = """time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot right
study book eye job word business issue side kind head house service friend father power hour
game line end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war history party
result change morning reason research girl guy moment air teacher force education river garden
bridge engine kernel cache memory thread signal harvest orbit planet market weather recipe
music theory museum ocean forest mountain valley winter summer journey letter window castle
machine language library village mirror storm lantern harbor""".split()
_VERBS = """make take see know get give find think tell become show leave feel put bring begin
keep hold write stand hear mean set meet run pay sit speak lie lead read grow lose fall send
build understand draw break spend cut rise drive buy wear choose explain describe compare
measure repair paint carry follow""".split()
_ADJ = """good new first last long great little own other old right big high different small
large next early young important few public bad same able quiet bright ancient modern careful
strange simple heavy green cold warm empty busy""".split()
_TOPICS = ["gardening", "sailing", "compilers", "bread baking", "astronomy", "chess", "beekeeping",
           "medieval history", "jazz", "mountain hiking", "databases", "pottery", "bird migration",
           "train travel", "cheese making", "volcanoes", "origami", "tide pools", "typography",
           "coffee roasting", "glaciers", "board games", "lighthouses", "violin making"]


def sentence(rng: random.Random) -> str:
    n = rng.randint(6, 16)
    words = []
    for i in range(n):
        pool = _VERBS if i % 4 == 1 else _ADJ if i % 4 == 2 else _WORDS
        words.append(rng.choice(pool))
    return words[0].capitalize() + " " + " ".join(words[1:]) + rng.choice([".", ".", ".", "?", "!"])


def text_words(rng: random.Random, n_words: int) -> str:
    out, n = [], 0
    while n < n_words:
        s = sentence(rng)
        out.append(s)
        n += s.count(" ") + 1
    return " ".join(out)


class PromptMaker:
    """Text of about N tokens, calibrated against the server's tokenizer (/tokenize)."""

    def __init__(self, tokens_per_word: float = 1.3, seed: int = 0):
        self.tpw = tokens_per_word
        self.seed = seed

    async def calibrate(self, session: aiohttp.ClientSession, base: str) -> float:
        sample = text_words(random.Random(12345), 400)
        try:
            async with session.post(base + "/tokenize", json={"content": sample}) as r:
                if r.status == 200:
                    n = len((await r.json())["tokens"])
                    self.tpw = max(0.3, n / (sample.count(" ") + 1))
        except aiohttp.ClientError:
            pass
        return self.tpw

    def text(self, rng: random.Random, n_tokens: int) -> str:
        return text_words(rng, max(1, int(n_tokens / self.tpw)))


@dataclass
class Turn:
    kind: str  # shared | own | return
    messages: list
    max_tokens: int


@dataclass
class Client:
    id: int
    kind: str  # shared | own | multi
    turns: list[Turn]
    follow_up: str = ""  # for multi: the second user message
    follow_tokens: int = 0


def build_clients(pm: PromptMaker, n_clients: int, prompt_tokens: tuple[int, int],
                  gen_tokens: tuple[int, int], seed: int = 0, shared_frac: float = 0.5,
                  multi_frac: float = 0.25) -> list[Client]:
    """Client scripts: `shared` = common system prompt + own question; `own` = own system
    prompt; `multi` = common system prompt, then a second turn after the answer."""
    rng = random.Random(seed)
    lo, hi = prompt_tokens
    sys_len = max(8, int(lo * 0.6))
    system = (f"You are a helpful assistant for a library of essays. Answer briefly and stay on "
              f"topic. Background notes: {pm.text(random.Random(seed + 1), sys_len)}")
    clients = []
    for i in range(n_clients):
        r = rng.random()
        kind = "multi" if r < multi_frac else "shared" if r < multi_frac + shared_frac else "own"
        target = rng.randint(lo, hi)
        topic = rng.choice(_TOPICS)
        n_out = rng.randint(*gen_tokens)
        if kind == "own":
            sys_msg = f"You are an expert on {topic}. {pm.text(rng, int(target * 0.5))}"
            user = f"Question {i} about {topic}: {pm.text(rng, int(target * 0.4))}"
        else:
            sys_msg = system
            user = f"Question {i} about {topic}: {pm.text(rng, max(4, target - sys_len - 16))}"
        msgs = [{"role": "system", "content": sys_msg}, {"role": "user", "content": user}]
        c = Client(i, kind, [Turn("shared" if kind != "own" else "own", msgs, n_out)])
        if kind == "multi":
            c.follow_up = f"Thanks. Now tell me more about {topic}: {pm.text(rng, rng.randint(16, 64))}"
            c.follow_tokens = rng.randint(*gen_tokens)
        clients.append(c)
    return clients


# ---------------------------------------------------------------------------------------
# one streamed request


@dataclass
class Result:
    kind: str
    ok: bool = False
    status: int = 0
    error: str = ""
    t_start: float = 0.0
    ttft: float | None = None  # seconds to the first content chunk
    t_total: float = 0.0
    n_chunks: int = 0
    chunk_times: list = field(default_factory=list, repr=False)  # perf_counter of each content chunk
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    text: str = field(default="", repr=False)
    timings: dict = field(default_factory=dict, repr=False)


async def stream_chat(session: aiohttp.ClientSession, base: str, messages: list, max_tokens: int,
                      kind: str = "chat", extra: dict | None = None, drop_after: int | None = None,
                      timeout: float = 3600.0, check_length: bool = True) -> Result:
    """POST a streamed chat request and validate the SSE stream. `drop_after`: close the
    connection after that many content chunks (a client that goes away)."""
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **(extra or {})}
    res = Result(kind=kind)
    res.t_start = t0 = time.perf_counter()
    done = usage_seen = False
    try:
        async with session.post(base + "/v1/chat/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            res.status = r.status
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                return res
            ctype = r.headers.get("Content-Type", "")
            if "text/event-stream" not in ctype:
                res.error = f"content-type {ctype!r}"
                return res
            async for raw in r.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line or line.startswith(":"):
                    continue
                if done:
                    res.error = f"data after [DONE]: {line[:100]}"
                    return res
                if not line.startswith("data: "):
                    res.error = f"not an SSE data line: {line[:100]}"
                    return res
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                try:
                    obj = json.loads(data)
                except ValueError:
                    res.error = f"unparsable frame: {data[:100]}"
                    return res
                if "error" in obj:
                    res.error = f"in-band error: {json.dumps(obj['error'])[:300]}"
                    return res
                for ch in obj.get("choices") or []:
                    content = (ch.get("delta") or {}).get("content")
                    if content:
                        now = time.perf_counter()
                        if res.ttft is None:
                            res.ttft = now - t0
                        res.n_chunks += 1
                        res.chunk_times.append(now)
                        res.text += content
                    if ch.get("finish_reason"):
                        res.finish_reason = ch["finish_reason"]
                if obj.get("usage"):
                    u = obj["usage"]
                    usage_seen = True
                    res.prompt_tokens = int(u.get("prompt_tokens", 0))
                    res.completion_tokens = int(u.get("completion_tokens", 0))
                    res.cached_tokens = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                    res.timings = obj.get("timings") or {}
                if drop_after is not None and res.n_chunks >= drop_after:
                    res.ok = True  # we leave on purpose
                    res.error = "dropped by client"
                    break
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    finally:
        res.t_total = time.perf_counter() - t0
    if drop_after is not None:
        return res
    problems = []
    if not done:
        problems.append("no [DONE]")
    if not usage_seen:
        problems.append("no usage")
    if res.finish_reason is None:
        problems.append("no finish_reason")
    if usage_seen and res.completion_tokens <= 0:
        problems.append("usage.completion_tokens == 0")
    if check_length and usage_seen and res.completion_tokens != max_tokens:
        problems.append(f"completion_tokens {res.completion_tokens} != max_tokens {max_tokens} (ignore_eos)")
    res.error = "; ".join(problems)
    res.ok = not problems
    return res


# ---------------------------------------------------------------------------------------
# misbehaving client


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


async def get_json(session, base, path):
    async with session.get(base + path, timeout=aiohttp.ClientTimeout(total=60)) as r:
        return r.status, (await r.json(content_type=None))


async def metric(session, base, name: str) -> float | None:
    try:
        async with session.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=60)) as r:
            for line in (await r.text()).splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    return None


async def misbehave(session: aiohttp.ClientSession, base: str, n_ctx: int, pm: PromptMaker,
                    oversize_token_limit: int = 6_000_000) -> list[Check]:
    """Bad input while the load runs; each answer is checked."""
    checks: list[Check] = []
    # 1. malformed JSON
    try:
        async with session.post(base + "/v1/chat/completions", data=b'{"messages": [{"role": "user", "content": "hi"}',
                                headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=120)) as r:
            body = await r.json(content_type=None)
            ok = r.status == 400 and "error" in body
            checks.append(Check("malformed JSON -> 400", ok, f"HTTP {r.status} {json.dumps(body)[:160]}"))
    except Exception as e:  # noqa: BLE001
        checks.append(Check("malformed JSON -> 400", False, repr(e)))
    # 2. wrong shape (valid JSON)
    try:
        async with session.post(base + "/v1/chat/completions", json={"messages": "not a list", "stream": True},
                                timeout=aiohttp.ClientTimeout(total=120)) as r:
            body = await r.json(content_type=None)
            checks.append(Check("messages not a list -> 400", r.status == 400 and "error" in body,
                                f"HTTP {r.status}"))
    except Exception as e:  # noqa: BLE001
        checks.append(Check("messages not a list -> 400", False, repr(e)))
    # 3. prompt longer than the context
    name = f"prompt longer than the context (n_ctx {n_ctx}) -> 400"
    try:
        if n_ctx <= 32768:
            long_text = pm.text(random.Random(7), int(n_ctx * 1.3) + 64)
            req = session.post(base + "/v1/chat/completions", timeout=aiohttp.ClientTimeout(total=600),
                               json={"messages": [{"role": "user", "content": long_text}], "stream": True,
                                     "max_tokens": 4})
        elif n_ctx + 16 <= oversize_token_limit:
            # token ids straight to /completion: n_ctx + 16 copies of one ordinary token
            async with session.post(base + "/tokenize", json={"content": " the"}) as r:
                tid = ((await r.json()).get("tokens") or [100])[-1]
            raw = ('{"n_predict":4,"stream":true,"prompt":[' + ",".join([str(tid)] * (n_ctx + 16)) + "]}").encode()
            name += f" ({len(raw) / 2**20:.0f} MiB of token ids)"
            req = session.post(base + "/completion", data=raw, headers={"Content-Type": "application/json"},
                               timeout=aiohttp.ClientTimeout(total=600))
        else:
            req = None
            checks.append(Check(name, True, "skipped: context too large to exceed"))
        if req is not None:
            async with req as r:
                body = await r.json(content_type=None)
                # 413: a token-id body past the server's body limit (--max-body-mib)
                ok = r.status in (400, 413) and "error" in body
                checks.append(Check(name, ok, f"HTTP {r.status} {json.dumps(body)[:200]}"))
    except Exception as e:  # noqa: BLE001
        checks.append(Check(name, False, repr(e)))
    # 4. a client that disconnects mid-stream
    before = await metric(session, base, "llmcore:requests_cancelled_total")
    res = await stream_chat(session, base, [{"role": "user", "content": pm.text(random.Random(9), 40)}],
                            max_tokens=max(8, min(2000, n_ctx // 2)), kind="drop",
                            drop_after=2)
    detail = f"got {res.n_chunks} chunks then closed ({res.error})"
    ok = res.ok and res.n_chunks >= 2
    if ok and before is not None:
        after = before
        for _ in range(300):  # the server notices at its next write
            await asyncio.sleep(0.2)
            after = await metric(session, base, "llmcore:requests_cancelled_total")
            if after is not None and after > before:
                break
        ok = after is not None and after > before
        detail += f"; requests_cancelled_total {before:g} -> {after if after is None else f'{after:g}'}"
    checks.append(Check("client disconnects mid-stream -> request cancelled", ok, detail))
    return checks


# ---------------------------------------------------------------------------------------
# the load


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


@dataclass
class LoadReport:
    clients: int
    requests: int
    ok: int
    errors: int
    error_samples: list
    checks: list
    wall_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    gen_tokens_per_s: float
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    ttft_max: float | None
    alive_after: bool
    final_request_ok: bool
    rss_start: int | None = None
    rss_peak: int | None = None
    announced: tuple | None = None
    within_budget: bool | None = None
    kv_used_peak: int | None = None  # llmcore:kv_used_bytes, polled from /metrics
    host_total: int | None = None
    memory_report: str = ""  # the server's start-up "memory:" log line
    n_ctx: int = 0
    total_slots: int = 0
    by_kind: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (self.errors == 0 and self.ok == self.requests and all(c.ok for c in self.checks)
                and self.alive_after and self.final_request_ok and self.within_budget is not False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


async def run_load(base: str, n_clients: int = 64, prompt_tokens=(512, 1024), gen_tokens=(64, 256),
                   seed: int = 0, bad_input: bool = True, pid: int | None = None,
                   log_text=lambda: "", alive=lambda: True, request_timeout: float = 3600.0,
                   progress: bool = False) -> LoadReport:
    """Run the workload against a server at `base`. `pid`: sample that process's RSS."""
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        _, props = await get_json(session, base, "/props")
        n_ctx = int(props.get("n_ctx") or 0)
        pm = PromptMaker(seed=seed)
        await pm.calibrate(session, base)
        clients = build_clients(pm, n_clients, prompt_tokens, gen_tokens, seed)
        results: list[Result] = []
        first_tokens = asyncio.Event()
        n_first = [0]
        done_count = [0]
        t_load = time.perf_counter()

        def note(res: Result) -> None:
            results.append(res)
            done_count[0] += 1
            if progress:
                print(f"  [{time.perf_counter() - t_load:7.1f} s] {done_count[0]} done: {res.kind} "
                      f"{'ok' if res.ok else 'FAIL ' + res.error[:80]} ttft {res.ttft or 0:.2f} s "
                      f"{res.prompt_tokens}+{res.completion_tokens} tok ({res.cached_tokens} cached)",
                      file=sys.stderr, flush=True)

        async def run_client(c: Client) -> None:
            msgs = c.turns[0].messages
            r1 = await stream_chat(session, base, msgs, c.turns[0].max_tokens, c.kind, timeout=request_timeout)
            note(r1)
            n_first[0] += 1
            if n_first[0] >= max(1, n_clients // 4):
                first_tokens.set()
            if c.kind == "multi" and r1.ok:
                msgs2 = msgs + [{"role": "assistant", "content": r1.text},
                                {"role": "user", "content": c.follow_up}]
                note(await stream_chat(session, base, msgs2, c.follow_tokens, "return", timeout=request_timeout))

        async def bad_client() -> list[Check]:
            try:  # start once a quarter of the first turns are in, so the server is loaded
                await asyncio.wait_for(first_tokens.wait(), timeout=request_timeout)
            except asyncio.TimeoutError:
                pass
            return await misbehave(session, base, n_ctx, pm)

        kv_peak = [None]

        async def poll_kv() -> None:
            while True:
                v = await metric(session, base, "llmcore:kv_used_bytes")
                if v is not None:
                    kv_peak[0] = max(kv_peak[0] or 0, int(v))
                await asyncio.sleep(1.0)

        with (RssSampler(pid) if pid else _Null()) as sampler:
            rss_start = rss_bytes(pid) if pid else None
            jobs = [asyncio.create_task(run_client(c)) for c in clients]
            bad = asyncio.create_task(bad_client()) if bad_input else None
            poller = asyncio.create_task(poll_kv())
            await asyncio.gather(*jobs)
            wall = time.perf_counter() - t_load
            checks = await bad if bad else []
            # the server still serves
            final = await stream_chat(session, base, [{"role": "user", "content": "Say hello."}], 4, "final",
                                      timeout=request_timeout)
            poller.cancel()
        ok_results = [r for r in results if r.ok]
        ttfts = [r.ttft for r in ok_results if r.ttft is not None]
        gen = sum(r.completion_tokens for r in results)
        by_kind: dict = {}
        for r in results:
            k = by_kind.setdefault(r.kind, {"n": 0, "ok": 0, "prompt": 0, "cached": 0, "ttft_p50": None})
            k["n"] += 1
            k["ok"] += r.ok
            k["prompt"] += r.prompt_tokens
            k["cached"] += r.cached_tokens
        for kind, k in by_kind.items():
            k["ttft_p50"] = pct([r.ttft for r in ok_results if r.kind == kind and r.ttft is not None], 0.5)
        announced = announced_memory(props, log_text())
        peak = sampler.peak if pid else None
        within = None
        if announced is not None and peak is not None and rss_start is not None:
            # caches may add `announced` on top of the loaded server; allow request buffers etc.
            within = peak - rss_start <= announced[0] + max(256 << 20, announced[0] // 10)
        plan = ((props.get("cache") or {}).get("memory") or {}) if isinstance(props.get("cache"), dict) else {}
        return LoadReport(
            clients=n_clients, requests=len(results), ok=len(ok_results), errors=len(results) - len(ok_results),
            error_samples=[f"{r.kind}: {r.error}" for r in results if not r.ok][:10], checks=checks,
            wall_s=wall, prompt_tokens=sum(r.prompt_tokens for r in results),
            cached_tokens=sum(r.cached_tokens for r in results), completion_tokens=gen,
            gen_tokens_per_s=gen / wall if wall > 0 else 0.0,
            ttft_p50=pct(ttfts, 0.5), ttft_p90=pct(ttfts, 0.9), ttft_p99=pct(ttfts, 0.99),
            ttft_max=max(ttfts, default=None), alive_after=alive(), final_request_ok=final.ok,
            rss_start=rss_start, rss_peak=peak, announced=announced, within_budget=within,
            kv_used_peak=kv_peak[0], host_total=plan.get("host_total_bytes"), memory_report=memory_line(log_text()),
            n_ctx=n_ctx, total_slots=int(props.get("total_slots") or 0), by_kind=by_kind,
        )


class _Null:
    peak = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _sub(a, b):
    return None if a is None or b is None else a - b


def mib(b: int | None) -> str:
    return "?" if b is None else f"{b / 2**20:.0f} MiB"


def format_report(rep: LoadReport) -> str:
    f = lambda x: "-" if x is None else f"{x:.2f} s"  # noqa: E731
    lines = [
        f"requests: {rep.requests} from {rep.clients} concurrent clients (n_ctx {rep.n_ctx}, {rep.total_slots} slots): "
        f"{rep.ok} ok, {rep.errors} errors",
        f"tokens: prompt {rep.prompt_tokens} ({rep.cached_tokens} cached), generated {rep.completion_tokens} "
        f"in {rep.wall_s:.1f} s = {rep.gen_tokens_per_s:.1f} tok/s aggregate",
        f"TTFT: p50 {f(rep.ttft_p50)}, p90 {f(rep.ttft_p90)}, p99 {f(rep.ttft_p99)}, max {f(rep.ttft_max)}",
        "by kind: " + ", ".join(f"{k} {v['ok']}/{v['n']} ok, {v['cached']}/{v['prompt']} prompt tok cached, "
                                f"TTFT p50 {f(v['ttft_p50'])}" for k, v in sorted(rep.by_kind.items())),
        f"server RSS: start {mib(rep.rss_start)}, peak {mib(rep.rss_peak)} (+{mib(_sub(rep.rss_peak, rep.rss_start))}); "
        f"KV in use peak {mib(rep.kv_used_peak)}; announced cache limit: "
        + (f"{mib(rep.announced[0])} ({rep.announced[1]}) -> growth "
           f"{'within' if rep.within_budget else 'EXCEEDED' if rep.within_budget is False else 'not compared'}"
           if rep.announced else "nothing announced (no memory budget in /props or the start-up log)"),
    ]
    if rep.memory_report:
        lines.append(f"server start-up memory report: {rep.memory_report}")
    for c in rep.checks:
        lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
    lines.append(f"server alive after: {rep.alive_after}; final request ok: {rep.final_request_ok}")
    for e in rep.error_samples:
        lines.append(f"  error: {e}")
    lines.append("PASS" if rep.passed else "FAIL")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="use a running server instead of starting one")
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-np", "--parallel", type=int, default=32)
    ap.add_argument("-c", "--ctx-size", type=int, default=4_500_000)
    ap.add_argument("--ctk", default="q4_0")
    ap.add_argument("--ctv", default="q4_0")
    ap.add_argument("--server-arg", action="append", default=[], help="extra argument for llmcore serve (repeatable)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=(512, 1024))
    ap.add_argument("--gen-tokens", type=int, nargs=2, default=(64, 256))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bad-input", action="store_true")
    ap.add_argument("--timeout", type=float, default=3600.0, help="whole run, seconds")
    ap.add_argument("--json", help="write the report as JSON here")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)

    srv = None
    if a.url:
        base, pid, log_text, alive = a.url.rstrip("/"), None, (lambda: ""), (lambda: True)
    else:
        args = ["-m", a.model, "-np", str(a.parallel), "-c", str(a.ctx_size), "-ctk", a.ctk, "-ctv", a.ctv,
                *a.server_arg]
        srv = ServerProcess(args)
        print("$ " + " ".join(["llmcore", "serve", *args]), file=sys.stderr)
        t0 = time.time()
        srv.start()
        print(f"server up in {time.time() - t0:.1f} s (log: {srv.log_path})", file=sys.stderr)
        base, pid, log_text, alive = srv.url, srv.proc.pid, srv.log_text, srv.alive
    try:
        rep = asyncio.run(asyncio.wait_for(
            run_load(base, a.clients, tuple(a.prompt_tokens), tuple(a.gen_tokens), a.seed, not a.no_bad_input,
                     pid, log_text, alive, request_timeout=a.timeout, progress=not a.quiet),
            timeout=a.timeout))
    except asyncio.TimeoutError:
        print(f"TIMEOUT after {a.timeout:.0f} s; server alive: {alive()}", file=sys.stderr)
        return 2
    finally:
        if srv is not None:
            rc = srv.stop()
            print(f"server stopped (exit code {rc})", file=sys.stderr)
    print(format_report(rep))
    if a.json:
        Path(a.json).write_text(json.dumps(rep.to_dict(), indent=1, default=str))
    return 0 if rep.passed else 1


if __name__ == "__main__":
    sys.exit(main())
