"""Per-slot table. Shows the widest column layout that fits the pane (80 columns keep
slot, state, prompt progress, tokens generated and speed), sorted by a key `o` cycles."""
from __future__ import annotations

from typing import Iterable, Mapping

from rich.text import Text

from ..formatting import SLOT_LAYOUTS, SORT_KEYS, slot_layout, slot_row, sort_slots, table_lines
from .panel import Panel

STATE_STYLES = {"prefill": "yellow", "decode": "green", "busy": "green", "idle": "grey50"}
SHARE = 0.45  # of the screen's height the pane may take (the rest: caches, rates, events)


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

    def row_limit(self) -> int | None:
        """Slot rows that fit beside the other panes (None: no screen yet)."""
        if not self.is_attached or not self.screen.size.height:
            return None
        return max(1, int(self.screen.size.height * SHARE) - 3)  # borders and header

    def lines(self, width: int) -> list[Text]:
        if not self.slots:
            return [Text("no slots reported yet", style="grey50")]
        cols = slot_layout(self.slots, width)
        ordered = self.ordered()
        limit = self.row_limit()
        hidden = 0
        if limit is not None and len(ordered) > limit:  # the last row says how many more
            hidden = len(ordered) - (limit - 1)
            ordered = ordered[:limit - 1]
        rows = [slot_row(s, cols) for s in ordered]
        text = table_lines(cols, rows)
        out = [Text(text[0], style="bold")]
        for s, line in zip(ordered, text[1:]):
            out.append(Text(line, style=STATE_STYLES.get(str(s.get("state")), "")))
        if hidden:
            more = f"+{hidden} more slots ({self.sort_key} order; o sorts)"
            out.append(Text(more if len(more) <= width else f"+{hidden} more", style="grey62"))
        return out
