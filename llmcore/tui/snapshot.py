"""What the dashboard shows, as plain data: one `Snapshot` per poll.

`parsing` builds one from an in-process `EngineStats` or from a server's HTTP routes,
`formatting` turns its numbers into text, `history` keeps rates over time and finds the
events between two snapshots. None of them needs Textual, so all of it is tested without
a terminal, and `--once` / `--no-tui` print the same numbers as the panes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Snapshot:
    """One poll. `stats` is keyed by EngineStats field names, `slots` by SlotStats field
    names, `model_stats` holds the model's own counters. Any field may be missing (an older
    server, a route not offered): readers use `.get` and show "-". `connected` False means
    the source could not be read (`error` says why)."""

    time: float
    connected: bool = True
    error: str = ""
    stats: Mapping[str, Any] = field(default_factory=dict)
    slots: tuple[Mapping[str, Any], ...] = ()
    model_stats: Mapping[str, float] = field(default_factory=dict)
    # a fleet (llmcore serve --replicas): each replica's numbers, keyed like `stats`, with its
    # "status" ("ok", "down"); its slots are those of `slots` whose "replica" is its index
    replicas: tuple[Mapping[str, Any], ...] = ()

    def get(self, key: str, default=None):
        return self.stats.get(key, default)

    @classmethod
    def lost(cls, error: str, t: float | None = None) -> "Snapshot":
        return cls(time=time.time() if t is None else t, connected=False, error=error)

    def to_dict(self) -> dict:
        return {"time": self.time, "connected": self.connected, "error": self.error,
                "stats": dict(self.stats), "slots": [dict(s) for s in self.slots],
                "model_stats": dict(self.model_stats), "replicas": [dict(r) for r in self.replicas]}
