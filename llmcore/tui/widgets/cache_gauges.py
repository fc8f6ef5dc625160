"""Caches and memory: the slots' KV cache against `-c` and the RAM prompt cache against its
own budget (two gauges, coloured by fixed thresholds), hit rates per cache layer,
checkpoints made / restored and forced re-prefills, and the failure counters.

Narrow panes keep one line per part (the essentials); wider ones add the details."""
from __future__ import annotations

from rich.text import Text

from ..formatting import (DASH, checkpoint_phrases, flow, gauges, hit_rates, level,
                          trouble_phrases)
from ..snapshot import Snapshot
from .panel import Panel

COLOURS = {"green": "green", "yellow": "yellow", "red": "red", "unknown": "grey50"}
WIDE = 40  # from this content width on: long labels and details


def bar(frac: float | None, width: int) -> Text:
    if frac is None:
        return Text("·" * width, style="grey50")
    n = max(0, min(width, round(frac * width)))
    if frac > 0 and n == 0:
        n = 1  # something is used: show it
    return Text("█" * n + "░" * (width - n), style=COLOURS[level(frac)])


class CacheGauges(Panel):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.snapshot: Snapshot | None = None

    def show(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.redraw()

    def lines(self, width: int) -> list[Text]:
        snap = self.snapshot
        if snap is None or not snap.stats:
            return [Text("no cache numbers reported yet", style="grey50")]
        wide = width >= WIDE
        lw = 13 if wide else 6  # label column
        out: list[Text] = []

        def row(label: str, phrases: list[str], lead: Text | None = None, style: str = "") -> None:
            indent = lw + (len(lead) + 1 if lead is not None else 0)
            parts = flow(phrases, width - lw, first=width - indent)
            if not parts:
                parts = [DASH]
            first = Text()
            first.append(label.ljust(lw), style="bold")
            if lead is not None:
                first.append_text(lead)
                first.append(" ")
            first.append(parts[0], style=style)
            out.append(first)
            for p in parts[1:]:
                out.append(Text(" " * lw + p, style=style))

        for g, short in zip(gauges(snap), ("KV", "cache")):
            bw = max(4, min(20, width // 5)) if wide else 6
            phrases = [g.text] + ([g.pct] if wide and g.fraction is not None else [])
            if wide:
                phrases += list(g.detail)
            row(g.label if wide else short, phrases, bar(g.fraction, bw))
        hits = hit_rates(snap)
        if hits:
            row("hit rate" if wide else "hits",
                [f"{h.text} ({h.counts})" if wide else h.text for h in hits])
        ck = checkpoint_phrases(snap)
        if ck:
            row("checkpoints" if wide else "ckpt", ck if wide else ck[:2])
        trouble = trouble_phrases(snap, all_=wide)
        if trouble:
            bad = any(snap.get(k) for k in ("checkpoint_failures", "cache_save_failures",
                                            "cache_restore_failures", "kv_full_failures"))
            row("failures" if wide else "fails", trouble, style="red" if bad else "")
        return out
