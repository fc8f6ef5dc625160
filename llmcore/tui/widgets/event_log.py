"""Event log: connection changes, errors, evictions, slot tasks, one line per request, server
log records. A long message wraps under itself (time and level stay in their columns)."""
from __future__ import annotations

import time

from rich.table import Table
from rich.text import Text
from textual.widgets import RichLog

STYLES = {"debug": "grey50", "info": "", "warning": "yellow", "error": "bold red"}


class EventLog(RichLog):
    def __init__(self, **kw):
        kw.setdefault("max_lines", 2000)
        kw.setdefault("min_width", 20)  # RichLog lays lines out at least 78 wide otherwise
        super().__init__(**kw)
        self.n_written = 0

    def add(self, level: str, text: str, t: float | None = None) -> None:
        ts = time.strftime("%H:%M:%S", time.localtime(time.time() if t is None else t))
        row = Table.grid(padding=(0, 1), expand=True)
        row.add_column(no_wrap=True)
        row.add_column(no_wrap=True, width=7)
        row.add_column(ratio=1)
        style = STYLES.get(level, "")
        # a path longer than the line folds (whole), it is not cut off
        row.add_row(Text(ts, style="grey50"), Text(level.upper(), style=style),
                    Text(text, style=style, overflow="fold"))
        self.write(row, expand=True)
        self.n_written += 1
