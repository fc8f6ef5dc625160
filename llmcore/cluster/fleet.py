"""One view of the fleet: the latest report of every replica (`FleetView`) and the
fleet's `EngineStats` made from them (`aggregate`).

Reports come from the front end's poller (every `stats_interval_s`) and from the last
event batch of every request (taken after the request finished on its replica), so the
numbers a client reads right after its answer already count it. A replica that stopped
answering is `DOWN` until its replacement reports.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

from ..metrics import EngineStats
from .wire import ReplicaReport

DOWN = "down"  # EngineStats.status of a replica that does not answer (restarting, lost)

# fields that are not added up over replicas
_LARGEST = {"time", "uptime_s", "n_tokens_max", "n_ctx_slot"}
_LIMITS = {"cache_ram_limit_bytes", "checkpoints_budget_bytes"}  # -1: no limit, and stays so
_NOT_NUMBERS = {"status", "model", "slots", "model_stats", "replicas"}


def global_slot(rank: int, slot: int, n_slots: int) -> int:
    """A slot's id in the fleet: replica `rank`'s slots follow those of the ranks before."""
    return rank * n_slots + slot


def aggregate(per_rank: Sequence[EngineStats | None], *, status: str, model: str,
              n_slots: int) -> EngineStats:
    """The fleet's stats: counters and gauges summed, slots renumbered (`global_slot`)
    and marked with their replica, each replica's own stats in `replicas` (a replica
    without a report shows as DOWN)."""
    replicas = tuple(st if st is not None else EngineStats(status=DOWN, model=model)
                     for st in per_rank)
    live = [st for st in per_rank if st is not None]
    totals: dict = {}
    for f in dataclasses.fields(EngineStats):
        if f.name in _NOT_NUMBERS:
            continue
        vals = [getattr(st, f.name) for st in live]
        if not vals:
            continue
        if f.name in _LARGEST:
            totals[f.name] = max(vals)
        elif f.name in _LIMITS and any(v < 0 for v in vals):
            totals[f.name] = -1
        else:
            totals[f.name] = sum(vals)
    model_stats: dict[str, float] = {}
    for st in live:
        for k, v in st.model_stats.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                model_stats[k] = model_stats.get(k, 0) + v
    slots = tuple(dataclasses.replace(s, id=global_slot(rank, s.id, n_slots), replica=rank)
                  for rank, st in enumerate(per_rank) if st is not None for s in st.slots)
    return EngineStats(**{**totals, "status": status, "model": model, "slots": slots,
                          "model_stats": model_stats, "replicas": replicas})


class FleetView:
    """The latest report per rank; read and written from any thread."""

    def __init__(self, n_replicas: int):
        self.n_replicas = n_replicas
        self._lock = threading.Lock()
        self._reports: dict[int, ReplicaReport] = {}
        self._down: set[int] = set(range(n_replicas))

    def update(self, report: ReplicaReport) -> None:
        with self._lock:
            old = self._reports.get(report.rank)
            # a report from the process it replaced, or older than what we hold, is stale
            if old is not None and old.pid == report.pid and old.stats.time > report.stats.time:
                return
            self._reports[report.rank] = report
            self._down.discard(report.rank)

    def update_stats(self, rank: int, stats: EngineStats) -> None:
        """Fresh numbers from a replica we know (the last batch of a request)."""
        with self._lock:
            old = self._reports.get(rank)
            if old is not None and rank not in self._down and old.stats.time <= stats.time:
                self._reports[rank] = dataclasses.replace(old, stats=stats)

    def mark_down(self, rank: int) -> None:
        with self._lock:
            self._down.add(rank)

    def rank_of_actor(self, actor_id: str | None) -> int | None:
        with self._lock:
            for rank, rep in self._reports.items():
                if actor_id is not None and rep.actor_id == actor_id:
                    return rank
        return None

    def reports(self) -> list[ReplicaReport | None]:
        """Per rank: its latest report, None while it is down."""
        with self._lock:
            return [None if r in self._down else self._reports.get(r) for r in range(self.n_replicas)]

    @property
    def n_up(self) -> int:
        with self._lock:
            return self.n_replicas - len(self._down)


__all__ = ["DOWN", "FleetView", "aggregate", "global_slot"]
