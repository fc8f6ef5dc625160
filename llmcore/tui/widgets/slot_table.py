"""Per-slot table. Shows the widest column layout that fits the pane (80 columns keep
slot, state, prompt progress, tokens generated and speed), sorted by a key `o` cycles."""
from __future__ import annotations

from typing import Iterable, Mapping

from rich.text import Text

from ..formatting import SLOT_LAYOUTS, SORT_KEYS, slot_layout, slot_row, sort_slots, table_lines
from .panel import Panel

STATE_STYLES = {"prefill": "yellow", "decode": "green", "busy": "green", "idle": "grey50"}


class SlotTable(Panel):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.slots: list[Mapping] = []
        self.sort_key = "slot"

    def show(self, slots: Iterable[Mapping]) -> None:
        self.slots = list(slots)
        self.redraw()

    def cycle_sort(self) -> str:
        keys = list(SORT_KEYS)
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.redraw()
        return self.sort_key

    @property
    def columns(self) -> tuple[str, ...]:
        """The column keys shown at the pane's current width."""
        return slot_layout(self.slots, self.size.width) if self.size.width else SLOT_LAYOUTS[-1]

    def ordered(self) -> list[Mapping]:
        return sort_slots(self.slots, self.sort_key)

    def row_texts(self) -> list[tuple[str, ...]]:
        """Cells of every column, row by row in the shown order (tests and debugging)."""
        return [slot_row(s) for s in self.ordered()]

    def lines(self, width: int) -> list[Text]:
        if not self.slots:
            return [Text("no slots reported yet", style="grey50")]
        cols = slot_layout(self.slots, width)
        ordered = self.ordered()
        rows = [slot_row(s, cols) for s in ordered]
        text = table_lines(cols, rows)
        out = [Text(text[0], style="bold")]
        for s, line in zip(ordered, text[1:]):
            out.append(Text(line, style=STATE_STYLES.get(str(s.get("state")), "")))
        return out
