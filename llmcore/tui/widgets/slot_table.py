"""Per-slot table. Rows are keyed by slot id and updated cell by cell, so the cursor and
scroll position survive refreshes."""
from __future__ import annotations

from typing import Iterable, Mapping

from textual.widgets import DataTable

from ..formatting import SLOT_COLUMNS, slot_row


class SlotTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for i, name in enumerate(SLOT_COLUMNS):
            self.add_column(name, key=str(i))

    def show(self, slots: Iterable[Mapping]) -> None:
        seen = set()
        for s in slots:
            key = str(s.get("id"))
            seen.add(key)
            cells = slot_row(s)
            if key in self.rows:
                for i, val in enumerate(cells):
                    if self.get_cell(key, str(i)) != val:
                        self.update_cell(key, str(i), val)
            else:
                self.add_row(*cells, key=key)
        for key in [k.value for k in self.rows if k.value not in seen]:
            self.remove_row(key)

    def row_texts(self) -> list[tuple[str, ...]]:
        """Current cells, row by row (tests and debugging)."""
        return [tuple(str(c) for c in self.get_row(k)) for k in self.rows]
