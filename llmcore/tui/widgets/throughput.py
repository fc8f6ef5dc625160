"""Tokens per second, server-wide: generation and prompt throughput over the last
`window_s` seconds of wall-clock time (with one bar per poll), the speed while busy since
start (what llama-server's `*_tokens_seconds` report), and the queue."""
from __future__ import annotations

from typing import Sequence

from rich.text import Text

from ..formatting import fmt_count, fmt_duration, fmt_rate, flow
from ..history import History
from ..snapshot import Snapshot
from .panel import Panel

BLOCKS = "▁▂▃▄▅▆▇█"
WIDE = 40  # from this content width on: the window, peaks, labels in words
NARROW = 100  # the app's first breakpoint


def spark(values: Sequence[float], width: int) -> Text:
    """The last `width` values as bars scaled to their maximum; 0 is a dim baseline."""
    vals = list(values)[-width:] if width > 0 else []
    top = max(vals, default=0.0)
    t = Text()
    for v in vals:
        if v <= 0 or top <= 0:
            t.append(BLOCKS[0], style="grey30")
        else:
            t.append(BLOCKS[min(len(BLOCKS) - 1, int(v / top * (len(BLOCKS) - 1) + 0.5))], style="cyan")
    return t


class Throughput(Panel):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.history: History | None = None
        self.snapshot: Snapshot | None = None

    def show(self, history: History, snap: Snapshot) -> None:
        self.history, self.snapshot = history, snap
        self.redraw()

    def lines(self, width: int) -> list[Text]:
        h, snap = self.history, self.snapshot
        wide = width >= WIDE
        out = []
        for name in ("gen", "prompt"):
            r = h.rate(name) if h is not None else None
            line = Text()
            line.append(f"{name:<7}", style="bold")
            line.append(f"{fmt_rate(r.tokens_per_s if r else None):>6} t/s")
            room = width - len(line) - 1
            if h is not None and room >= 4:
                line.append(" ")
                line.append_text(spark(h.per_poll(name), room))
            out.append(line)
        if h is not None and wide:
            r = h.rate("gen") or h.rate("prompt")
            span = f"t/s: tokens over the last {r.window_s:.0f} s" if r else "t/s after two polls"
            phrases = [span, f"bars: one per poll, {fmt_duration(h.span_s())}",
                       f"peak gen {fmt_rate(h.peak('gen'))} t/s", f"peak prompt {fmt_rate(h.peak('prompt'))} t/s"]
            for p in flow(phrases, width):
                out.append(Text(p, style="grey62"))
        if snap is not None:
            g = snap.get
            label = "while busy" if wide else "busy"
            phrases = [f"prefill {fmt_rate(g('prompt_tokens_seconds'))}" + (" t/s" if wide else ""),
                       f"decode {fmt_rate(g('predicted_tokens_seconds'))} t/s"]
            if wide:
                phrases.append("(since start)")
            out += _row(label, phrases, width, 11 if wide else 7)
            if self.app.size.width < NARROW:  # the requests pane is hidden there
                busy = g("requests_processing")
                phrases = [f"{fmt_count(g('requests_deferred'))} queued",
                           f"{fmt_count(busy)}/{fmt_count(g('n_slots'))} busy",
                           f"{fmt_count(g('requests_total'))} done"]
                if g("requests_errors"):
                    phrases.append(f"{fmt_count(g('requests_errors'))} failed")
                out += _row("queue", phrases, width, 11 if wide else 7)
        return out


def _row(label: str, phrases: list[str], width: int, lw: int) -> list[Text]:
    parts = flow(phrases, width - lw) or [""]
    first = Text()
    first.append(label.ljust(lw), style="bold")
    first.append(parts[0])
    return [first] + [Text(" " * lw + p) for p in parts[1:]]
