"""The scheduler (llmcore.engine.scheduler) as a plain object: admission order and step
plans (decode tokens first, prefill chunks by age within the batch budget, chunks cut at
checkpoint positions)."""
import collections

import numpy as np

from fakes import FakeModel
from llmcore.engine.config import GenParams
from llmcore.engine.output import StreamOutput
from llmcore.engine.scheduler import Scheduler
from llmcore.engine.slot import Generation, Phase, Slot
from llmcore.engine.task import Task
from llmcore.sampling import Sampler, SamplingParams


class _Dec:
    def feed(self, t):
        return ""

    def flush(self):
        return ""


def task(n_prompt=10, t=0.0, id_slot=-1):
    tk = Task(list(range(3, 3 + n_prompt)), GenParams(id_slot=id_slot), None, lambda: None)
    tk.t_submit = t
    return tk


def busy_slot(i, phase, n_prompt=10, done=0, t=0.0, plan=()):
    s = Slot(i, 1000)
    s.state = FakeModel().new_state()
    tk = task(n_prompt, t)
    g = Generation(task=tk, pending=np.arange(n_prompt, dtype=np.int32), n_prompt=n_prompt, n_cached=0,
                   sampler=Sampler(SamplingParams(), None), output=StreamOutput(_Dec()),
                   history=list(tk.prompt), ckpt_plan=collections.deque(plan), phase=phase,
                   i_pending=done)
    g.last_token = 42
    s.gen = g
    return s


def test_decode_first_then_oldest_prefill_within_budget():
    sch = Scheduler(n_batch=20, n_ubatch=8)
    old = busy_slot(0, Phase.PREFILL, n_prompt=30, t=1.0)
    young = busy_slot(1, Phase.PREFILL, n_prompt=30, t=2.0)
    dec = busy_slot(2, Phase.DECODE, t=3.0)
    idle = Slot(3, 1000)
    plan = sch.plan([young, idle, old, dec])
    assert [(it.slot.id, it.n, it.decode) for it in plan.items] == [(2, 1, True), (0, 8, False), (1, 8, False)]
    assert plan.items[0].tokens.tolist() == [42] and not plan.decode_only
    # the budget (n_batch) caps the chunks: 1 decode + 8 + 3
    sch = Scheduler(n_batch=12, n_ubatch=8)
    plan = sch.plan([young, old, dec])
    assert [(it.slot.id, it.n) for it in plan.items] == [(2, 1), (0, 8), (1, 3)]
    assert plan.n_tokens == 12


def test_chunk_stops_at_the_next_checkpoint_position():
    sch = Scheduler(n_batch=100, n_ubatch=64)
    s = busy_slot(0, Phase.PREFILL, n_prompt=50, done=4, plan=[(3, "periodic"), (16, "user"), (46, "tail")])
    plan = sch.plan([s])
    it = plan.items[0]
    assert it.n == 12 and it.tokens.tolist() == list(range(4, 16))
    assert [p for p, _ in s.gen.ckpt_plan] == [16, 46]  # a passed position is dropped


def test_decode_only_plan():
    sch = Scheduler(n_batch=4, n_ubatch=4)
    plan = sch.plan([busy_slot(i, Phase.DECODE) for i in range(3)])
    assert plan.decode_only and len(plan) == 3 and plan.n_tokens == 3


def test_admission_is_fifo_and_a_pinned_request_does_not_block_others():
    sch = Scheduler(8, 4)
    slots = [Slot(0, 100), Slot(1, 100)]
    slots[0].gen = object()  # busy
    pinned, free_a, free_b = task(t=1, id_slot=0), task(t=2), task(t=3)
    started = []

    def pick(t):
        if t.params.id_slot >= 0:
            s = slots[t.params.id_slot]
            return None if s.gen is not None else s
        return next((s for s in slots if s.gen is None), None)

    def start(t, s):
        s.gen = t
        started.append((t, s.id))

    still = sch.admit([pinned, free_a, free_b], pick, lambda t: True, start)
    assert started == [(free_a, 1)] and list(still) == [pinned, free_b]
    # memory refuses: nothing starts, order kept
    slots[1].gen = None
    started.clear()
    still = sch.admit(still, pick, lambda t: False, start)
    assert started == [] and list(still) == [pinned, free_b]
