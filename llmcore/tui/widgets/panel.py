"""The base of the text panes: a widget that draws lines built for its current width (so
nothing is cut mid-word) and is as tall as those lines."""
from __future__ import annotations

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget


class Panel(Widget):
    """Subclasses implement `lines(width)`; `redraw()` after the data changed."""

    def lines(self, width: int) -> list[Text]:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self.lines(width)))

    def render(self) -> Text:
        width = self.size.width
        out = Text(no_wrap=True, overflow="crop")
        for i, line in enumerate(self.lines(width)):
            if i:
                out.append("\n")
            out.append_text(line)
        return out

    def redraw(self) -> None:
        self.refresh(layout=True)

    def text(self) -> str:
        """What the pane shows now, as plain text (tests and debugging)."""
        return "\n".join(line.plain for line in self.lines(self.size.width or 80))
