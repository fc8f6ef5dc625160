"""Prompt and generation tokens/s over time (server-wide, from counter deltas)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline

from ..formatting import fmt_rate
from ..history import History


class Throughput(Vertical):
    def compose(self) -> ComposeResult:
        yield Label("prompt t/s -", id="prompt-label")
        yield Sparkline([], summary_function=max, id="prompt-spark")
        yield Label("gen t/s -", id="gen-label")
        yield Sparkline([], summary_function=max, id="gen-spark")

    def on_mount(self) -> None:
        # looked up once: the poll path touches no selectors
        self._labels = (self.query_one("#prompt-label", Label), self.query_one("#gen-label", Label))
        self._sparks = (self.query_one("#prompt-spark", Sparkline), self.query_one("#gen-spark", Sparkline))

    def show(self, history: History) -> None:
        for name, dq, label, spark in zip(("prompt", "gen"), (history.prompt_tps, history.gen_tps),
                                          self._labels, self._sparks):
            data = list(dq)  # a copy: the deque may grow while the sparkline draws
            now = data[-1] if data else None
            peak = max(data) if data else None
            label.update(f"{name} t/s {fmt_rate(now)}  (peak {fmt_rate(peak)}, {len(data)} samples)")
            spark.data = data
