"""The prefix policy (llmcore.engine.prefix) as a plain object, and the one sequence that
used to restore a freed state: pick an entry, save the slot's own state (the budget evicts
the pick), restore."""
import numpy as np
import pytest

from fakes import FakeModel
from fixtures import tiny_models  # noqa: F401
from llmcore.cache.pool import BlockRefcountError
from llmcore.cache.prompt_cache import PromptCache
from llmcore.engine import Engine, EngineConfig, GenParams
from llmcore.engine.events import CacheSource
from llmcore.engine.prefix import SAVE_MIN_TAIL_TOKENS, PrefixPolicy
from llmcore.engine.slot import Slot
from llmcore.engine.stats import EngineCounters
from llmcore.sampling import SamplingParams


def policy(cache_bytes=None, similarity=0.1):
    model = FakeModel()
    c = EngineCounters()
    pc = None
    pol = None
    if cache_bytes is not None:
        pc = PromptCache(cache_bytes, on_release=lambda e: pol.release_entry(e))
    pol = PrefixPolicy(model.new_state, pc, c, slot_prompt_similarity=similarity)
    return pol, c


def slot_with(i, tokens, t_last_used=0.0):
    s = Slot(i, 1000)
    if tokens is not None:
        s.state = FakeModel().new_state()
        s.state.tokens = list(tokens)
    s.t_last_used = t_last_used
    return s


def test_pick_prefers_the_longest_usable_prefix_then_lru():
    pol, _ = policy()
    prompt = list(range(1, 21))
    a = slot_with(0, prompt[:5], t_last_used=5)
    b = slot_with(1, prompt[:12] + [99], t_last_used=9)
    empty = slot_with(2, None, t_last_used=1)
    assert pol.pick_slot([a, b, empty], prompt, -1, True) is b
    # below the similarity threshold: the least recently used slot, empty ones first
    pol.slot_prompt_similarity = 0.9
    assert pol.pick_slot([a, b, empty], prompt, -1, True) is empty
    assert pol.pick_slot([a, b], prompt, -1, True) is a
    # id_slot wins, and waits while that slot is busy
    assert pol.pick_slot([a, b, empty], prompt, 0, True) is a
    a.gen = object()
    assert pol.pick_slot([a, b, empty], prompt, 0, True) is None


def test_prepare_trims_the_slot_and_keeps_one_token_to_evaluate():
    pol, c = policy()
    s = slot_with(0, [1, 2, 3, 4, 5, 6])
    n, src, n_ck = pol.prepare(s, [1, 2, 3, 9, 9], True)
    assert (n, src, n_ck) == (3, CacheSource.SLOT, 0) and s.state.tokens == [1, 2, 3]
    # the whole prompt cached: one token is left to evaluate
    n, src, _ = pol.prepare(s, [1, 2, 3], True)
    assert n == 2 and s.state.tokens == [1, 2]
    assert c.slot_hits == 2 and c.slot_misses == 0


def test_prepare_restores_from_ram_and_saves_the_slot_first():
    pol, c = policy(cache_bytes=1 << 20)
    s = slot_with(0, [7, 7, 7])
    other = slot_with(1, [1, 2, 3, 4, 5, 6, 7, 8])
    pol.save(other)
    n, src, _ = pol.prepare(s, [1, 2, 3, 4, 5, 6, 7, 9], True)
    assert (n, src) == (7, CacheSource.RAM) and s.state.tokens == [1, 2, 3, 4, 5, 6, 7]
    assert c.ram_hits == 1
    # the slot's old content went to the cache before it was replaced
    assert pol.pcache.best([7, 7, 7, 7])[1] == 3


def test_chats_behind_one_system_prompt_keep_their_histories_in_ram():
    """One slot, two conversations sharing a long system prompt: the slot keeps more than
    half of A's tokens when B's turn trims it (llama-server would not save A then), but A's
    history is a tail worth keeping, so A's next turn finds all of it in the RAM cache."""
    pol, c = policy(cache_bytes=1 << 20)
    system = list(range(1, 101))
    a = system + list(range(1000, 1000 + SAVE_MIN_TAIL_TOKENS))
    b = system + [5000, 5001]
    s = slot_with(0, a)
    n, src, _ = pol.prepare(s, b, True)
    assert (n, src) == (100, CacheSource.SLOT)
    a_next = a + [7000, 7001]
    n, src, _ = pol.prepare(s, a_next, True)
    assert (n, src) == (len(a), CacheSource.RAM) and c.ram_hits == 1
    # a short tail is not worth an entry: the slot is only trimmed
    pol2, _ = policy(cache_bytes=1 << 20)
    s2 = slot_with(0, system + [1, 2, 3])
    pol2.prepare(s2, b, True)
    assert pol2.pcache.n_entries == 0


def test_pinned_entry_survives_the_save_that_overflows_the_budget():
    """A budget that holds one entry: saving the slot's own state would evict the entry
    just chosen; it is pinned, so the restore gets it intact, and the budget holds after."""
    pol, c = policy(cache_bytes=16 * 10)  # FakeSnapshot: 16 bytes a token
    chosen = slot_with(1, [1, 2, 3, 4, 5, 6, 7, 8])
    pol.save(chosen)
    s = slot_with(0, [9, 9, 9, 9, 9, 9])
    n, src, _ = pol.prepare(s, [1, 2, 3, 4, 5, 6, 7, 8, 4], True)
    assert (n, src) == (8, CacheSource.RAM) and s.state.tokens == [1, 2, 3, 4, 5, 6, 7, 8]
    assert c.cache_restore_failures == 0
    assert pol.pcache.nbytes <= pol.pcache.limit_bytes  # the overflow went at unpin
    e, got = pol.pcache.best([1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert got == 8 and e.pins == 0


def test_failed_restore_is_a_miss_and_clears_the_slot():
    pol, c = policy(cache_bytes=1 << 20)
    pol.save(slot_with(1, [1, 2, 3, 4, 5]))

    def fail(what):
        if what == "restore":
            raise RuntimeError("injected")

    pol.fault_hook = fail
    s = slot_with(0, [8, 8])
    n, src, _ = pol.prepare(s, [1, 2, 3, 4, 5, 6], True)
    assert (n, src) == (0, CacheSource.NONE) and s.state.n_tokens == 0
    assert c.cache_restore_failures == 1 and c.slot_misses == 1


# ---- the same sequence on a real model: KV blocks are shared, freed, reused ---------------

def _gp():
    return GenParams(n_predict=4, ignore_eos=True, sampling=SamplingParams(temperature=0.0, n_probs=3))


def _toks(seed, n):
    return np.random.default_rng(seed).integers(3, 250, size=n).tolist()


def _engine(path, **cfg):
    from fakes import FakeTokenizer
    from llmcore.models import load_model

    eng = Engine(EngineConfig(n_ctx=2048, n_ubatch=64, **cfg), model=load_model(path),
                 tokenizer=FakeTokenizer())
    eng.start()
    return eng


@pytest.mark.parametrize("pinning", [True, False])
def test_pick_save_evict_restore_gives_the_recomputed_tokens(tiny_models, monkeypatch, pinning):
    """One slot; A runs, B (unrelated) pushes A into the RAM cache; A + more comes back:
    the cache's pick is A, and saving B first overflows a one-entry budget. With pinning
    the restore is exact; without it (the old code) the pick is evicted before the restore,
    which touches freed blocks: in strict mode (the tests' default) that fails the request
    (this proves the test reaches the path; outside tests it was a quiet miss, or worse)."""
    path = tiny_models["llama-f32"]
    if not pinning:
        monkeypatch.setattr(PromptCache, "pin", lambda self, e: None)
        monkeypatch.setattr(PromptCache, "unpin", lambda self, e: self.enforce())
    a, b = _toks(1, 120), _toks(2, 100)
    ref = _engine(path, cache_ram_mib=0)
    eng = _engine(path, cache_ram_mib=1)
    try:
        want = ref.generate_sync(a + [5, 6, 7], GenParams(n_predict=4, ignore_eos=True, cache_prompt=False,
                                                          sampling=SamplingParams(temperature=0.0, n_probs=3)))
        eng.generate_sync(a, _gp())
        per_token = eng.plan.kv_bytes_per_token
        # room for one conversation's blocks, not two
        eng.pcache.limit_bytes = int(per_token * 160)
        eng.generate_sync(b, _gp())  # A's state goes to the cache, B runs on the slot
        assert eng.pcache.best(a)[1] > 100
        if not pinning:
            with pytest.raises(BlockRefcountError):
                eng.generate_sync(a + [5, 6, 7], _gp())
            return
        got = eng.generate_sync(a + [5, 6, 7], _gp())
        assert eng.stats().cache_restore_failures == 0
        assert got.final.timings.cache_source == "ram" and got.final.timings.cache_n == len(a)
        assert got.tokens == want.tokens
        for x, y in zip(got.samples, want.samples):
            assert abs(x.logprob - y.logprob) < 2e-3
        # every block a cache entry counts is really held
        pool = eng.model.pools["kv"]
        for e in eng.pcache.entries():
            assert all(pool.refcount[bk] >= 1 for bk in e.blocks.get("kv", np.zeros(0, np.int64)).tolist())
    finally:
        eng.stop()
        ref.stop()
