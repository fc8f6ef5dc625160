"""A slot: one sequence state kept between requests (for prefix reuse) and the generation
running on it now, if any."""
from __future__ import annotations

import collections
import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .. import metrics
from ..cache.checkpoints import CheckpointList
from ..sampling import Sampler
from .events import CacheSource
from .output import StreamOutput
from .protocols import SequenceState
from .task import Task

if TYPE_CHECKING:  # pragma: no cover
    from ..constrain import Constraint


class Phase(str, enum.Enum):
    IDLE = "idle"
    PREFILL = "prefill"  # evaluating prompt tokens, chunk by chunk
    DECODE = "decode"  # generating, one token per step

    def __str__(self) -> str:
        return self.value


class Pooling:
    """An embedding request's hidden states pooled as its prompt is evaluated, chunk by
    chunk: their mean, the first (cls) or the last."""

    def __init__(self, kind: str):
        self.kind = kind
        self.acc: np.ndarray | None = None
        self.n = 0

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        if self.kind == "cls":
            if self.acc is None:
                self.acc = rows[0].astype(np.float64)
        elif self.kind == "last":
            self.acc = rows[-1].astype(np.float64)
        else:
            s = rows.astype(np.float64).sum(axis=0)
            self.acc = s if self.acc is None else self.acc + s
        self.n += len(rows)

    def vector(self) -> list[float]:
        if self.acc is None:
            return []
        v = self.acc / self.n if self.kind == "mean" and self.n else self.acc
        return v.astype(np.float32).tolist()


@dataclass
class Generation:
    """A request running on a slot, from its first prompt chunk to its final event."""

    task: Task
    pending: np.ndarray  # int32 prompt tokens still to evaluate after the reused prefix
    n_prompt: int
    n_cached: int  # prompt tokens reused from a cached state
    sampler: Sampler
    output: StreamOutput
    history: list[int]  # prompt + generated tokens (repeat penalties look at them)
    constraint: "Constraint | None" = None  # the grammar the output must fit: masks each sample
    pooled: "Pooling | None" = None  # an embedding request's pooling of its hidden states
    drafter: "NgramDrafter | None" = None  # speculative decoding: proposes tokens to verify
    draft: list[int] = field(default_factory=list)  # drafted for the step being run
    n_drafted: int = 0
    n_draft_accepted: int = 0
    cache_source: CacheSource = CacheSource.NONE
    n_ckpt_restored: int = 0
    ckpt_plan: collections.deque = field(default_factory=collections.deque)  # (position, kind)
    phase: Phase = Phase.PREFILL
    i_pending: int = 0  # of `pending`, evaluated so far
    generated: list[int] = field(default_factory=list)
    last_token: int = -1
    t_start: float = field(default_factory=time.perf_counter)
    t_prompt_done: float = 0.0

    @property
    def position(self) -> int:
        """Prompt tokens the slot's state covers now."""
        return self.n_cached + self.i_pending

    @property
    def n_prefilled(self) -> int:
        return self.i_pending if self.phase is Phase.PREFILL else len(self.pending)

    @property
    def prefill_left(self) -> int:
        return len(self.pending) - self.i_pending


class Slot:
    def __init__(self, id: int, n_ctx: int, max_checkpoints: int = 32):
        self.id = id
        self.n_ctx = n_ctx
        self.state: SequenceState | None = None  # kept between requests for prefix reuse
        self.checkpoints = CheckpointList(max_checkpoints)  # of self.state's token sequence
        self.published = False  # state already saved to the RAM cache as it is now
        self.gen: Generation | None = None
        self.t_last_used = 0.0
        self.last: Generation | None = None  # the finished generation (stats of /slots)

    @property
    def busy(self) -> bool:
        return self.gen is not None

    @property
    def task(self) -> Task | None:
        return self.gen.task if self.gen is not None else None

    @property
    def phase(self) -> Phase:
        return self.gen.phase if self.gen is not None else Phase.IDLE

    @property
    def n_tokens(self) -> int:
        return 0 if self.state is None else self.state.n_tokens

    def stats(self) -> metrics.SlotStats:
        now = time.perf_counter()
        g = self.gen or self.last
        pps = gps = 0.0
        if self.gen is not None:
            if g.phase is Phase.PREFILL and now > g.t_start:
                pps = g.i_pending / (now - g.t_start)
            elif g.t_prompt_done and now > g.t_prompt_done:
                pt = g.t_prompt_done - g.t_start
                pps = len(g.pending) / pt if pt > 0 else 0.0
                gps = len(g.generated) / (now - g.t_prompt_done)
        return metrics.SlotStats(
            id=self.id, state=str(self.phase), n_ctx=self.n_ctx, n_tokens=self.n_tokens,
            task_id=self.gen.task.id if self.gen is not None else None,
            n_prompt=g.n_prompt if g else 0, n_cached=g.n_cached if g else 0,
            n_prefilled=g.n_prefilled if g else 0, n_decoded=len(g.generated) if g else 0,
            prompt_per_second=pps, predicted_per_second=gps, t_last_used=self.t_last_used,
            nbytes=self.state.nbytes if self.state is not None else 0,
            cache_source=str(g.cache_source) if g else "none", n_checkpoints=len(self.checkpoints),
            checkpoint_bytes=self.checkpoints.nbytes,
        )


__all__ = ["Phase", "Generation", "Pooling", "Slot"]
