"""Top line: connection state, model, uptime, slots, where the numbers come from, poll
interval, paused. At any width it keeps the most important parts whole."""
from __future__ import annotations

from rich.text import Text

from ..formatting import GAP, fmt_duration, fmt_num, model_label
from ..snapshot import Snapshot
from .panel import Panel

MARKS = {"connected": "●", "lost": "✖", "loading": "◌", "error": "✖", "waiting": "…"}


class StatusBar(Panel):
    def __init__(self, source_name: str, **kw):
        super().__init__(**kw)
        self.source_name = source_name
        self.snapshot: Snapshot | None = None
        self.paused = False
        self.interval = 1.0

    def set(self, *, snapshot: Snapshot | None = None, paused: bool | None = None,
            interval: float | None = None) -> None:
        if snapshot is not None:
            self.snapshot = snapshot
        if paused is not None:
            self.paused = paused
        if interval is not None:
            self.interval = interval
        for c in MARKS:
            self.set_class(c == self.state, f"-{c}")
        self.set_class(self.paused, "-paused")
        self.refresh()

    @property
    def state(self) -> str:
        """waiting | connected | lost | loading | error (also a CSS class `-<state>`)."""
        s = self.snapshot
        if s is None:
            return "waiting"
        if not s.connected:
            return "lost"
        st = s.get("status")
        return "loading" if st == "loading" else "error" if st == "error" else "connected"

    def parts(self) -> list[tuple[int, str, str]]:
        """(priority, text, style) in display order; 0 is kept first."""
        s, state = self.snapshot, self.state
        out = [(0, f"{MARKS[state]} {state.upper()}", "bold")]
        if state == "lost" and s is not None:
            out.append((2, f"({s.error})", ""))
        if s is not None and s.connected:
            out.append((1, model_label(s.get("model")), "bold"))
            if s.get("status") == "error" and s.get("error"):
                out.append((1, str(s.get("error")), ""))
            out.append((3, f"up {fmt_duration(s.get('uptime_s'))}", ""))
            out.append((3, f"{fmt_num(s.get('n_slots'))} slots", ""))
            out.append((5, f"ctx/slot {fmt_num(s.get('n_ctx_slot'))}", ""))
        out.append((4, self.source_name, ""))
        out.append((6, f"every {self.interval:g} s", ""))
        if self.paused:
            out.append((0, "PAUSED", "bold reverse"))
        return out

    def lines(self, width: int) -> list[Text]:
        parts = self.parts()
        keep: set[int] = set()
        used = 0
        for i in sorted(range(len(parts)), key=lambda i: parts[i][0]):
            need = len(parts[i][1]) + (len(GAP) if keep else 0)
            if used + need <= width:
                keep.add(i)
                used += need
        t = Text()
        for i, (_, text, style) in enumerate(parts):
            if i in keep:
                if len(t):
                    t.append(GAP)
                t.append(text, style=style)
        return [t]
