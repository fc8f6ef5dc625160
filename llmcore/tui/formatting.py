"""Numbers as the dashboard prints them: short strings with units ("-" for a missing number),
phrases flowed into lines that never cut a word, the two memory gauges, the per-layer hit
rates, the slot table's columns, and the text and JSON lines of `--once` / `--no-tui`.

Everything here is plain data (no Textual), so the panes, `--once` and the README's legend
read the same definitions.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from .snapshot import Snapshot

if TYPE_CHECKING:
    from .history import History

DASH = "-"
GAP = "  "  # between phrases on one line


# ---- one number ------------------------------------------------------------------------
def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt_num(v, digits: int = 1) -> str:
    """Exact, with thousands separators (`--once` text, small counts)."""
    if _missing(v):
        return DASH
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v):,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def fmt_count(v) -> str:
    """A count in at most 6 characters: 1,234 / 12.3k / 123k / 1.2M / 12M / 1.2G."""
    if _missing(v):
        return DASH
    v = float(v)
    if abs(v) < 10_000:
        return f"{int(round(v)):,}"
    for unit, scale in (("k", 1e3), ("M", 1e6), ("G", 1e9)):
        x = v / scale
        if abs(x) < 1000 or unit == "G":
            return f"{x:.1f}{unit}" if abs(x) < 100 else f"{x:.0f}{unit}"
    return DASH  # pragma: no cover


def fmt_bytes(v) -> str:
    if _missing(v):
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
    if _missing(s):
        return DASH
    s = int(s)
    h, r = divmod(s, 3600)
    m, sec = divmod(r, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def fmt_rate(v) -> str:
    """Tokens per second: one decimal below 100, whole numbers above, compact past 10k."""
    if _missing(v):
        return DASH
    v = float(v)
    if abs(v) < 100:
        return f"{v:.1f}"
    return f"{v:,.0f}" if abs(v) < 10_000 else fmt_count(v)


def fmt_pct(part, whole) -> str:
    if _missing(part) or _missing(whole) or not whole:
        return DASH
    return f"{100 * float(part) / float(whole):.0f}%"


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


# ---- phrases into lines --------------------------------------------------------------------
def flow(phrases: Sequence[str], width: int, first: int | None = None) -> list[str]:
    """Phrases joined by two spaces into lines of at most `width` characters (the first line
    `first` wide, e.g. after a label). A line breaks only between phrases, never inside one; a
    phrase longer than a whole line is left out rather than cut."""
    lines: list[str] = []
    cur, room = "", width if first is None else first
    for p in phrases:
        if not p:
            continue
        if cur:
            if len(cur) + len(GAP) + len(p) <= room:
                cur += GAP + p
                continue
            lines.append(cur)
            cur, room = "", width
        if len(p) <= room:
            cur = p
        elif len(p) <= width:  # too wide beside the label: start on the next line
            lines.append("")
            cur, room = p, width
    if cur:
        lines.append(cur)
    return lines


# ---- memory gauges ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Gauge:
    """One thing measured against its own budget."""

    label: str
    used: float | None
    budget: float | None  # None unknown, < 0 no limit, 0 off
    text: str  # "used / budget"
    detail: tuple[str, ...] = ()  # further phrases, least important last

    @property
    def fraction(self) -> float | None:
        if self.used is None or self.budget is None or self.budget <= 0:
            return None
        return float(self.used) / float(self.budget)

    @property
    def pct(self) -> str:
        f = self.fraction
        return DASH if f is None else f"{100 * f:.0f}%"


def kv_tokens(snap: Snapshot) -> float | None:
    v = snap.get("kv_tokens")
    if v is None and snap.slots:
        v = sum(float(s.get("n_tokens") or 0) for s in snap.slots)
    return v


def kv_gauge(snap: Snapshot) -> Gauge:
    """The slots' KV cache: tokens held by all slots against `-c` (n_ctx, shared by the
    slots). Its bytes, and the pools' total (slots and prompt-cache blocks), are details."""
    used, cap = kv_tokens(snap), snap.get("n_ctx")
    detail = []
    slot_bytes = sum(float(s.get("nbytes") or 0) for s in snap.slots) if snap.slots else None
    live_max = snap.get("kv_slots_max_bytes")
    if slot_bytes is not None:
        detail.append(f"slots {fmt_bytes(slot_bytes)}" + (f" of {fmt_bytes(live_max)}" if live_max else ""))
    if snap.get("kv_used_bytes") is not None:
        detail.append(f"all pools {fmt_bytes(snap.get('kv_used_bytes'))}")
    text = f"{fmt_count(used)} / {fmt_count(cap)} tok"
    return Gauge("KV cache", used, cap, text, tuple(detail))


def cache_gauge(snap: Snapshot) -> Gauge:
    """The RAM prompt cache: bytes held against its own budget (`--cache-ram`)."""
    used, cap = snap.get("cache_ram_bytes"), snap.get("cache_ram_limit_bytes")
    if cap is None:
        cap_s = DASH
    elif cap < 0:
        cap_s = "no limit"
    elif cap == 0:
        cap_s = "off"
    else:
        cap_s = fmt_bytes(cap)
    detail = []
    if snap.get("cache_ram_entries") is not None:
        detail.append(f"{fmt_count(snap.get('cache_ram_entries'))} entries")
    if snap.get("cache_ram_tokens") is not None:
        detail.append(f"{fmt_count(snap.get('cache_ram_tokens'))} tok")
    if snap.get("cache_ram_evictions") is not None:
        detail.append(f"evicted {fmt_count(snap.get('cache_ram_evictions'))}")
    return Gauge("prompt cache", used, cap, f"{fmt_bytes(used)} / {cap_s}", tuple(detail))


def gauges(snap: Snapshot) -> tuple[Gauge, Gauge]:
    return kv_gauge(snap), cache_gauge(snap)


# ---- cache layers: hit rates and checkpoints ----------------------------------------------------
@dataclass(frozen=True)
class HitRate:
    layer: str
    hits: float
    total: float  # requests that asked this layer

    @property
    def text(self) -> str:
        return f"{self.layer} {fmt_pct(self.hits, self.total)}"

    @property
    def counts(self) -> str:
        return f"{fmt_count(self.hits)}/{fmt_count(self.total)}"


HIT_LAYERS = (  # layer, hits field, misses field
    ("slot", "slot_hits", "slot_misses"),
    ("RAM", "ram_hits", "ram_misses"),
    ("disk", "disk_hits", "disk_misses"),  # only servers with a disk cache report these
    # of the requests that needed a checkpoint: restored one, or re-processed from 0
    ("ckpt", "checkpoints_restored", "forced_reprefills"),
)


def hit_rates(snap: Snapshot) -> list[HitRate]:
    """Per-layer hit rates of the layers the snapshot reports."""
    out = []
    for layer, h, m in HIT_LAYERS:
        hits, misses = snap.get(h), snap.get(m)
        if hits is None and misses is None:
            continue
        out.append(HitRate(layer, float(hits or 0), float(hits or 0) + float(misses or 0)))
    return out


def checkpoint_phrases(snap: Snapshot) -> list[str]:
    """made / restored first (what 80 columns keep), then the rest."""
    g = snap.get
    out = []
    for label, key in (("made", "checkpoints_created"), ("restored", "checkpoints_restored"),
                       ("re-prefills", "forced_reprefills"), ("erased", "checkpoints_erased"),
                       ("held", "checkpoints_count")):
        if g(key) is not None:
            out.append(f"{label} {fmt_count(g(key))}")
    if g("checkpoints_bytes") is not None and g("checkpoints_count"):
        out.append(fmt_bytes(g("checkpoints_bytes")))
    return out


TROUBLE = (  # label, field: each a count that should stay 0
    ("ckpt fails", "checkpoint_failures"),
    ("save fails", "cache_save_failures"),
    ("restore fails", "cache_restore_failures"),
    ("KV waits", "kv_full_waits"),
    ("KV fails", "kv_full_failures"),
    ("idle drops", "idle_slot_evictions"),
)


def trouble_phrases(snap: Snapshot, all_: bool = False) -> list[str]:
    """The failure counters: the non-zero ones (all of them with `all_`)."""
    return [f"{label} {fmt_count(snap.get(k))}" for label, k in TROUBLE
            if snap.get(k) is not None and (all_ or snap.get(k))]


# ---- the slot table --------------------------------------------------------------------------
def _prompt_cell(s: Mapping) -> str:
    n, c, p = s.get("n_prompt"), s.get("n_cached"), s.get("n_prefilled")
    if n is None and p is None:
        return DASH
    done = float(c or 0) + float(p or 0)
    return f"{fmt_count(done)}/{fmt_count(n)}"


def _speed_cell(s: Mapping) -> str:
    st = s.get("state")
    if st == "prefill":
        return fmt_rate(s.get("prompt_per_second"))
    if st in ("decode", "busy"):
        return fmt_rate(s.get("predicted_per_second"))
    return DASH


def _busy_rate(key: str) -> Callable[[Mapping], str]:
    def cell(s: Mapping) -> str:
        v = s.get(key)
        return DASH if v is None or (s.get("state") == "idle" and not v) else fmt_rate(v)
    return cell


def _source_cell(s: Mapping) -> str:
    src = s.get("cache_source")
    return {None: DASH, "none": DASH, "checkpoint": "ckpt"}.get(src, str(src))


def _ctx_cell(s: Mapping) -> str:
    n, c = s.get("n_tokens"), s.get("n_ctx")
    if n is None:
        return DASH
    return fmt_count(n) if c is None else f"{fmt_count(n)}/{fmt_count(c)}"


def _get(key: str, f: Callable = fmt_count) -> Callable[[Mapping], str]:
    return lambda s: f(s.get(key))


@dataclass(frozen=True)
class SlotColumn:
    key: str
    header: str
    legend: str  # what it means (help screen and README)
    cell: Callable[[Mapping], str]
    justify: str = "right"


SLOT_COLUMNS: dict[str, SlotColumn] = {c.key: c for c in (
    SlotColumn("slot", "slot", "slot number (-np N slots run side by side)", _get("id", fmt_num)),
    SlotColumn("task", "task", "id of the request on the slot (or the last one)",
               lambda s: DASH if s.get("task_id") is None else str(s.get("task_id"))),
    SlotColumn("state", "state", "idle, prefill (reading the prompt), decode",
               lambda s: str(s.get("state") or DASH), "left"),
    SlotColumn("prompt", "prompt", "prompt tokens done (reused + evaluated) / all", _prompt_cell),
    SlotColumn("cached", "cached", "prompt tokens reused instead of evaluated", _get("n_cached")),
    SlotColumn("from", "from", "where reused tokens came from: slot, ram, ckpt",
               _source_cell, "left"),
    SlotColumn("gen", "gen", "tokens generated", _get("n_decoded")),
    SlotColumn("ctx", "ctx", "tokens the slot holds in KV / its context size", _ctx_cell),
    SlotColumn("ckpt", "ckpt", "context checkpoints the slot holds", _get("n_checkpoints")),
    SlotColumn("mem", "mem", "memory of the slot's state", _get("nbytes", fmt_bytes)),
    SlotColumn("tps", "t/s", "speed now: prompt t/s in prefill, gen t/s in decode",
               _speed_cell),
    SlotColumn("prompt_tps", "prompt t/s", "prompt tokens per second of the slot's request",
               _busy_rate("prompt_per_second")),
    SlotColumn("gen_tps", "gen t/s", "generated tokens per second of the slot's request",
               _busy_rate("predicted_per_second")),
)}

# narrowest first: the widest layout that fits the pane is shown
SLOT_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("slot", "state", "prompt", "gen", "tps"),
    ("slot", "state", "prompt", "cached", "from", "gen", "tps"),
    ("slot", "state", "prompt", "cached", "from", "gen", "ctx", "ckpt", "tps"),
    ("slot", "task", "state", "prompt", "cached", "from", "gen", "ctx", "ckpt", "mem", "prompt_tps", "gen_tps"),
)
ALL_SLOT_COLUMNS = SLOT_LAYOUTS[-1]


def slot_row(s: Mapping[str, Any], columns: Sequence[str] = ALL_SLOT_COLUMNS) -> tuple[str, ...]:
    """One slot as the table's cells; missing fields show as "-"."""
    return tuple(SLOT_COLUMNS[k].cell(s) for k in columns)


def column_widths(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(SLOT_COLUMNS[k].header)] + [len(r[i]) for r in rows]) for i, k in enumerate(columns)]


def slot_layout(slots: Sequence[Mapping], width: int) -> tuple[str, ...]:
    """The widest column layout whose table fits `width` characters."""
    best = SLOT_LAYOUTS[0]
    for cols in SLOT_LAYOUTS:
        rows = [slot_row(s, cols) for s in slots]
        need = sum(column_widths(cols, rows)) + len(GAP) * (len(cols) - 1)
        if need <= width:
            best = cols
    return best


def table_lines(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Header and rows as aligned text lines."""
    widths = column_widths(columns, rows)

    def line(cells, header=False):
        parts = []
        for k, c, w in zip(columns, cells, widths):
            left = SLOT_COLUMNS[k].justify == "left"
            parts.append(c.ljust(w) if left else c.rjust(w))
        return GAP.join(parts).rstrip()

    return [line([SLOT_COLUMNS[k].header for k in columns], True)] + [line(r) for r in rows]


SORT_KEYS: dict[str, Callable[[Mapping], Any]] = {  # name -> key (ascending sorts first)
    "slot": lambda s: (float(s.get("id") or 0),),
    "state": lambda s: ({"prefill": 0, "decode": 1, "busy": 1}.get(s.get("state"), 2), float(s.get("id") or 0)),
    "tokens": lambda s: (-float(s.get("n_tokens") or 0), float(s.get("id") or 0)),
    "speed": lambda s: (-max(float(s.get("prompt_per_second") or 0) if s.get("state") == "prefill" else 0,
                             float(s.get("predicted_per_second") or 0) if s.get("state") != "idle" else 0),
                        float(s.get("id") or 0)),
}


def sort_slots(slots: Iterable[Mapping], key: str) -> list[Mapping]:
    return sorted(slots, key=SORT_KEYS[key])


# ---- a fleet: one group of slot rows per replica ---------------------------------------------
def replica_header(i: int, r: Mapping[str, Any] | None) -> str:
    """The line above replica `i`'s slot rows: its state and its requests."""
    r = r or {}
    if r.get("status") not in (None, "ok"):
        return f"replica {i}  {r.get('status')}"
    return (f"replica {i}  {r.get('status') or DASH}  processing {fmt_num(r.get('requests_processing'))}"
            f"  queued {fmt_num(r.get('requests_deferred'))}  done {fmt_num(r.get('requests_total'))}"
            f"  cached {fmt_count(r.get('cache_tokens_total'))} tok")


@dataclass(frozen=True)
class SlotGroup:
    """The slot rows of one replica under its header (one engine: no header)."""

    header: str | None
    slots: list
    ok: bool = True


def slot_groups(slots: Sequence[Mapping], replicas: Sequence[Mapping] = (), key: str = "slot") -> list[SlotGroup]:
    """One group per replica in replica order, its slots sorted by `key` (a replica with
    no slot reported, e.g. down, has its header alone); one engine: one group."""
    if not replicas and not any(s.get("replica") is not None for s in slots):
        return [SlotGroup(None, sort_slots(slots, key))]
    ids = sorted({int(s["replica"]) for s in slots if s.get("replica") is not None} | set(range(len(replicas))))
    out = []
    for i in ids:
        r = replicas[i] if i < len(replicas) else None
        out.append(SlotGroup(replica_header(i, r), sort_slots([s for s in slots if s.get("replica") == i], key),
                             ok=(r or {}).get("status", "ok") == "ok"))
    return out


# ---- headless output ---------------------------------------------------------------------
def to_json(snap: Snapshot) -> str:
    return json.dumps(snap.to_dict(), default=str, sort_keys=True)


def rate_phrases(history: History) -> list[str]:
    out = []
    for name in ("gen", "prompt"):
        r = history.rate(name)
        if r is not None:
            out.append(f"{name} {fmt_rate(r.tokens_per_s)} t/s over {r.window_s:.0f} s")
    return out


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
        f"tokens: prompt {fmt_num(g('prompt_tokens_total'))}  cached {fmt_num(g('cache_tokens_total'))}"
        f"  generated {fmt_num(g('tokens_predicted_total'))}",
        f"speed while busy (since start): prefill {fmt_rate(g('prompt_tokens_seconds'))} t/s"
        f"  decode {fmt_rate(g('predicted_tokens_seconds'))} t/s",
    ]
    if history is not None and (now := rate_phrases(history)):
        lines.append("throughput: " + "  ".join(now))
    if snap.model_stats:
        lines.append("model: " + "  ".join(f"{k} {fmt_num(v)}" for k, v in sorted(snap.model_stats.items())))
    for gauge in gauges(snap):
        extra = "".join(f"  {d}" for d in gauge.detail)
        pct = f" ({gauge.pct})" if gauge.fraction is not None else ""
        lines.append(f"{gauge.label}: {gauge.text}{pct}{extra}")
    hits = hit_rates(snap)
    if hits:
        lines.append("hit rate: " + "  ".join(f"{h.text} ({h.counts})" for h in hits))
    ck = checkpoint_phrases(snap)
    if ck:
        lines.append("checkpoints: " + "  ".join(ck))
    trouble = trouble_phrases(snap, all_=True)
    if trouble:
        lines.append("failures: " + "  ".join(trouble))
    groups = slot_groups(snap.slots, snap.replicas)
    table = table_lines(ALL_SLOT_COLUMNS, [slot_row(s) for g in groups for s in g.slots])
    lines.append(table[0])
    body = iter(table[1:])
    for g in groups:
        if g.header is not None:
            lines.append(g.header)
        lines += [next(body) for _ in g.slots]
    return "\n".join(lines)
