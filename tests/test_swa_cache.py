"""Windowed KV cache state (llmcore/cache/swa.py): freeing, bounded trim, snapshots, forks."""
import numpy as np
import pytest

from llmcore import nn
from llmcore.cache import BlockPool, KVCacheFullError, SeqState
from llmcore.cache.swa import SWAKVCacheState

BS, WIN = 4, 10


def _pool(**kw):
    return BlockPool(1, 1, 32, block_size=BS, kv_type=nn.KV_F32, **kw)


def _needed_blocks(n, window=WIN):
    """Block indices the query at position n can see (0 <= n - j < window)."""
    lo = max(0, n - window + 1)
    return set(range(lo // BS, -(-n // BS)))


def test_append_frees_blocks_outside_window():
    pool = _pool()
    st = SWAKVCacheState(pool, WIN)
    for n in range(1, 60):
        st.append(1)
        st.evict()
        table = st.block_table
        assert len(table) == pool.blocks_for(n)
        live = {i for i, b in enumerate(table) if b >= 0}
        # exactly the blocks the next query (position n) can see, and the block it writes to
        assert live == _needed_blocks(n) | ({n // BS} if n % BS else set())
        assert st.nbytes == len(live) * pool.bytes_per_block
        assert pool.n_used == len(live)
    # memory is bounded by the window, not the length
    assert st.n_blocks <= WIN // BS + 2


def test_big_append_keeps_what_its_queries_need():
    pool = _pool()
    st = SWAKVCacheState(pool, WIN)
    st.append(20)
    start = st.append(30)  # queries at 20..49 need keys from 11 on
    assert start == 20
    t = st.block_table
    assert all(b >= 0 for b in t[11 // BS:]) and all(b < 0 for b in t[: 11 // BS])
    st.evict()
    assert {i for i, b in enumerate(st.block_table) if b >= 0} == _needed_blocks(50) | {50 // BS}


def test_trim_refused_once_tokens_left_the_window():
    pool = _pool()
    st = SWAKVCacheState(pool, WIN)
    st.append(40)
    st.evict()
    first = st.first_kept_pos  # 28: keys [28, 40) held
    assert first == 28
    lo = first + WIN - 1  # the shortest length whose next query sees only held keys
    assert st.can_trim(40) and st.can_trim(lo) and not st.can_trim(lo - 1) and not st.can_trim(0)
    assert st.trim(5) == lo and st.n_tokens == lo  # stops where it really can
    assert st.trim(lo) == lo
    # trimming inside the window works and releases blocks
    st2 = SWAKVCacheState(pool, WIN)
    st2.append(7)
    assert st2.can_trim(0) and st2.trim(2) == 2 and st2.n_blocks == 1


def test_seqstate_trim_reports_real_length():
    pool = _pool()
    st = SeqState({"swa": SWAKVCacheState(pool, WIN)})
    st.caches["swa"].append(40)
    st.caches["swa"].evict()
    st.tokens = list(range(40))
    assert not st.can_trim(10)
    got = st.trim(10)
    assert got > 10 and st.n_tokens == got == st.caches["swa"].n_tokens


def test_snapshot_restore_and_refcounts():
    pool = _pool()
    st = SWAKVCacheState(pool, WIN)
    st.append(25)
    st.evict()
    snap = st.snapshot()
    assert snap.n_tokens == 25 and set(range(snap.first_block, snap.first_block + len(snap.blocks))) \
        == _needed_blocks(25)
    assert snap.nbytes <= (WIN // BS + 2) * pool.bytes_per_block
    held = st.live_blocks.copy()
    assert (pool.refcount[snap.blocks] == 2).all()
    st.append(30)
    st.evict()
    assert st.n_tokens == 55
    st.restore(snap)
    assert st.n_tokens == 25 and np.array_equal(st.live_blocks, held[-len(snap.blocks):])
    assert (pool.refcount[snap.blocks] == 2).all()
    st.append(1)  # the shared, partly filled last block is copied first
    assert (pool.refcount[snap.blocks] >= 1).all()
    assert st.block_table[24 // BS] != snap.blocks[-1]
    st.release_snapshot(snap)
    st.release()
    assert pool.n_used == 0


def test_fork_shares_then_copies_on_write():
    pool = _pool()
    a = SWAKVCacheState(pool, WIN)
    a.append(22)
    a.evict()
    b = a.fork()
    assert np.array_equal(a.block_table, b.block_table)
    assert (pool.refcount[a.live_blocks] == 2).all()
    b.append(3)
    assert a.block_table[-1] != b.block_table[22 // BS]
    a.release()
    b.release()
    assert pool.n_used == 0


def test_append_is_all_or_nothing():
    pool = _pool(max_blocks=4)
    st = SWAKVCacheState(pool, WIN)
    st.append(12)
    before = (st.n_tokens, st.block_table.copy(), pool.n_used)
    with pytest.raises(KVCacheFullError):
        st.append(40)
    assert (st.n_tokens, pool.n_used) == before[::2] and np.array_equal(st.block_table, before[1])
    # a long conversation fits a pool sized for the window
    for _ in range(200):
        st.append(1)
        st.evict()
    assert st.n_tokens == 212


def test_slack_keeps_more_and_allows_longer_trims():
    pool = _pool()
    st = SWAKVCacheState(pool, WIN, slack=8)
    st.append(40)
    st.evict()
    assert st.first_kept_pos <= 40 - WIN + 1 - 8
    assert st.can_trim(40 - 8)


def test_kernel_never_reads_freed_blocks():
    """Attention over a table with freed (-1) entries equals attention over the full table
    with the window mask."""
    rng = np.random.default_rng(0)
    pool = BlockPool(1, 1, 32, block_size=BS, kv_type=nn.KV_F32)
    full = BlockPool(1, 1, 32, block_size=BS, kv_type=nn.KV_F32)
    st = SWAKVCacheState(pool, WIN)
    n = 37
    k = rng.standard_normal((n, 1, 32)).astype(np.float32)
    v = rng.standard_normal((n, 1, 32)).astype(np.float32)
    st.append(n)
    ids = full.alloc(full.blocks_for(n))
    pos = np.arange(n, dtype=np.int32)
    nn.kv_store(pool.k[0], nn.KV_F32, st.block_table, pos, k)
    nn.kv_store(pool.v[0], nn.KV_F32, st.block_table, pos, v)
    nn.kv_store(full.k[0], nn.KV_F32, ids, pos, k)
    nn.kv_store(full.v[0], nn.KV_F32, ids, pos, v)
    st.evict()
    # one more query at position n after eviction
    st.append(1)
    q = rng.standard_normal((1, 2, 32)).astype(np.float32)
    kn = rng.standard_normal((1, 1, 32)).astype(np.float32)
    nn.kv_store(pool.k[0], nn.KV_F32, st.block_table, np.array([n], np.int32), kn)
    nn.kv_store(pool.v[0], nn.KV_F32, st.block_table, np.array([n], np.int32), kn)
    ids = np.concatenate([ids, full.alloc(full.blocks_for(n + 1) - len(ids))])
    nn.kv_store(full.k[0], nn.KV_F32, ids, np.array([n], np.int32), kn)
    nn.kv_store(full.v[0], nn.KV_F32, ids, np.array([n], np.int32), kn)
    assert (st.block_table < 0).any()
    seg = np.array([0, 1], np.int32)
    qp = np.array([n], np.int32)
    got = nn.attention(q, pool.k[0], pool.v[0], nn.KV_F32, st.block_table[None], seg, qp, 0.2, window=WIN)
    want = nn.attention(q, full.k[0], full.v[0], nn.KV_F32, ids[None], seg, qp, 0.2, window=WIN)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
