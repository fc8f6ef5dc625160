"""Top line: source, connection state, model, uptime, poll interval, paused."""
from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ..formatting import fmt_duration, fmt_num, model_label
from ..snapshot import Snapshot


class StatusBar(Static):
    snapshot: reactive[Snapshot | None] = reactive(None, repaint=False)
    paused: reactive[bool] = reactive(False, repaint=False)
    interval: reactive[float] = reactive(1.0, repaint=False)

    def __init__(self, source_name: str, **kw):
        super().__init__(**kw)
        self.source_name = source_name

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

    def watch_snapshot(self) -> None:
        self._redraw()

    def watch_paused(self) -> None:
        self._redraw()

    def watch_interval(self) -> None:
        self._redraw()

    def _redraw(self) -> None:
        s, state = self.snapshot, self.state
        for c in ("waiting", "connected", "lost", "loading", "error"):
            self.set_class(c == state, f"-{c}")
        self.set_class(self.paused, "-paused")
        t = Text()
        mark = {"connected": "● ", "lost": "✖ ", "loading": "◌ ", "error": "✖ ", "waiting": "… "}[state]
        t.append(mark + state.upper(), style="bold")
        if state == "lost" and s is not None:
            t.append(f" ({s.error})")
        t.append(f"  {self.source_name}")
        if s is not None and s.connected:
            t.append(f"  {model_label(s.get('model'))}", style="bold")
            t.append(f"  up {fmt_duration(s.get('uptime_s'))}")
            t.append(f"  slots {fmt_num(s.get('n_slots'))}  ctx/slot {fmt_num(s.get('n_ctx_slot'))}")
            if s.get("status") == "error" and s.get("error"):
                t.append(f"  {s.get('error')}")
        t.append(f"  every {self.interval:g}s")
        if self.paused:
            t.append("  PAUSED", style="bold reverse")
        self.update(t)
