"""Prompt cache (radix tree + LRU by bytes) and checkpoint lists: pure logic, mock states."""
import random

import numpy as np
import pytest

from llmcore.cache.checkpoints import Checkpoint, CheckpointList, plan_positions
from llmcore.cache.prompt_cache import PromptCache


def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Released(list):
    def __call__(self, e):
        self.append(e.state)


def make(limit=None, **kw):
    rel = Released()
    return PromptCache(limit, on_release=rel, **kw), rel


def test_lookup_longest_prefix_matches_linear_scan():
    rng = random.Random(0)
    pc, _ = make()
    seqs = []
    base = [rng.randrange(5) for _ in range(30)]
    for i in range(60):
        k = rng.randrange(0, 30)
        s = base[:k] + [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
        if pc.insert(s, f"s{i}", own_bytes=10) is not None:
            seqs.append(s)
    live = {tuple(e.tokens.tolist()) for e in pc.entries()}
    for _ in range(200):
        k = rng.randrange(0, 35)
        q = base[:k] + [rng.randrange(5) for _ in range(rng.randrange(0, 10))]
        if not q:
            continue
        want = max((lcp(s, q) for s in live), default=0)
        got = pc.lookup(q)
        got_best = got[0][1] if got else 0
        assert got_best == want
        for e, n in got:  # every reported lcp is exact
            assert n == lcp(e.tokens.tolist(), q)


def test_insert_skips_covered_and_replaces_prefixes():
    pc, rel = make()
    a = pc.insert([1, 2, 3, 4], "a", own_bytes=4)
    assert a is not None
    # a prefix of an existing (trimmable) entry: already served by it
    assert pc.insert([1, 2, 3], "b", own_bytes=3) is None and rel == ["b"]
    # an extension replaces the shorter entry
    c = pc.insert([1, 2, 3, 4, 5, 6], "c", own_bytes=6)
    assert c is not None and rel == ["b", "a"] and pc.n_entries == 1 and pc.nbytes == 6
    e, n = pc.best([1, 2, 3, 9])
    assert e is c and n == 3


def test_untrimmable_entries_keep_shorter_prefix_entries():
    pc, rel = make()
    a = pc.insert([1, 2, 3, 4], "a", own_bytes=4, trim_floor=4)  # recurrent-like
    b = pc.insert([1, 2, 3, 4, 5, 6, 7, 8], "b", own_bytes=8, trim_floor=8)
    assert a is not None and b is not None and pc.n_entries == 2  # a still useful
    e, n = pc.best([1, 2, 3, 4, 5, 9])  # diverges inside b: only a can serve
    assert e is a and n == 4
    e, n = pc.best([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert e is b and n == 8


def test_checkpoints_make_entries_usable_below_floor():
    cks = CheckpointList(8, [Checkpoint(2, {}, 5), Checkpoint(5, {}, 5)])
    pc, _ = make()
    e = pc.insert(list(range(10)), "s", checkpoints=cks, trim_floor=10, own_bytes=10)
    assert e.usable(7) == 5 and e.usable(4) == 2 and e.usable(1) == 0 and e.usable(10) == 10
    ent, n = pc.best(list(range(7)) + [99])
    assert ent is e and n == 5


def test_lru_eviction_by_bytes():
    pc, rel = make(limit=100)
    for i in range(5):
        pc.insert([i, 1, 2], f"e{i}", own_bytes=30)
    assert pc.nbytes <= 100 and pc.n_entries == 3 and rel == ["e0", "e1"]
    pc.touch(pc.best([2, 1, 2])[0])  # e2 becomes most recent
    pc.insert([9, 9], "e9", own_bytes=30)
    assert rel == ["e0", "e1", "e3"] and pc.stats["evictions"] == 3
    # larger than the whole budget: refused, released at once
    assert pc.insert([7], "big", own_bytes=101) is None and rel[-1] == "big"
    assert pc.nbytes <= 100


def test_shared_blocks_counted_once():
    pc, rel = make(limit=10 * 64)
    bb = {"kv": 64}
    pc.insert([1, 2, 3, 4], "a", blocks={"kv": [0, 1]}, block_bytes=bb)
    pc.insert([1, 2, 7, 7], "b", blocks={"kv": [0, 2]}, block_bytes=bb)  # shares block 0
    assert pc.nbytes == 3 * 64 and pc.blocks_held("kv") == 3
    pc.remove(pc.best([1, 2, 3, 4])[0])
    assert pc.nbytes == 2 * 64 and rel == ["a"]
    pc.clear()
    assert pc.nbytes == 0 and pc.n_entries == 0 and rel == ["a", "b"]


def test_tree_stays_consistent_under_churn():
    rng = np.random.default_rng(1)
    pc, rel = make(limit=2000)
    ref = {}
    for i in range(300):
        toks = rng.integers(0, 3, size=rng.integers(1, 12)).tolist()
        e = pc.insert(toks, i, own_bytes=int(rng.integers(50, 200)))
        assert pc.nbytes <= 2000
        live = {x.id: tuple(x.tokens.tolist()) for x in pc.entries()}
        q = rng.integers(0, 3, size=8).tolist()
        want = max((lcp(t, q) for t in live.values()), default=0)
        got = pc.lookup(q)
        assert (got[0][1] if got else 0) == want
    assert pc._root.count == pc.n_entries
    assert len(set(rel)) == len(rel)  # each released once
    pc.clear()
    assert pc._root.count == 0 and not pc._root.children


def test_release_failure_is_counted_not_raised():
    def boom(e):
        raise RuntimeError("injected")

    pc = PromptCache(50, on_release=boom)
    pc.insert([1], "a", own_bytes=40)
    pc.insert([2], "b", own_bytes=40)  # evicts a: release raises, cache stays consistent
    assert pc.n_entries == 1 and pc.stats["release_errors"] == 1 and pc.nbytes == 40


# ---- checkpoint lists -------------------------------------------------------------------


def test_checkpoint_list_fifo_and_anchor():
    released = []
    mk = lambda n, kind="periodic": Checkpoint(n, {}, 1, kind, release=lambda s, n=n: released.append(n))
    lst = CheckpointList(3)
    lst.add(mk(10, "user"))
    lst.add(mk(20))
    lst.add(mk(30))
    lst.add(mk(40))  # full: the oldest non-anchor (20) goes
    assert lst.positions() == [10, 30, 40] and released == [20]
    assert lst.best_at_or_before(35).n_tokens == 30 and lst.best_at_or_before(9) is None
    assert lst.erase_after(30) == 1 and released == [20, 40]
    shared = lst.share()
    lst.clear()
    assert released == [20, 40]  # still referenced by `shared`
    shared.clear()
    assert sorted(released) == [10, 20, 30, 40]


def test_plan_positions():
    p = plan_positions(0, 100, every_n=32, user_start=50, n_ubatch=16)
    assert p == [(32, "periodic"), (50, "user"), (64, "periodic"), (80, "tail"), (96, "tail")]
    assert plan_positions(90, 100, every_n=32) == [(96, "tail")]
    assert plan_positions(0, 3) == []
