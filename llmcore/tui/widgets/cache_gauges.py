"""Cache gauges: KV memory and the RAM prompt cache against their budget (coloured by fixed
thresholds), hits/misses per layer, checkpoints, and every other number the cache layers
report (missing ones show as "-")."""
from __future__ import annotations

from typing import Mapping

from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ..formatting import (DASH, fmt_bytes, fmt_num, gauge_keys, gauge_text, gauges, hit_keys, hit_table,
                          level, number_rows)

COLOURS = {"green": "green", "yellow": "yellow", "red": "red", "unknown": "grey50"}
# shown on their own lines: (label, keys...) with bytes keys formatted as sizes
LINES = (
    ("RAM entries", "cache_ram_entries", "cache_ram_tokens", "cache_ram_inserts", "cache_ram_evictions"),
    ("checkpoints", "checkpoints_count", "checkpoints_bytes", "checkpoints_created", "checkpoints_restored",
     "checkpoints_erased"),
    ("trouble", "forced_reprefills", "checkpoint_failures", "cache_save_failures", "cache_restore_failures",
     "kv_full_waits", "kv_full_failures", "idle_slot_evictions"),
)
SHORT = {"cache_ram_entries": "entries", "cache_ram_tokens": "tokens", "cache_ram_inserts": "saved",
         "cache_ram_evictions": "evicted", "checkpoints_count": "held", "checkpoints_bytes": "",
         "checkpoints_created": "made", "checkpoints_restored": "restored", "checkpoints_erased": "erased",
         "forced_reprefills": "re-prefills", "checkpoint_failures": "ckpt fails",
         "cache_save_failures": "save fails", "cache_restore_failures": "restore fails",
         "kv_full_waits": "KV waits", "kv_full_failures": "KV fails", "idle_slot_evictions": "idle drops"}


def bar(frac: float | None, width: int = 16) -> Text:
    if frac is None:
        return Text("·" * width, style="grey50")
    n = max(0, min(width, round(frac * width)))
    return Text("█" * n + "░" * (width - n), style=COLOURS[level(frac)])


def render_cache(cache: Mapping) -> Table:
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_column()
    if not cache:
        t.add_row("caches", Text(DASH), Text("no cache numbers reported", style="grey50"))
        return t
    shown = gauge_keys(cache) | hit_keys(cache)
    for label, used, cap, unit in gauges(cache):
        text, frac = gauge_text(label, used, cap, unit)
        t.add_row(label, bar(frac), Text(text))
    for layer, hits, misses in hit_table(cache):
        tot = (hits or 0) + (misses or 0)
        rate = f" ({100 * (hits or 0) / tot:.0f}%)" if tot else ""
        t.add_row(layer, Text("hit/miss", style="grey70"), Text(f"{fmt_num(hits)} / {fmt_num(misses)}{rate}"))
    for label, *keys in LINES:
        parts = []
        for k in keys:
            if k in cache:
                v = fmt_bytes(cache[k]) if k.endswith("bytes") else fmt_num(cache[k])
                parts.append(f"{SHORT.get(k, k)} {v}".strip())
                shown.add(k)
        if parts:
            t.add_row(label, Text(""), Text("  ".join(parts)))
    for k, v in number_rows(cache):
        if k not in shown:
            t.add_row(Text(k, style="grey70"), Text(""), Text(v))
    return t


class CacheGauges(Static):
    cache: reactive[Mapping | None] = reactive(None, repaint=False)

    def watch_cache(self, cache: Mapping | None) -> None:
        self.update(render_cache(cache or {}))
