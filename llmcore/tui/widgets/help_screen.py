"""`?`: every key of the dashboard (from the app's bindings and this screen's own), then
what each slot column means."""
from __future__ import annotations

from typing import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..formatting import SLOT_COLUMNS

KEY_NAMES = {"question_mark": "?", "plus": "+", "equals_sign": "=", "minus": "-", "escape": "esc",
             "ctrl+c": "ctrl+c"}


def key_label(keys: str) -> str:
    """"plus,equals_sign" -> "+ ="."""
    return " ".join(KEY_NAMES.get(k.strip(), k.strip()) for k in keys.split(","))


def help_text(bindings: Iterable[Binding], own: Iterable[Binding]) -> Text:
    rows = [(key_label(b.key), b.description) for b in bindings]
    rows += [(key_label(b.key), b.description) for b in own]
    kw = max(len(k) for k, _ in rows)
    t = Text("llmcore dashboard keys\n\n", style="bold")
    for k, what in rows:
        t.append(f"  {k:<{kw}}", style="bold")
        t.append(f"  {what}\n")
    t.append("  up down  scroll this help\n")
    t.append("\nslot columns (narrow terminals show fewer)\n\n", style="bold")
    hw = max(len(c.header) for c in SLOT_COLUMNS.values())
    for c in SLOT_COLUMNS.values():
        t.append(f"  {c.header:<{hw}}", style="bold")
        t.append(f"  {c.legend}\n")
    t.rstrip()
    return t


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "close this help")]

    def __init__(self, bindings: list[Binding]):
        super().__init__()
        self._key_list = bindings

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):  # taller than 24 rows: up/down scroll it
            yield Static(help_text(self._key_list, self.BINDINGS), id="help-text")
