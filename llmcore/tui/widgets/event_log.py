"""Event log: connection changes, errors, evictions, slot tasks, server log records."""
from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import RichLog

STYLES = {"debug": "grey50", "info": "", "warning": "yellow", "error": "bold red"}


class EventLog(RichLog):
    def __init__(self, **kw):
        kw.setdefault("max_lines", 2000)
        kw.setdefault("wrap", True)
        super().__init__(**kw)
        self.n_written = 0

    def add(self, level: str, text: str, t: float | None = None) -> None:
        ts = time.strftime("%H:%M:%S", time.localtime(time.time() if t is None else t))
        line = Text(f"{ts} ", style="grey50")
        line.append(f"{level.upper():7} ", style=STYLES.get(level, ""))
        line.append(text, style=STYLES.get(level, ""))
        self.write(line)
        self.n_written += 1
