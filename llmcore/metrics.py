"""One immutable stats snapshot of the engine, read by /metrics, /slots, logs and the TUI.

The engine thread builds an `EngineStats` on request (cheap: counters and per-slot
numbers). `to_prometheus` renders it with llama-server's metric names (`llamacpp:*`)
plus llmcore's own (`llmcore:*`), so existing scrapers and dashboards keep working.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SlotStats:
    id: int
    state: str  # idle | prefill | decode
    n_ctx: int
    n_tokens: int  # tokens whose state the slot holds (live KV)
    task_id: int | None = None
    n_prompt: int = 0  # prompt tokens of the current/last task
    n_cached: int = 0  # of which reused from the slot's state
    n_prefilled: int = 0  # prompt tokens evaluated so far
    n_decoded: int = 0  # tokens generated so far
    prompt_per_second: float = 0.0
    predicted_per_second: float = 0.0
    t_last_used: float = 0.0  # time.time() at release
    nbytes: int = 0  # bytes held by the slot's state


@dataclass(frozen=True)
class EngineStats:
    time: float = field(default_factory=time.time)
    status: str = "loading"  # loading | ok | error
    model: str = ""
    n_ctx: int = 0
    n_ctx_slot: int = 0
    n_slots: int = 0
    requests_total: int = 0  # finished requests (any reason)
    requests_processing: int = 0
    requests_deferred: int = 0  # waiting for a slot
    requests_errors: int = 0
    requests_cancelled: int = 0
    prompt_tokens_total: int = 0  # prompt tokens evaluated (not counting cache reuse)
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    cache_tokens_total: int = 0  # prompt tokens reused from a slot's state
    n_decode_total: int = 0  # model.forward calls
    n_busy_slots_total: int = 0  # sum over forward calls of slots in the batch
    n_tokens_max: int = 0  # most tokens held by any slot so far
    uptime_s: float = 0.0
    slots: tuple[SlotStats, ...] = ()
    cache: dict = field(default_factory=dict)  # extra numbers from cache layers (name -> number)

    @property
    def prompt_tokens_seconds(self) -> float:
        """Average prompt throughput (tokens/s) over the whole run."""
        s = self.prompt_seconds_total
        return self.prompt_tokens_total / s if s > 0 else 0.0

    @property
    def predicted_tokens_seconds(self) -> float:
        s = self.tokens_predicted_seconds_total
        return self.tokens_predicted_total / s if s > 0 else 0.0

    @property
    def n_busy_slots_per_decode(self) -> float:
        return self.n_busy_slots_total / self.n_decode_total if self.n_decode_total else 0.0

    @property
    def kv_tokens(self) -> int:
        return sum(s.n_tokens for s in self.slots)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prompt_tokens_seconds"] = self.prompt_tokens_seconds
        d["predicted_tokens_seconds"] = self.predicted_tokens_seconds
        d["n_busy_slots_per_decode"] = self.n_busy_slots_per_decode
        return d


_METRICS = [
    # name, type, help, getter
    ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
     lambda s: s.prompt_tokens_total),
    ("llamacpp:prompt_seconds_total", "counter", "Prompt process time",
     lambda s: s.prompt_seconds_total),
    ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
     lambda s: s.tokens_predicted_total),
    ("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time",
     lambda s: s.tokens_predicted_seconds_total),
    ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls",
     lambda s: s.n_decode_total),
    ("llamacpp:n_busy_slots_per_decode", "counter", "Average number of busy slots per llama_decode() call",
     lambda s: s.n_busy_slots_per_decode),
    ("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
     lambda s: s.prompt_tokens_seconds),
    ("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
     lambda s: s.predicted_tokens_seconds),
    ("llamacpp:kv_cache_tokens", "gauge", "KV-cache tokens.", lambda s: s.kv_tokens),
    ("llamacpp:requests_processing", "gauge", "Number of requests processing.",
     lambda s: s.requests_processing),
    ("llamacpp:requests_deferred", "gauge", "Number of requests deferred.",
     lambda s: s.requests_deferred),
    ("llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.", lambda s: s.n_tokens_max),
    ("llmcore:requests_total", "counter", "Finished requests.", lambda s: s.requests_total),
    ("llmcore:requests_errors_total", "counter", "Requests failed with an error.",
     lambda s: s.requests_errors),
    ("llmcore:requests_cancelled_total", "counter", "Requests cancelled (client gone).",
     lambda s: s.requests_cancelled),
    ("llmcore:prompt_tokens_cached_total", "counter", "Prompt tokens reused from slot state.",
     lambda s: s.cache_tokens_total),
    ("llmcore:slots_total", "gauge", "Number of slots.", lambda s: s.n_slots),
    ("llmcore:uptime_seconds", "gauge", "Seconds since the engine started.", lambda s: s.uptime_s),
]


def _num(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def to_prometheus(stats: EngineStats) -> str:
    lines = []
    for name, typ, help_, get in _METRICS:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {typ}")
        lines.append(f"{name} {_num(get(stats))}")
    for key, val in sorted(stats.cache.items()):
        if isinstance(val, (int, float)):
            name = "llmcore:cache_" + "".join(c if c.isalnum() or c == "_" else "_" for c in key)
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {_num(val)}")
    return "\n".join(lines) + "\n"


def parse_prometheus(text: str) -> dict[str, float]:
    """Tiny parser for our own exposition (tests, TUI over HTTP): name -> value."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, val = line.rpartition(" ")
        out[name] = float(val)
    return out
