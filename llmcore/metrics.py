"""The engine's numbers in one place, for every reader: `/metrics`, `/slots`, the dashboard
and its log lines (`llmcore tui --no-tui`).

- `EngineStats` / `SlotStats`: one immutable snapshot, built by the engine thread on request
  (cheap: counters and per-slot numbers). Derived values are properties, so every metric
  names one attribute.
- `METRICS`: the public table, one `Metric` (Prometheus name, type, help, EngineStats
  attribute) per series. Names are llama-server's (`llamacpp:*`) plus llmcore's own
  (`llmcore:*`), so existing scrapers and dashboards keep working.
- `to_prometheus` / `parse_prometheus`: the text exposition and its one parser;
  `slots_json`: the `/slots` body.

A fleet of engines (llmcore.cluster) reports one `EngineStats` of the whole fleet whose
`replicas` hold each replica's own; `/metrics` then shows every series once for the fleet
and once per replica, labelled `{replica="i"}`.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Literal

MetricType = Literal["counter", "gauge"]


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
    replica: int | None = None  # in a fleet: the replica that owns the slot


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
    # the RAM cache's disk tier (--cache-dir)
    disk_hits: int = 0  # requests served (partly) from a state read back from disk
    disk_misses: int = 0  # requests for which the disk tier had nothing
    disk_wait_timeouts: int = 0  # requests that started before their state was read
    disk_adopt_failures: int = 0  # states read but not brought into RAM
    cache_disk_bytes: int = 0  # bytes of the indexed files
    cache_disk_limit_bytes: int = 0  # budget; -1 none, 0 tier off
    cache_disk_entries: int = 0
    cache_disk_tokens: int = 0
    cache_disk_evictions: int = 0
    cache_disk_pending_bytes: int = 0  # of writes queued on the I/O thread
    disk_writes: int = 0
    disk_write_failures: int = 0  # full disk, read-only directory, I/O errors
    disk_writes_skipped: int = 0  # not written: too many bytes already queued
    disk_loads: int = 0
    disk_load_failures: int = 0  # torn, corrupt, foreign or unreadable files (misses)
    # cache layer 3: context checkpoints
    checkpoints_created: int = 0
    checkpoints_restored: int = 0
    checkpoints_erased: int = 0
    checkpoint_failures: int = 0
    checkpoints_skipped: int = 0  # not taken: the server-wide checkpoint budget was full
    checkpoints_count: int = 0  # held by slots now (entries' checkpoints are in cache_ram_bytes)
    checkpoints_bytes: int = 0
    checkpoints_live: int = 0  # every live checkpoint (slots and RAM cache; shared ones once)
    checkpoints_live_bytes: int = 0  # counted against the checkpoint budget
    checkpoints_budget_bytes: int = 0  # -1 unbounded
    forced_reprefills: int = 0  # prompts re-processed from 0 for lack of a checkpoint
    # speculative decoding
    spec_draft_tokens: int = 0  # drafted tokens verified
    spec_accepted_tokens: int = 0  # of which kept
    # memory
    kv_used_bytes: int = 0  # KV blocks in use (slots + cache)
    kv_allocated_bytes: int = 0  # the pools' storage (grown on demand, never shrunk)
    kv_limit_bytes: int = 0
    idle_slot_evictions: int = 0  # idle slots' states dropped for KV room
    kv_full_waits: int = 0  # steps where prefilling requests waited for KV room
    kv_full_failures: int = 0  # requests failed: no KV room even after evicting
    uptime_s: float = 0.0
    slots: tuple[SlotStats, ...] = ()
    # model-level counters from the model's stats() (e.g. MoE experts computed / skipped)
    model_stats: dict[str, float] = field(default_factory=dict)
    # a fleet's stats: each replica's own, in replica order (empty for one engine)
    replicas: tuple["EngineStats", ...] = ()

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

    @property
    def engines_ready(self) -> int:
        """Engines that serve now: of a fleet, its replicas that answer; else 1 or 0."""
        if self.replicas:
            return sum(r.engines_ready for r in self.replicas)
        return int(self.status == "ok")

    def to_dict(self) -> dict:
        """Every field, plus the derived values the metrics table reads."""
        d = asdict(self)
        for name in DERIVED_FIELDS:
            d[name] = getattr(self, name)
        return d


@dataclass(frozen=True)
class Metric:
    """One Prometheus series: its value is `getattr(stats, field)` of an `EngineStats`."""

    name: str
    type: MetricType
    help: str
    field: str

    def value(self, stats: EngineStats) -> int | float:
        return getattr(stats, self.field)


METRICS: tuple[Metric, ...] = (
    Metric("llamacpp:prompt_tokens_total", "counter",
           "Number of prompt tokens processed.", "prompt_tokens_total"),
    Metric("llamacpp:prompt_seconds_total", "counter", "Prompt process time", "prompt_seconds_total"),
    Metric("llamacpp:tokens_predicted_total", "counter",
           "Number of generation tokens processed.", "tokens_predicted_total"),
    Metric("llamacpp:tokens_predicted_seconds_total", "counter",
           "Predict process time", "tokens_predicted_seconds_total"),
    Metric("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", "n_decode_total"),
    Metric("llamacpp:n_busy_slots_per_decode", "counter",
           "Average number of busy slots per llama_decode() call", "n_busy_slots_per_decode"),
    Metric("llamacpp:prompt_tokens_seconds", "gauge",
           "Average prompt throughput in tokens/s.", "prompt_tokens_seconds"),
    Metric("llamacpp:predicted_tokens_seconds", "gauge",
           "Average generation throughput in tokens/s.", "predicted_tokens_seconds"),
    Metric("llamacpp:kv_cache_tokens", "gauge", "KV-cache tokens.", "kv_tokens"),
    Metric("llamacpp:requests_processing", "gauge", "Number of requests processing.", "requests_processing"),
    Metric("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", "requests_deferred"),
    Metric("llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.", "n_tokens_max"),
    Metric("llmcore:requests_total", "counter", "Finished requests.", "requests_total"),
    Metric("llmcore:requests_errors_total", "counter", "Requests failed with an error.", "requests_errors"),
    Metric("llmcore:requests_cancelled_total", "counter",
           "Requests cancelled (client gone).", "requests_cancelled"),
    Metric("llmcore:prompt_tokens_cached_total", "counter",
           "Prompt tokens reused from slot state.", "cache_tokens_total"),
    Metric("llmcore:slots_total", "gauge", "Number of slots.", "n_slots"),
    Metric("llmcore:queue_length", "gauge", "Requests waiting for a slot.", "requests_deferred"),
    Metric("llmcore:slot_cache_hits_total", "counter",
           "Requests that reused a prefix from their slot.", "slot_hits"),
    Metric("llmcore:slot_cache_misses_total", "counter",
           "Requests that reused nothing from their slot.", "slot_misses"),
    Metric("llmcore:prompt_cache_hits_total", "counter",
           "Requests restored from the RAM prompt cache.", "ram_hits"),
    Metric("llmcore:prompt_cache_misses_total", "counter",
           "Requests for which the RAM prompt cache had nothing.", "ram_misses"),
    Metric("llmcore:prompt_cache_bytes", "gauge",
           "Bytes held by the RAM prompt cache (incl. checkpoints).", "cache_ram_bytes"),
    Metric("llmcore:prompt_cache_budget_bytes", "gauge",
           "RAM prompt cache budget (-1 unbounded, 0 off).", "cache_ram_limit_bytes"),
    Metric("llmcore:prompt_cache_entries", "gauge", "Entries in the RAM prompt cache.", "cache_ram_entries"),
    Metric("llmcore:prompt_cache_tokens", "gauge", "Tokens in the RAM prompt cache.", "cache_ram_tokens"),
    Metric("llmcore:prompt_cache_evictions_total", "counter",
           "RAM prompt cache evictions.", "cache_ram_evictions"),
    Metric("llmcore:prompt_cache_inserts_total", "counter",
           "States saved to the RAM prompt cache.", "cache_ram_inserts"),
    Metric("llmcore:prompt_cache_save_failures_total", "counter",
           "Failed saves (served as misses).", "cache_save_failures"),
    Metric("llmcore:prompt_cache_restore_failures_total", "counter",
           "Failed restores (served as misses).", "cache_restore_failures"),
    Metric("llmcore:disk_cache_hits_total", "counter",
           "Requests served from a state read back from the disk tier.", "disk_hits"),
    Metric("llmcore:disk_cache_misses_total", "counter",
           "Requests for which the disk tier had nothing.", "disk_misses"),
    Metric("llmcore:disk_cache_wait_timeouts_total", "counter",
           "Requests that started before their state was read from disk.", "disk_wait_timeouts"),
    Metric("llmcore:disk_cache_adopt_failures_total", "counter",
           "States read from disk that could not be brought into RAM.", "disk_adopt_failures"),
    Metric("llmcore:disk_cache_bytes", "gauge", "Bytes of the disk tier's files.", "cache_disk_bytes"),
    Metric("llmcore:disk_cache_budget_bytes", "gauge",
           "Disk tier budget (-1 unbounded, 0 off).", "cache_disk_limit_bytes"),
    Metric("llmcore:disk_cache_entries", "gauge", "Entries in the disk tier.", "cache_disk_entries"),
    Metric("llmcore:disk_cache_tokens", "gauge", "Tokens in the disk tier.", "cache_disk_tokens"),
    Metric("llmcore:disk_cache_evictions_total", "counter",
           "Disk tier files deleted for the budget.", "cache_disk_evictions"),
    Metric("llmcore:disk_cache_pending_bytes", "gauge",
           "Bytes of states queued for writing.", "cache_disk_pending_bytes"),
    Metric("llmcore:disk_cache_writes_total", "counter", "States written to the disk tier.", "disk_writes"),
    Metric("llmcore:disk_cache_write_failures_total", "counter",
           "Failed disk tier writes (full disk, read-only directory).", "disk_write_failures"),
    Metric("llmcore:disk_cache_writes_skipped_total", "counter",
           "Evicted states not written (too many bytes queued).", "disk_writes_skipped"),
    Metric("llmcore:disk_cache_loads_total", "counter", "States read from the disk tier.", "disk_loads"),
    Metric("llmcore:disk_cache_load_failures_total", "counter",
           "Torn, corrupt, foreign or unreadable disk tier files (served as misses).", "disk_load_failures"),
    Metric("llmcore:checkpoints_created_total", "counter",
           "Context checkpoints created.", "checkpoints_created"),
    Metric("llmcore:checkpoints_restored_total", "counter",
           "Context checkpoints restored.", "checkpoints_restored"),
    Metric("llmcore:checkpoints_erased_total", "counter", "Context checkpoints erased.", "checkpoints_erased"),
    Metric("llmcore:checkpoint_failures_total", "counter",
           "Failed checkpoint creations/restores.", "checkpoint_failures"),
    Metric("llmcore:checkpoints_skipped_total", "counter",
           "Checkpoints not taken because the checkpoint budget was full.", "checkpoints_skipped"),
    Metric("llmcore:checkpoints_live_bytes", "gauge",
           "Bytes of every live checkpoint (slots and RAM cache).", "checkpoints_live_bytes"),
    Metric("llmcore:checkpoints_budget_bytes", "gauge",
           "Server-wide checkpoint budget (-1 unbounded).", "checkpoints_budget_bytes"),
    Metric("llmcore:checkpoints", "gauge", "Context checkpoints held by slots.", "checkpoints_count"),
    Metric("llmcore:checkpoints_bytes", "gauge",
           "Bytes of context checkpoints held by slots.", "checkpoints_bytes"),
    Metric("llmcore:forced_reprefills_total", "counter",
           "Prompts re-processed from 0 for lack of a checkpoint.", "forced_reprefills"),
    Metric("llmcore:spec_draft_tokens_total", "counter",
           "Speculative decoding: drafted tokens verified.", "spec_draft_tokens"),
    Metric("llmcore:spec_accepted_tokens_total", "counter",
           "Speculative decoding: drafted tokens kept.", "spec_accepted_tokens"),
    Metric("llmcore:kv_used_bytes", "gauge", "KV blocks in use (slots and prompt cache).", "kv_used_bytes"),
    Metric("llmcore:kv_allocated_bytes", "gauge",
           "KV pool storage allocated (used and free blocks).", "kv_allocated_bytes"),
    Metric("llmcore:kv_limit_bytes", "gauge", "Most KV memory the pools may take.", "kv_limit_bytes"),
    Metric("llmcore:idle_slot_evictions_total", "counter",
           "Idle slots' states dropped for KV room.", "idle_slot_evictions"),
    Metric("llmcore:kv_full_waits_total", "counter",
           "Steps where prefilling requests waited for KV room.", "kv_full_waits"),
    Metric("llmcore:kv_full_failures_total", "counter",
           "Requests failed for lack of KV room.", "kv_full_failures"),
    Metric("llmcore:uptime_seconds", "gauge", "Seconds since the engine started.", "uptime_s"),
    Metric("llmcore:engines_ready", "gauge",
           "Engines serving now (a fleet: its replicas that answer).", "engines_ready"),
)

# Prometheus name -> EngineStats attribute (several names may read one attribute).
FIELD_OF: dict[str, str] = {m.name: m.field for m in METRICS}
# The attributes the table reads that are properties, not dataclass fields.
DERIVED_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(
    m.field for m in METRICS if isinstance(getattr(EngineStats, m.field, None), property)))

# `EngineStats.model_stats[key]` is the gauge `llmcore:model_<key>`.
MODEL_STAT_PREFIX = "llmcore:model_"
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def model_stat_name(key: str) -> str:
    return MODEL_STAT_PREFIX + _NOT_NAME.sub("_", key)


def model_stat_key(name: str) -> str | None:
    """The model_stats key of a Prometheus name `llmcore:model_<key>`, else None."""
    return name[len(MODEL_STAT_PREFIX):] if name.startswith(MODEL_STAT_PREFIX) else None


def _num(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def replica_label(i: int) -> str:
    return f'{{replica="{i}"}}'


def to_prometheus(stats: EngineStats) -> str:
    """The `/metrics` body (Prometheus text exposition 0.0.4). A fleet's series come once
    unlabelled (the whole fleet, what single-engine scrapers read) and once per replica."""
    lines = []
    labelled = [(replica_label(i), r) for i, r in enumerate(stats.replicas)]
    for m in METRICS:
        lines.append(f"# HELP {m.name} {m.help}")
        lines.append(f"# TYPE {m.name} {m.type}")
        lines.append(f"{m.name} {_num(m.value(stats))}")
        lines.extend(f"{m.name}{label} {_num(m.value(r))}" for label, r in labelled)
    for key, val in sorted(stats.model_stats.items()):
        if isinstance(val, (int, float)):
            name = model_stat_name(key)
            lines.append(f"# HELP {name} Model counter {key}.")
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {_num(val)}")
            lines.extend(f"{name}{label} {_num(r.model_stats[key])}" for label, r in labelled
                         if isinstance(r.model_stats.get(key), (int, float)))
    return "\n".join(lines) + "\n"


_REPLICA_LABEL = re.compile(r'^(.*)\{replica="(\d+)"\}$')


def split_replica_label(name: str) -> tuple[str, int | None]:
    """`name{replica="3"}` -> ("name", 3); any other name -> (name, None)."""
    m = _REPLICA_LABEL.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*(?:\{[^}]*\})?)\s+(\S+)(?:\s+\d+)?$")


def parse_prometheus(text: str) -> dict[str, float]:
    """name -> value for a Prometheus text exposition. Labels stay part of the name and lines
    that do not parse are skipped, so a reader never fails on a series it does not know."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m:  # blank, comment, or not a sample
            continue
        try:
            out[m.group(1)] = float(m.group(2))
        except ValueError:
            continue
    return out


def slots_json(stats: EngineStats) -> list[dict]:
    """The `/slots` body: one object per slot, with llmcore's names and llama-server's."""
    return [{
        "id": s.id, "n_ctx": s.n_ctx, "is_processing": s.state != "idle", "state": s.state,
        "id_task": s.task_id if s.task_id is not None else -1, "n_tokens": s.n_tokens,
        "n_prompt": s.n_prompt, "n_cached": s.n_cached, "n_prefilled": s.n_prefilled,
        "n_decoded": s.n_decoded, "prompt_per_second": s.prompt_per_second,
        "predicted_per_second": s.predicted_per_second, "nbytes": s.nbytes,
        "t_last_used": s.t_last_used,
        # llama-server's names for the same numbers
        "n_prompt_tokens": s.n_prompt, "n_prompt_tokens_cache": s.n_cached,
        "n_prompt_tokens_processed": s.n_prefilled,
        "next_token": [{"has_next_token": s.state != "idle", "n_decoded": s.n_decoded}],
        "cache_source": s.cache_source, "n_checkpoints": s.n_checkpoints,
        "checkpoint_bytes": s.checkpoint_bytes,
        **({"replica": s.replica} if s.replica is not None else {}),
    } for s in stats.slots]
