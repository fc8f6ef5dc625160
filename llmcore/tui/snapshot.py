"""What the dashboard shows, as plain data: one `Snapshot` per poll, the history of
rates, and the events found by comparing two snapshots. No Textual here, so all of it
is tested without a terminal, and `--once` / `--no-tui` print the same numbers.

A snapshot is built from an in-process `EngineStats` or from a server's `/slots`,
`/metrics` and `/props` over HTTP. Both give the same flat `stats` dict (EngineStats
field names) plus `slots` (list of dicts) and `cache` (name -> number). Any field may be
missing (an older server, a cache layer not there yet): readers use `.get` and show "-".
"""
from __future__ import annotations

import json
import math
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

DASH = "-"

# Prometheus name -> EngineStats field name. Read from llmcore.metrics' own table (each
# getter reads one attribute), so a metric added there shows up here; the static part
# covers servers older than this client.
PROM_FIELDS = {
    "llamacpp:prompt_tokens_total": "prompt_tokens_total",
    "llamacpp:prompt_seconds_total": "prompt_seconds_total",
    "llamacpp:tokens_predicted_total": "tokens_predicted_total",
    "llamacpp:tokens_predicted_seconds_total": "tokens_predicted_seconds_total",
    "llamacpp:n_decode_total": "n_decode_total",
    "llamacpp:n_busy_slots_per_decode": "n_busy_slots_per_decode",
    "llamacpp:prompt_tokens_seconds": "prompt_tokens_seconds",
    "llamacpp:predicted_tokens_seconds": "predicted_tokens_seconds",
    "llamacpp:kv_cache_tokens": "kv_tokens",
    "llamacpp:requests_processing": "requests_processing",
    "llamacpp:requests_deferred": "requests_deferred",
    "llamacpp:n_tokens_max": "n_tokens_max",
    "llmcore:requests_total": "requests_total",
    "llmcore:requests_errors_total": "requests_errors",
    "llmcore:requests_cancelled_total": "requests_cancelled",
    "llmcore:prompt_tokens_cached_total": "cache_tokens_total",
    "llmcore:slots_total": "n_slots",
    "llmcore:uptime_seconds": "uptime_s",
}


def _fields_from_metrics() -> dict[str, str]:
    class Probe:
        name = None

        def __getattr__(self, name):
            self.name = name
            return 0

    out = {}
    try:
        from ..metrics import _METRICS
    except Exception:  # noqa: BLE001 - the static table is enough
        return out
    for row in _METRICS:
        try:
            pr = Probe()
            row[3](pr)
            if pr.name:
                out[row[0]] = pr.name
        except Exception:  # noqa: BLE001
            continue
    return out


PROM_FIELDS.update(_fields_from_metrics())
CACHE_PREFIX = "llmcore:cache_"


@dataclass(frozen=True)
class Snapshot:
    """One poll. `connected` False means the source could not be read (`error` says why)."""

    time: float
    connected: bool = True
    error: str = ""
    stats: Mapping[str, Any] = field(default_factory=dict)
    slots: tuple[Mapping[str, Any], ...] = ()
    cache: Mapping[str, float] = field(default_factory=dict)

    def get(self, key: str, default=None):
        return self.stats.get(key, default)

    @classmethod
    def lost(cls, error: str, t: float | None = None) -> "Snapshot":
        return cls(time=time.time() if t is None else t, connected=False, error=error)

    def to_dict(self) -> dict:
        return {"time": self.time, "connected": self.connected, "error": self.error,
                "stats": dict(self.stats), "slots": [dict(s) for s in self.slots],
                "cache": dict(self.cache)}


# ---- building snapshots ---------------------------------------------------------------
def from_engine_stats(st, t: float | None = None) -> Snapshot:
    """Snapshot of an in-process `llmcore.metrics.EngineStats` (duck-typed)."""
    d = st.to_dict() if hasattr(st, "to_dict") else dict(st)
    slots = tuple(dict(s) for s in d.pop("slots", ()) or ())
    cache = _numbers(d.pop("cache", {}) or {})
    d.setdefault("kv_tokens", sum(int(s.get("n_tokens") or 0) for s in slots))
    return Snapshot(time=t if t is not None else float(d.get("time") or time.time()),
                    stats=d, slots=slots, cache=cache)


def parse_prometheus(text: str) -> dict[str, float]:
    """name -> value for a Prometheus text exposition; labels stay part of the name and
    lines that do not parse are skipped (the dashboard must not fail on a new metric)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][\w:]*(?:\{[^}]*\})?)\s+(\S+)(?:\s+\d+)?$", line)
        if not m:
            continue
        try:
            out[m.group(1)] = float(m.group(2))
        except ValueError:
            continue
    return out


def from_http(slots_json: Any, metrics_text: str | None, props_json: Any,
              t: float | None = None) -> Snapshot:
    """Snapshot from a server's `/slots` (list), `/metrics` (text) and `/props` (dict).
    Any of them may be None (route missing or failed)."""
    stats: dict[str, Any] = {}
    cache: dict[str, float] = {}
    for name, val in parse_prometheus(metrics_text or "").items():
        if name in PROM_FIELDS:
            stats[PROM_FIELDS[name]] = val
        elif name.startswith(CACHE_PREFIX):
            cache[name[len(CACHE_PREFIX):]] = val
        elif ":" in name and "{" not in name:
            stats.setdefault(name.split(":", 1)[1], val)
    for k, v in list(stats.items()):  # counters print as floats; show ints as ints
        if isinstance(v, float) and v.is_integer() and not k.endswith(("seconds", "_s", "seconds_total")):
            stats[k] = int(v)
    props = props_json if isinstance(props_json, dict) else {}
    if props:
        stats["status"] = props.get("status", "ok")
        stats["model"] = props.get("model_alias") or props.get("model_path") or ""
        if "total_slots" in props:
            stats["n_slots"] = props["total_slots"]
        if "n_ctx" in props:
            stats["n_ctx_slot"] = props["n_ctx"]
    slots = []
    for s in slots_json if isinstance(slots_json, list) else ():
        if not isinstance(s, dict):
            continue
        d = dict(s)
        if "task_id" not in d:
            tid = d.get("id_task")
            d["task_id"] = None if tid is None or tid == -1 else tid
        if "state" not in d and "is_processing" in d:
            d["state"] = "busy" if d["is_processing"] else "idle"
        slots.append(d)
    if slots:
        stats.setdefault("n_slots", len(slots))
    return Snapshot(time=time.time() if t is None else t, stats=stats, slots=tuple(slots), cache=cache)


def _numbers(d: Mapping) -> dict[str, float]:
    return {str(k): v for k, v in d.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


# ---- cache numbers: tolerant look-ups ---------------------------------------------------
def pick_key(cache: Mapping[str, float], *names: str) -> str | None:
    """First key equal to one of `names`, else the first ending with `_<name>`."""
    for n in names:
        if n in cache:
            return n
    for n in names:
        for k in cache:
            if k.endswith("_" + n):
                return k
    return None


def pick(cache: Mapping[str, float], *names: str):
    k = pick_key(cache, *names)
    return None if k is None else cache[k]


# Stats fields that belong to the cache layers and memory (EngineStats names).
CACHE_FIELD_PREFIXES = ("slot_hits", "slot_misses", "ram_", "cache_ram", "cache_save", "cache_restore",
                        "checkpoint", "forced_", "kv_", "idle_slot")


def cache_numbers(snap: Snapshot) -> dict[str, float]:
    """The cache layers' numbers: EngineStats cache fields plus the free-form `cache` dict."""
    out = {k: v for k, v in snap.stats.items()
           if k.startswith(CACHE_FIELD_PREFIXES) and isinstance(v, (int, float)) and not isinstance(v, bool)}
    for k, v in snap.cache.items():
        out.setdefault(k, v)
    return out


GAUGES = (  # label, used keys, capacity keys, unit
    ("KV memory", ("kv_used_bytes",), ("kv_limit_bytes",), "bytes"),
    ("KV blocks", ("kv_used_blocks", "kv_blocks_used", "used_blocks"),
     ("kv_capacity_blocks", "kv_blocks_capacity", "kv_max_blocks", "capacity_blocks", "max_blocks"), "n"),
    ("RAM cache", ("cache_ram_bytes", "prompt_cache_bytes"),
     ("cache_ram_limit_bytes", "prompt_cache_limit_bytes", "prompt_cache_budget_bytes"), "bytes"),
)


def gauges(cache: Mapping[str, float]) -> list[tuple[str, float | None, float | None, str]]:
    """(label, used, capacity, unit) for each gauge the numbers have; capacity < 0 means no
    limit, 0 off (RAM cache) or unknown."""
    out = []
    for label, used, cap, unit in GAUGES:
        u, c = pick(cache, *used), pick(cache, *cap)
        if u is not None or c is not None or label != "KV blocks":
            out.append((label, u, c, unit))
    return out


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
    """The cache keys the gauges show (so the list of other numbers skips them)."""
    out = set()
    for _, used, cap, _ in GAUGES:
        for names in (used, cap):
            k = pick_key(cache, *names)
            if k is not None:
                out.add(k)
    return out


_HM = re.compile(r"^(?P<layer>.*?)_?(?P<kind>hits|misses)(?:_total)?$")


LAYER_NAMES = {"slot": "slot reuse", "ram": "RAM cache", "prompt_cache": "RAM cache", "checkpoint": "checkpoints"}


def hit_table(cache: Mapping[str, float]) -> list[tuple[str, float | None, float | None]]:
    """(layer, hits, misses) for every layer reporting `<layer>_hits` / `<layer>_misses`."""
    rows: dict[str, list] = {}
    for k, v in cache.items():
        m = _HM.match(k)
        if m:
            row = rows.setdefault(m.group("layer") or "cache", [None, None])
            row[0 if m.group("kind") == "hits" else 1] = v
    order = {"slot": 0, "ram": 1, "prompt_cache": 1}
    return [(LAYER_NAMES.get(layer, layer), h, mi)
            for layer, (h, mi) in sorted(rows.items(), key=lambda kv: (order.get(kv[0], 9), kv[0]))]


def hit_keys(cache: Mapping[str, float]) -> set[str]:
    return {k for k in cache if _HM.match(k)}


# ---- formatting --------------------------------------------------------------------------
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


def model_label(model) -> str:
    """A model path shown by its file name."""
    if not model:
        return DASH
    return str(model).replace("\\", "/").rsplit("/", 1)[-1]


def fmt_rate(v) -> str:
    return DASH if v is None else f"{float(v):.1f}"


def level(frac: float | None) -> str:
    """Health colour class for a used/capacity fraction (fixed thresholds)."""
    if frac is None:
        return "unknown"
    return "red" if frac > 0.92 else "yellow" if frac > 0.80 else "green"


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


SLOT_COLUMNS = ("slot", "state", "task", "prompt cached/done/all", "hit layer", "generated",
                "kv tokens", "ckpts", "prompt t/s", "gen t/s")


# ---- history and rates ------------------------------------------------------------------
class History:
    """Bounded history of instant rates, computed from counter deltas between polls
    (tokens per second over the whole server, all slots together)."""

    def __init__(self, maxlen: int = 120):
        self.prompt_tps: deque[float] = deque(maxlen=maxlen)
        self.gen_tps: deque[float] = deque(maxlen=maxlen)
        self.queued: deque[float] = deque(maxlen=maxlen)
        self._last: Snapshot | None = None

    def add(self, snap: Snapshot) -> None:
        if not snap.connected:
            return
        prev, self._last = self._last, snap
        self.queued.append(float(snap.get("requests_deferred") or 0))
        if prev is None:
            return
        dt = snap.time - prev.time
        if dt <= 0:
            return
        for key, live, dq in (("prompt_tokens_total", "n_prefilled", self.prompt_tps),
                              ("tokens_predicted_total", "n_decoded", self.gen_tps)):
            a, b = _progress(prev, key, live), _progress(snap, key, live)
            if a is None or b is None:
                continue
            dq.append(max(0.0, (b - a) / dt))  # a restarted server: no negative rate

    def clear(self) -> None:
        self.prompt_tps.clear()
        self.gen_tps.clear()
        self.queued.clear()
        self._last = None


def _progress(snap: Snapshot, counter: str, live: str) -> float | None:
    """Tokens done so far: the server counts a request's tokens when it finishes, so add
    what the busy slots have done already (otherwise the rate comes in bursts)."""
    c = snap.get(counter)
    if c is None:
        return None
    return float(c) + sum(float(s.get(live) or 0) for s in snap.slots if s.get("task_id") is not None)


# ---- events: what changed between two polls -----------------------------------------------
_EVENT_COUNTERS = (  # field (stats or cache numbers), level, text ({d} = increase)
    ("requests_total", "info", "{d} request(s) finished"),
    ("requests_errors", "error", "{d} request(s) failed"),
    ("requests_cancelled", "warning", "{d} request(s) cancelled"),
    ("cache_ram_evictions", "info", "RAM cache: {d} entr(ies) evicted"),
    ("idle_slot_evictions", "info", "{d} idle slot state(s) dropped for KV room"),
    ("checkpoints_restored", "info", "{d} context checkpoint(s) restored"),
    ("forced_reprefills", "warning", "{d} prompt(s) re-processed from 0 (no checkpoint)"),
    ("checkpoint_failures", "warning", "{d} checkpoint failure(s)"),
    ("cache_save_failures", "warning", "RAM cache: {d} save failure(s), served as misses"),
    ("cache_restore_failures", "warning", "RAM cache: {d} restore failure(s), served as misses"),
    ("kv_full_failures", "error", "{d} request(s) failed: no KV room"),
)
_EVENT_KEYS = {k for k, _, _ in _EVENT_COUNTERS}


def diff_events(prev: Snapshot | None, cur: Snapshot) -> list[tuple[str, str]]:
    """(level, text) events between two snapshots: connection changes, errors,
    cancellations, cache evictions / restores, slots starting and finishing tasks."""
    out: list[tuple[str, str]] = []
    if not cur.connected:
        if prev is None or prev.connected:
            out.append(("error", f"connection lost: {cur.error}"))
        return out
    if prev is not None and not prev.connected:
        out.append(("info", "connection restored"))
    if prev is None or not prev.connected:
        if cur.get("status") not in (None, "ok"):
            out.append(("warning", f"server status: {cur.get('status')}"))
        return out
    if prev.get("status") != cur.get("status") and cur.get("status") is not None:
        lvl = "error" if cur.get("status") == "error" else "info"
        out.append((lvl, f"server status: {cur.get('status')}"))
    if (cur.get("uptime_s") or 0) + 1 < (prev.get("uptime_s") or 0):
        out.append(("warning", "server restarted"))
        return out
    pc, cc = {**cache_numbers(prev), **prev.stats}, {**cache_numbers(cur), **cur.stats}
    for key, lvl, text in _EVENT_COUNTERS:
        d = _delta(pc.get(key), cc.get(key))
        if d > 0:
            out.append((lvl, text.format(d=fmt_num(d))))
    for key in sorted(cur.cache):  # free-form numbers of a cache layer
        if key not in _EVENT_KEYS and any(w in key for w in ("evict", "fail", "error", "forced")):
            d = _delta(prev.cache.get(key), cur.cache.get(key))
            if d > 0:
                lvl = "info" if "evict" in key else "warning"
                out.append((lvl, f"cache {key.replace('_', ' ')} +{fmt_num(d)}"))
    before = {s.get("id"): s for s in prev.slots}
    for s in cur.slots:
        p = before.get(s.get("id"))
        if p is None:
            continue
        was, now = p.get("task_id"), s.get("task_id")
        if was is not None and now == was and s.get("state") == "idle" and p.get("state") != "idle":
            out.append(("info", f"slot {s.get('id')}: task {was} done, "
                                f"{fmt_num(s.get('n_decoded'))} tokens generated"))
        elif was is not None and now != was:
            n = s.get("n_decoded") if now is None else None
            out.append(("info", f"slot {s.get('id')}: task {was} done"
                                + (f", {fmt_num(n)} tokens generated" if n is not None else "")))
        if now is not None and now != was:
            cached = s.get("n_cached")
            extra = f", {fmt_num(cached)} of {fmt_num(s.get('n_prompt'))} prompt tokens cached" \
                if cached is not None else ""
            out.append(("info", f"slot {s.get('id')}: task {now} started{extra}"))
    return out


def _delta(a, b) -> float:
    if a is None or b is None:
        return 0
    return float(b) - float(a)


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


def iter_cache_rows(cache: Mapping[str, float]) -> Iterable[tuple[str, str]]:
    """Every cache number as (name, formatted value), bytes formatted as sizes."""
    for k in sorted(cache):
        v = cache[k]
        yield k, fmt_bytes(v) if k.endswith("bytes") else fmt_num(v)
