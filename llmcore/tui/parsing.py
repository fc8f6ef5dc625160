"""Snapshots from what a source reads: an in-process `EngineStats`, or a server's `/slots`
(list), `/metrics` (Prometheus text) and `/props` (dict). Both give the same `Snapshot`:
the metrics table in `llmcore.metrics` maps each Prometheus name back to its field."""
from __future__ import annotations

import time
from typing import Any

from ..metrics import FIELD_OF, EngineStats, model_stat_key, parse_prometheus, split_replica_label
from .snapshot import Snapshot


# of the memory plan (/props "cache"."memory", Engine.memory_plan): the budgets the gauges show
MEMORY_FIELDS = ("kv_slots_max_bytes", "kv_max_bytes", "cache_ram_max_bytes", "checkpoints_max_bytes")


def memory_numbers(plan: Any) -> dict[str, int]:
    plan = plan if isinstance(plan, dict) else {}
    return {k: plan[k] for k in MEMORY_FIELDS if isinstance(plan.get(k), (int, float))}


def from_engine_stats(st: EngineStats, t: float | None = None, memory_plan: Any = None) -> Snapshot:
    d = st.to_dict()
    d.update(memory_numbers(memory_plan))
    slots = tuple(d.pop("slots"))
    model_stats = _numbers(d.pop("model_stats"))
    d.pop("replicas")
    replicas = tuple(_replica(r) for r in st.replicas)
    return Snapshot(time=t if t is not None else float(d.get("time") or time.time()),
                    stats=d, slots=slots, model_stats=model_stats, replicas=replicas)


def _replica(st: EngineStats) -> dict[str, Any]:
    d = st.to_dict()
    for k in ("slots", "model_stats", "replicas"):
        d.pop(k)
    return d


def from_http(slots_json: Any, metrics_text: str | None, props_json: Any,
              t: float | None = None) -> Snapshot:
    """Any of the three may be None (route missing or failed): its fields are absent."""
    stats: dict[str, Any] = {}
    model_stats: dict[str, float] = {}
    per_replica: dict[int, dict[str, Any]] = {}
    for name, val in parse_prometheus(metrics_text or "").items():
        key = model_stat_key(name)
        base, replica = split_replica_label(name)
        if replica is not None:  # a fleet's series of one replica
            if base in FIELD_OF:
                per_replica.setdefault(replica, {})[FIELD_OF[base]] = val
        elif name in FIELD_OF:
            stats[FIELD_OF[name]] = val
        elif key is not None:
            model_stats[key] = val
        elif ":" in name and "{" not in name:  # a series this client does not know yet
            stats.setdefault(name.split(":", 1)[1], val)
    _ints(stats)
    _ints(model_stats)
    props = props_json if isinstance(props_json, dict) else {}
    if props:
        stats["status"] = props.get("status", "ok")
        stats["model"] = props.get("model_alias") or props.get("model_path") or ""
        if "total_slots" in props:
            stats["n_slots"] = props["total_slots"]
        if "n_ctx" in props:
            stats["n_ctx_slot"] = props["n_ctx"]
        cache = props.get("cache") if isinstance(props.get("cache"), dict) else {}
        if "n_ctx_total" in cache:
            stats["n_ctx"] = cache["n_ctx_total"]
        stats.update(memory_numbers(cache.get("memory")))
    slots = []
    for s in slots_json if isinstance(slots_json, list) else ():
        if not isinstance(s, dict):
            continue
        d = dict(s)
        if "task_id" not in d:  # llama-server's names
            tid = d.get("id_task")
            d["task_id"] = None if tid is None or tid == -1 else tid
        if "state" not in d and "is_processing" in d:
            d["state"] = "busy" if d["is_processing"] else "idle"
        slots.append(d)
    if slots:
        stats.setdefault("n_slots", len(slots))
    replicas = []
    for i in range(max(per_replica) + 1 if per_replica else 0):
        r = per_replica.get(i, {})
        _ints(r)
        r["status"] = "ok" if r.get("engines_ready") else "down"
        replicas.append(r)
    return Snapshot(time=time.time() if t is None else t, stats=stats, slots=tuple(slots),
                    model_stats=model_stats, replicas=tuple(replicas))


def _ints(d: dict[str, Any]) -> None:
    """The text format prints every number as a float: show whole counts as ints again."""
    for k, v in d.items():
        if isinstance(v, float) and v.is_integer() and not k.endswith(("seconds", "_s", "seconds_total")):
            d[k] = int(v)


def _numbers(d: dict) -> dict[str, float]:
    return {str(k): v for k, v in d.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
