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
    cache_source: str = "none"  # where the current/last task's cached prefix came from
    n_checkpoints: int = 0  # context checkpoints the slot holds
    checkpoint_bytes: int = 0


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
    # cache layer 1: slot prefix reuse (per request: hit = some prefix reused from the slot)
    slot_hits: int = 0
    slot_misses: int = 0
    # cache layer 2: RAM prompt cache
    ram_hits: int = 0  # requests served (partly) from a cached state
    ram_misses: int = 0  # requests for which the cache had nothing
    cache_ram_bytes: int = 0  # bytes counted against the budget (shared blocks once)
    cache_ram_limit_bytes: int = 0  # budget; -1 none, 0 cache off
    cache_ram_entries: int = 0
    cache_ram_tokens: int = 0
    cache_ram_evictions: int = 0
    cache_ram_inserts: int = 0
    cache_save_failures: int = 0
    cache_restore_failures: int = 0
    # cache layer 3: context checkpoints
    checkpoints_created: int = 0
    checkpoints_restored: int = 0
    checkpoints_erased: int = 0
    checkpoint_failures: int = 0
    checkpoints_count: int = 0  # held by slots now (entries' checkpoints are in cache_ram_bytes)
    checkpoints_bytes: int = 0
    forced_reprefills: int = 0  # prompts re-processed from 0 for lack of a checkpoint
    # memory
    kv_used_bytes: int = 0  # KV blocks in use (slots + cache)
    kv_limit_bytes: int = 0
    idle_slot_evictions: int = 0  # idle slots' states dropped for KV room
    kv_full_waits: int = 0  # steps where prefilling requests waited for KV room
    kv_full_failures: int = 0  # requests failed: no KV room even after evicting
    uptime_s: float = 0.0
    slots: tuple[SlotStats, ...] = ()
    model_stats: dict = field(default_factory=dict)  # model-level counters (MoE experts...)

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
    ("llmcore:queue_length", "gauge", "Requests waiting for a slot.", lambda s: s.requests_deferred),
    ("llmcore:slot_cache_hits_total", "counter", "Requests that reused a prefix from their slot.",
     lambda s: s.slot_hits),
    ("llmcore:slot_cache_misses_total", "counter", "Requests that reused nothing from their slot.",
     lambda s: s.slot_misses),
    ("llmcore:prompt_cache_hits_total", "counter", "Requests restored from the RAM prompt cache.",
     lambda s: s.ram_hits),
    ("llmcore:prompt_cache_misses_total", "counter", "Requests for which the RAM prompt cache had nothing.",
     lambda s: s.ram_misses),
    ("llmcore:prompt_cache_bytes", "gauge", "Bytes held by the RAM prompt cache (incl. checkpoints).",
     lambda s: s.cache_ram_bytes),
    ("llmcore:prompt_cache_budget_bytes", "gauge", "RAM prompt cache budget (-1 unbounded, 0 off).",
     lambda s: s.cache_ram_limit_bytes),
    ("llmcore:prompt_cache_entries", "gauge", "Entries in the RAM prompt cache.",
     lambda s: s.cache_ram_entries),
    ("llmcore:prompt_cache_tokens", "gauge", "Tokens in the RAM prompt cache.",
     lambda s: s.cache_ram_tokens),
    ("llmcore:prompt_cache_evictions_total", "counter", "RAM prompt cache evictions.",
     lambda s: s.cache_ram_evictions),
    ("llmcore:prompt_cache_inserts_total", "counter", "States saved to the RAM prompt cache.",
     lambda s: s.cache_ram_inserts),
    ("llmcore:prompt_cache_save_failures_total", "counter", "Failed saves (served as misses).",
     lambda s: s.cache_save_failures),
    ("llmcore:prompt_cache_restore_failures_total", "counter", "Failed restores (served as misses).",
     lambda s: s.cache_restore_failures),
    ("llmcore:checkpoints_created_total", "counter", "Context checkpoints created.",
     lambda s: s.checkpoints_created),
    ("llmcore:checkpoints_restored_total", "counter", "Context checkpoints restored.",
     lambda s: s.checkpoints_restored),
    ("llmcore:checkpoints_erased_total", "counter", "Context checkpoints erased.",
     lambda s: s.checkpoints_erased),
    ("llmcore:checkpoint_failures_total", "counter", "Failed checkpoint creations/restores.",
     lambda s: s.checkpoint_failures),
    ("llmcore:checkpoints", "gauge", "Context checkpoints held by slots.", lambda s: s.checkpoints_count),
    ("llmcore:checkpoints_bytes", "gauge", "Bytes of context checkpoints held by slots.",
     lambda s: s.checkpoints_bytes),
    ("llmcore:forced_reprefills_total", "counter", "Prompts re-processed from 0 for lack of a checkpoint.",
     lambda s: s.forced_reprefills),
    ("llmcore:kv_used_bytes", "gauge", "KV blocks in use (slots and prompt cache).",
     lambda s: s.kv_used_bytes),
    ("llmcore:kv_limit_bytes", "gauge", "Most KV memory the pools may take.", lambda s: s.kv_limit_bytes),
    ("llmcore:idle_slot_evictions_total", "counter", "Idle slots' states dropped for KV room.",
     lambda s: s.idle_slot_evictions),
    ("llmcore:kv_full_waits_total", "counter", "Steps where prefilling requests waited for KV room.",
     lambda s: s.kv_full_waits),
    ("llmcore:kv_full_failures_total", "counter", "Requests failed for lack of KV room.",
     lambda s: s.kv_full_failures),
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
    for key, val in sorted(stats.model_stats.items()):
        if isinstance(val, (int, float)):
            name = "llmcore:model_" + "".join(c if c.isalnum() or c == "_" else "_" for c in key)
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
