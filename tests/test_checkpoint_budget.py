"""One server-wide budget for context checkpoints (all slots and the RAM cache together):
taking one more frees idle slots' checkpoints first, then cache entries holding some, then
the slot's own oldest; with nothing left to free the checkpoint is skipped, never over."""
from llmcore.cache.checkpoints import CheckpointBudget
from llmcore.cache.prompt_cache import PromptCache
from llmcore.cache.recurrent import RecurrentState
from llmcore.cache.state import SeqState
from llmcore.engine.prefix import PrefixPolicy
from llmcore.engine.slot import Slot
from llmcore.engine.stats import EngineCounters

SHAPES = dict(conv_shapes=[(3, 8)], ssm_shapes=[(8, 4)])  # 224 bytes a checkpoint


def new_state():
    return SeqState({"rec": RecurrentState(**SHAPES)})


def advance(slot, n):
    st = slot.state
    for c in st.caches.values():
        c.append(n)
        c.layer(0)[0][...] += 1.0  # the "model" moved the state
    st.tokens.extend(range(len(st.tokens), len(st.tokens) + n))


def setup(limit_checkpoints, cache_bytes=None):
    ck_bytes = new_state().checkpoint_nbytes
    budget = CheckpointBudget(int(limit_checkpoints * ck_bytes))
    c = EngineCounters()
    pol = None
    pc = PromptCache(cache_bytes, on_release=lambda e: pol.release_entry(e)) if cache_bytes else None
    pol = PrefixPolicy(new_state, pc, c, needs_checkpoints=True, checkpoint_budget=budget)
    slots = [Slot(i, 1000) for i in range(3)]
    for s in slots:
        s.state = new_state()
    return pol, c, budget, slots, ck_bytes


def test_idle_slots_give_their_checkpoints_first():
    pol, c, budget, (a, b, _), ckb = setup(3)
    for _ in range(3):
        advance(a, 4)
        pol.take_checkpoint(a, "periodic", [a, b])
    assert len(a.checkpoints) == 3 and budget.used == 3 * ckb
    b.gen = object()  # b runs now, a is idle
    advance(b, 4)
    pol.take_checkpoint(b, "periodic", [a, b])
    assert len(b.checkpoints) == 1 and a.checkpoints.positions() == [8, 12]  # a's oldest went
    assert budget.used == 3 * ckb and c.checkpoints_created == 4 and c.checkpoints_erased == 1


def test_own_oldest_next_and_skip_when_nothing_can_go():
    pol, c, budget, (a, b, _), ckb = setup(2)
    a.gen = object()
    for _ in range(3):
        advance(a, 4)
        pol.take_checkpoint(a, "periodic", [a, b])
    assert a.checkpoints.positions() == [8, 12] and budget.used == 2 * ckb
    # a budget below one checkpoint: the new one cannot stay
    pol2, c2, budget2, (x, _, _), _ = setup(0.5)
    x.gen = object()
    advance(x, 4)
    pol2.take_checkpoint(x, "tail", [x])
    assert len(x.checkpoints) == 0 and c2.checkpoints_skipped == 1 and budget2.used == 0


def test_cache_entries_holding_checkpoints_are_evicted_whole():
    pol, c, budget, (a, b, _), ckb = setup(2, cache_bytes=1 << 20)
    for _ in range(2):
        advance(a, 4)
        pol.take_checkpoint(a, "periodic", [a, b])
    pol.save(a)  # the entry shares a's two checkpoints
    pol.clear(a)  # the slot lets go: only the entry holds them now
    assert budget.used == 2 * ckb and pol.pcache.n_entries == 1
    b.gen = object()
    advance(b, 4)
    pol.take_checkpoint(b, "periodic", [a, b])
    assert pol.pcache.n_entries == 0 and len(b.checkpoints) == 1 and budget.used == ckb


def test_shared_checkpoints_count_once():
    pol, c, budget, (a, _, _), ckb = setup(10, cache_bytes=1 << 20)
    advance(a, 4)
    pol.take_checkpoint(a, "periodic", [a])
    pol.save(a)
    assert budget.count == 1 and budget.used == ckb
    pol.pcache.clear()
    pol.clear(a)
    assert budget.count == 0 and budget.used == 0
