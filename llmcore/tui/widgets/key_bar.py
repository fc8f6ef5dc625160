"""Bottom line: the keys, as many as fit (`?` lists them all)."""
from __future__ import annotations

from rich.text import Text

from ..formatting import GAP
from .panel import Panel


class KeyBar(Panel):
    def __init__(self, keys: list[tuple[str, str]], **kw):
        """keys: (key as shown, what it does), most important first."""
        super().__init__(**kw)
        self.keys = keys

    def lines(self, width: int) -> list[Text]:
        t = Text()
        for key, what in self.keys:
            need = len(key) + 1 + len(what) + (len(GAP) if len(t) else 0)
            if len(t) + need > width:
                break
            if len(t):
                t.append(GAP)
            t.append(key, style="bold reverse")
            t.append(" " + what)
        return [t]
