"""Per-slot table. Shows the widest column layout that fits the pane (80 columns keep
slot, state, prompt progress, tokens generated and speed), sorted by a key `o` cycles."""
from __future__ import annotations

from typing import Iterable, Mapping

from rich.text import Text

from ..formatting import SLOT_LAYOUTS, SORT_KEYS, SlotGroup, slot_groups, slot_layout, slot_row, table_lines
from .panel import Panel

STATE_STYLES = {"prefill": "yellow", "decode": "green", "busy": "green", "idle": "grey50"}
SHARE = 0.45  # of the screen's height the pane may take (the rest: caches, rates, events)


class SlotTable(Panel):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.slots: list[Mapping] = []
        self.replicas: list[Mapping] = []  # a fleet: one row group per replica
        self.sort_key = "slot"

    def show(self, slots: Iterable[Mapping], replicas: Iterable[Mapping] = ()) -> None:
        self.slots = list(slots)
        self.replicas = list(replicas)
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

    def groups(self) -> list[SlotGroup]:
        return slot_groups(self.slots, self.replicas, self.sort_key)

    def ordered(self) -> list[Mapping]:
        return [s for g in self.groups() for s in g.slots]

    def row_texts(self) -> list[tuple[str, ...]]:
        """Cells of every column, row by row in the shown order (tests and debugging)."""
        return [slot_row(s) for s in self.ordered()]

    def row_limit(self) -> int | None:
        """Slot rows that fit beside the other panes (None: no screen yet)."""
        if not self.is_attached or not self.screen.size.height:
            return None
        return max(1, int(self.screen.size.height * SHARE) - 3)  # borders and header

    def lines(self, width: int) -> list[Text]:
        if not self.slots and not self.replicas:
            return [Text("no slots reported yet", style="grey50")]
        cols = slot_layout(self.slots, width)
        # a line per slot, and per replica its header (a group of a fleet) above its slots
        items: list[SlotGroup | Mapping] = [x for g in self.groups()
                                            for x in ([g] if g.header is not None else []) + g.slots]
        limit = self.row_limit()
        hidden = 0
        if limit is not None and len(items) > limit:  # the last row says how many more
            hidden = sum(not isinstance(x, SlotGroup) for x in items[limit - 1:])
            items = items[:limit - 1]
        shown = [x for x in items if not isinstance(x, SlotGroup)]
        text = table_lines(cols, [slot_row(s, cols) for s in shown])
        out = [Text(text[0], style="bold")]
        body = iter(text[1:])
        for x in items:
            if isinstance(x, SlotGroup):
                out.append(Text(x.header[:width], style="bold cyan" if x.ok else "bold red"))
            else:
                out.append(Text(next(body), style=STATE_STYLES.get(str(x.get("state")), "")))
        if hidden:
            more = f"+{hidden} more slots ({self.sort_key} order; o sorts)"
            out.append(Text(more if len(more) <= width else f"+{hidden} more", style="grey62"))
        return out
