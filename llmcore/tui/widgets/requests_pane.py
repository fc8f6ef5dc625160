"""Requests: processing / queued now, totals since start, token counters, and the model's
own counters (e.g. MoE experts computed / skipped) when it reports any."""
from __future__ import annotations

from rich.text import Text

from ..formatting import fmt_count
from ..snapshot import Snapshot
from .panel import Panel

ROWS = (  # label, stats key
    ("processing", "requests_processing"),
    ("queued", "requests_deferred"),
    ("done", "requests_total"),
    ("errors", "requests_errors"),
    ("cancelled", "requests_cancelled"),
    ("prompt tokens", "prompt_tokens_total"),
    ("cached tokens", "cache_tokens_total"),
    ("generated", "tokens_predicted_total"),
)


class RequestsPane(Panel):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.snapshot: Snapshot | None = None

    def show(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.redraw()

    def rows(self) -> list[tuple[str, str]]:
        snap = self.snapshot
        ok = snap is not None and snap.connected
        out = [(label, fmt_count(snap.get(key) if ok else None)) for label, key in ROWS]
        if ok:
            out += [(name.replace("_", " "), fmt_count(v)) for name, v in sorted(snap.model_stats.items())]
        return out

    def lines(self, width: int) -> list[Text]:
        out = []
        for label, value in self.rows():
            if len(label) + 1 + len(value) > width:
                label = label.split(" ")[0]  # whole words only
            line = Text()
            line.append(label, style="bold")
            line.append(" " * max(1, width - len(label) - len(value)) + value)
            out.append(line)
        return out
