"""`?`: the key bindings, built from the app's BINDINGS."""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "close")]

    def __init__(self, bindings: list[Binding]):
        super().__init__()
        self._key_list = bindings

    def compose(self) -> ComposeResult:
        t = Table(title="llmcore dashboard keys", show_header=False, box=None, padding=(0, 2))
        for b in self._key_list:
            t.add_row(b.key.replace("question_mark", "?").replace("plus", "+").replace("minus", "-"),
                      b.description)
        with Vertical(id="help-box"):
            yield Static(t)
            yield Static("esc / q / ? closes", classes="help-hint")
