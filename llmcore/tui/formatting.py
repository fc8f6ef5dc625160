"""Numbers as the dashboard prints them: short strings with units ("-" for a missing
number), the cache gauges and hit/miss rows, the slot table's cells, and the text and JSON
lines of `--once` / `--no-tui`."""
from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .snapshot import Snapshot

if TYPE_CHECKING:
    from .history import History

DASH = "-"


# ---- one number ------------------------------------------------------------------------
def fmt_num(v, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return DASH
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v):,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def fmt_bytes(v) -> str:
    if v is None:
        return DASH
    v = float(v)
    if v < 0:
        return "no limit"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return DASH  # pragma: no cover


def fmt_duration(s) -> str:
    if s is None:
        return DASH
    s = int(s)
    h, r = divmod(s, 3600)
    m, sec = divmod(r, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def fmt_rate(v) -> str:
    return DASH if v is None else f"{float(v):.1f}"


def model_label(model) -> str:
    """A model path shown by its file name."""
    if not model:
        return DASH
    return str(model).replace("\\", "/").rsplit("/", 1)[-1]


def level(frac: float | None) -> str:
    """Health colour class for a used/capacity fraction (fixed thresholds)."""
    if frac is None:
        return "unknown"
    return "red" if frac > 0.92 else "yellow" if frac > 0.80 else "green"


# ---- the cache layers' numbers -----------------------------------------------------------
# Stats fields that belong to the cache layers and memory (EngineStats names).
CACHE_FIELD_PREFIXES = ("slot_hits", "slot_misses", "ram_", "cache_ram", "cache_save", "cache_restore",
                        "checkpoint", "forced_", "kv_", "idle_slot")


def cache_numbers(snap: Snapshot) -> dict[str, float]:
    """The snapshot's cache-layer and memory numbers (what the cache pane shows)."""
    return {k: v for k, v in snap.stats.items()
            if k.startswith(CACHE_FIELD_PREFIXES) and isinstance(v, (int, float)) and not isinstance(v, bool)}


GAUGES = (  # label, used field, capacity field, unit
    ("KV memory", "kv_used_bytes", "kv_limit_bytes", "bytes"),
    ("RAM cache", "cache_ram_bytes", "cache_ram_limit_bytes", "bytes"),
)


def gauges(cache: Mapping[str, float]) -> list[tuple[str, float | None, float | None, str]]:
    """(label, used, capacity, unit) for each gauge; capacity < 0 means no limit, 0 off
    (RAM cache) or unknown."""
    return [(label, cache.get(used), cache.get(cap), unit) for label, used, cap, unit in GAUGES]


def gauge_text(label: str, used, cap, unit: str) -> tuple[str, float | None]:
    """("used / capacity pct", fraction or None) for one gauge."""
    f = fmt_bytes if unit == "bytes" else fmt_num
    if cap is None:
        cap_s = DASH
    elif cap < 0:
        cap_s = "no limit"
    elif cap == 0:
        cap_s = "off" if label == "RAM cache" else DASH
    else:
        cap_s = f(cap)
    frac = float(used) / float(cap) if used is not None and cap is not None and cap > 0 else None
    return f"{f(used)} / {cap_s}" + (f" ({100 * frac:.0f}%)" if frac is not None else ""), frac


def gauge_keys(cache: Mapping[str, float]) -> set[str]:
    """The fields the gauges show (so the list of other numbers skips them)."""
    return {k for _, used, cap, _ in GAUGES for k in (used, cap) if k in cache}


HITS = (  # layer, hits field, misses field
    ("slot reuse", "slot_hits", "slot_misses"),
    ("RAM cache", "ram_hits", "ram_misses"),
)


def hit_table(cache: Mapping[str, float]) -> list[tuple[str, float | None, float | None]]:
    """(layer, hits, misses) for every layer the numbers report."""
    return [(layer, cache.get(h), cache.get(m)) for layer, h, m in HITS if h in cache or m in cache]


def hit_keys(cache: Mapping[str, float]) -> set[str]:
    return {k for _, h, m in HITS for k in (h, m) if k in cache}


def number_rows(numbers: Mapping[str, float]) -> Iterable[tuple[str, str]]:
    """Every number as (name, formatted value), bytes formatted as sizes."""
    for k in sorted(numbers):
        v = numbers[k]
        yield k, fmt_bytes(v) if k.endswith("bytes") else fmt_num(v)


# ---- the slot table --------------------------------------------------------------------------
SLOT_COLUMNS = ("slot", "state", "task", "prompt cached/done/all", "hit layer", "generated",
                "kv tokens", "ckpts", "prompt t/s", "gen t/s")


def slot_row(s: Mapping[str, Any]) -> tuple[str, ...]:
    """One slot as the table's cells (SLOT_COLUMNS); missing fields show as "-"."""
    g = s.get
    task = g("task_id")
    parts = (g("n_cached"), g("n_prefilled"), g("n_prompt"))
    prompt = DASH if all(p is None for p in parts) else "/".join(fmt_num(p) for p in parts)
    return (fmt_num(g("id")), str(g("state") or DASH), DASH if task is None else str(task), prompt,
            str(g("cache_source") or DASH), fmt_num(g("n_decoded")), fmt_num(g("n_tokens")),
            fmt_num(g("n_checkpoints")), fmt_rate(g("prompt_per_second")),
            fmt_rate(g("predicted_per_second")))


# ---- headless output ---------------------------------------------------------------------
def to_json(snap: Snapshot) -> str:
    return json.dumps(snap.to_dict(), default=str, sort_keys=True)


def to_text(snap: Snapshot, history: History | None = None) -> str:
    """Human-readable snapshot (for `--once` and `--no-tui`)."""
    ts = time.strftime("%H:%M:%S", time.localtime(snap.time))
    if not snap.connected:
        return f"[{ts}] connection lost: {snap.error}"
    g = snap.get
    lines = [
        f"[{ts}] {model_label(g('model'))}  status {g('status') or DASH}  up {fmt_duration(g('uptime_s'))}"
        f"  slots {fmt_num(g('n_slots'))}  n_ctx/slot {fmt_num(g('n_ctx_slot'))}",
        f"requests: processing {fmt_num(g('requests_processing'))}  queued {fmt_num(g('requests_deferred'))}"
        f"  done {fmt_num(g('requests_total'))}  errors {fmt_num(g('requests_errors'))}"
        f"  cancelled {fmt_num(g('requests_cancelled'))}",
        f"tokens: prompt {fmt_num(g('prompt_tokens_total'))} ({fmt_rate(g('prompt_tokens_seconds'))} t/s avg)"
        f"  cached {fmt_num(g('cache_tokens_total'))}  generated {fmt_num(g('tokens_predicted_total'))}"
        f" ({fmt_rate(g('predicted_tokens_seconds'))} t/s avg)",
    ]
    if history is not None and (history.prompt_tps or history.gen_tps):
        lines.append(f"now: prompt {fmt_rate(history.prompt_tps[-1] if history.prompt_tps else None)} t/s"
                     f"  gen {fmt_rate(history.gen_tps[-1] if history.gen_tps else None)} t/s")
    if snap.model_stats:
        lines.append("model: " + "  ".join(f"{k} {v}" for k, v in number_rows(snap.model_stats)))
    cache = cache_numbers(snap)
    for label, used, cap, unit in gauges(cache):
        lines.append(f"{label}: {gauge_text(label, used, cap, unit)[0]}")
    hits = hit_table(cache)
    if hits:
        lines.append("hits/misses: " + "  ".join(f"{l} {fmt_num(h)}/{fmt_num(m)}" for l, h, m in hits))
    rows = [SLOT_COLUMNS] + [slot_row(s) for s in snap.slots]
    widths = [max(len(r[i]) for r in rows) for i in range(len(SLOT_COLUMNS))]
    for r in rows:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return "\n".join(lines)
