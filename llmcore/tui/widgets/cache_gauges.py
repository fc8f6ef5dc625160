"""Cache gauges: KV blocks and RAM prompt cache against their capacity (coloured by fixed
thresholds), hits/misses per layer, and every other number the cache layers report."""
from __future__ import annotations

from typing import Mapping

from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ..snapshot import DASH, fmt_bytes, fmt_num, gauge_keys, gauges, hit_table, iter_cache_rows, level

COLOURS = {"green": "green", "yellow": "yellow", "red": "red", "unknown": "grey50"}


def bar(frac: float | None, width: int = 20) -> Text:
    if frac is None:
        return Text("·" * width, style="grey50")
    n = max(0, min(width, round(frac * width)))
    return Text("█" * n + "░" * (width - n), style=COLOURS[level(frac)])


class CacheGauges(Static):
    cache: reactive[Mapping | None] = reactive(None, repaint=False)

    def watch_cache(self, cache: Mapping | None) -> None:
        self.update(self.render_cache(cache or {}))

    @staticmethod
    def render_cache(cache: Mapping) -> Table:
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold")
        t.add_column()
        t.add_column()
        if not cache:
            t.add_row("caches", Text(DASH), Text("(no cache numbers reported)", style="grey50"))
            return t
        shown = gauge_keys(cache)
        for label, used, cap, unit in gauges(cache):
            f = fmt_bytes if unit == "bytes" else fmt_num
            frac = used / cap if used is not None and cap and cap > 0 else None
            cap_s = "no limit" if cap is not None and cap < 0 else f(cap)
            pct = f" {100 * frac:.0f}%" if frac is not None else ""
            t.add_row(label, bar(frac), Text(f"{f(used)} / {cap_s}{pct}"))
        for layer, hits, misses in hit_table(cache):
            tot = (hits or 0) + (misses or 0)
            rate = f" ({100 * (hits or 0) / tot:.0f}% hit)" if tot else ""
            t.add_row(f"{layer} hits", Text(""), Text(f"{fmt_num(hits)} hit / {fmt_num(misses)} miss{rate}"))
            shown.update(k for k in cache if k.startswith(layer) and k.endswith(("hits", "misses")))
        for k, v in iter_cache_rows(cache):
            if k not in shown:
                t.add_row(Text(k, style="grey70"), Text(""), Text(v))
        return t
