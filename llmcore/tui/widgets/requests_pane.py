"""Requests: processing / queued now, totals since start, token counters, and the model's
own counters (e.g. MoE experts computed / skipped) when it reports any."""
from __future__ import annotations

from rich.table import Table
from textual.reactive import reactive
from textual.widgets import Static

from ..formatting import fmt_num, fmt_rate, number_rows
from ..snapshot import Snapshot

ROWS = (  # label, stats key, formatter
    ("processing", "requests_processing", fmt_num),
    ("queued", "requests_deferred", fmt_num),
    ("done", "requests_total", fmt_num),
    ("errors", "requests_errors", fmt_num),
    ("cancelled", "requests_cancelled", fmt_num),
    ("prompt tokens", "prompt_tokens_total", fmt_num),
    ("cached tokens", "cache_tokens_total", fmt_num),
    ("generated", "tokens_predicted_total", fmt_num),
    ("avg prompt t/s", "prompt_tokens_seconds", fmt_rate),
    ("avg gen t/s", "predicted_tokens_seconds", fmt_rate),
    ("slots/decode", "n_busy_slots_per_decode", fmt_rate),
)


class RequestsPane(Static):
    snapshot: reactive[Snapshot | None] = reactive(None, repaint=False)

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold")
        t.add_column(justify="right")
        for label, key, f in ROWS:
            v = snap.get(key) if snap is not None and snap.connected else None
            t.add_row(label, f(v))
        if snap is not None and snap.connected:
            for name, text in number_rows(snap.model_stats):
                t.add_row(name.replace("_", " "), text)
        self.update(t)
