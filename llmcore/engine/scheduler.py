"""The scheduler: from the waiting requests and the slots to one step plan.

Admission is FIFO: a waiting request starts when the prefix policy gives it a slot and
memory admits it; a request pinned to a busy slot (``id_slot``) waits without blocking the
others. Each step then runs ONE batched forward over every busy slot: a generating slot
contributes its last sampled token, a prefilling slot a chunk of its prompt (at most
``n_ubatch`` tokens, all chunks together at most ``n_batch``; oldest request first), so a
long prompt never stalls the others' decoding. A chunk stops at the slot's next planned
checkpoint position, so the state can be snapshotted exactly there.

    plan = Scheduler(n_batch=2048, n_ubatch=512).plan(slots)
    plan.batch        # [(state, int32 tokens), ...] for model.forward
    plan.items        # the slot and token count behind each segment

A generating slot may add drafted tokens after its last sampled one (speculative decoding:
engine/speculative.py); the step then needs the logits of each of those positions.

Plain objects, no thread: tests drive them directly.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from .slot import Phase, Slot
from .task import Task


@dataclass
class StepItem:
    slot: Slot
    tokens: np.ndarray  # int32 tokens this slot adds in the step
    decode: bool  # a generated token (True) or a prompt chunk (False)
    n_draft: int = 0  # of the tokens, drafted ones after the last sampled (decode only)

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def n_logits(self) -> int:
        """Positions whose logits the step needs: the last, or every verified one."""
        return 1 + self.n_draft


@dataclass
class StepPlan:
    items: list[StepItem] = field(default_factory=list)
    # after the forward: each logits row's argmax, when a greedy request asked for it
    argmax: "np.ndarray | None" = field(default=None, compare=False, repr=False)

    @property
    def batch(self) -> list[tuple]:
        return [(it.slot.state, it.tokens) for it in self.items]

    @property
    def n_logits(self) -> list[int] | None:
        """Logit rows per segment when some verify drafts; None: the last of each."""
        if not any(it.n_draft for it in self.items):
            return None
        return [it.n_logits for it in self.items]

    @property
    def decode_only(self) -> bool:
        return all(it.decode for it in self.items)

    @property
    def n_tokens(self) -> int:
        return sum(it.n for it in self.items)

    def __len__(self) -> int:
        return len(self.items)

    def drop(self, i: int) -> StepItem:
        return self.items.pop(i)


class Scheduler:
    def __init__(self, n_batch: int, n_ubatch: int):
        self.n_batch = max(1, n_batch)
        self.n_ubatch = max(1, n_ubatch)

    def admit(self, waiting: Iterable[Task], pick: Callable[[Task], Slot | None],
              fits: Callable[[Task], bool], start: Callable[[Task, Slot], None]) -> collections.deque:
        """Start what can start, in order; returns the tasks that still wait. `start`
        makes the slot busy, so the next `pick` sees it taken."""
        still: collections.deque = collections.deque()
        for task in waiting:
            slot = pick(task)
            if slot is None or not fits(task):
                still.append(task)
                continue
            start(task, slot)
        return still

    def plan(self, slots: Sequence[Slot]) -> StepPlan:
        plan = StepPlan()
        budget = self.n_batch
        for s in slots:
            g = s.gen
            if g is not None and g.phase is Phase.DECODE:
                d = g.draft
                toks = np.array([g.last_token, *d], dtype=np.int32) if d else np.array([g.last_token], dtype=np.int32)
                plan.items.append(StepItem(s, toks, True, len(d)))
                budget -= len(toks)
        prefilling = sorted((s for s in slots if s.gen is not None and s.gen.phase is Phase.PREFILL),
                            key=lambda s: s.gen.task.t_submit)
        for s in prefilling:
            if budget <= 0 and plan.items:
                break
            g = s.gen
            n = max(1, min(g.prefill_left, self.n_ubatch, budget))
            pos = g.position
            while g.ckpt_plan and g.ckpt_plan[0][0] <= pos:  # passed (e.g. after a preemption)
                g.ckpt_plan.popleft()
            if g.ckpt_plan:  # stop the chunk at the next checkpoint position
                n = max(1, min(n, g.ckpt_plan[0][0] - pos))
            plan.items.append(StepItem(s, g.pending[g.i_pending:g.i_pending + n], False))
            budget -= n
        return plan


__all__ = ["Scheduler", "StepPlan", "StepItem"]
