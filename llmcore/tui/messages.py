"""Messages the dashboard posts to itself (dataclasses, as in toolong)."""
from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from .snapshot import Snapshot


@dataclass
class StatsUpdated(Message):
    """A new poll result. Only the newest matters, so queued ones merge."""

    snapshot: Snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StatsUpdated)


@dataclass
class LogEvent(Message):
    """One line for the event log (a stats change, or a log record of the server)."""

    level: str  # debug | info | warning | error
    text: str
    when: float  # wall-clock seconds (Message already has a monotonic `time`)
