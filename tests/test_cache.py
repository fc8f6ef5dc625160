"""KV block pool and per-sequence state: allocation, refcounts, growth, limit, COW."""
import numpy as np
import pytest

from llmcore import nn
from llmcore.cache import BlockPool, KVCacheFullError, KVCacheState, SeqState
from llmcore.errors import ContextFullError
from llmcore.hugepages import HUGE_PAGE, prefaulter

needs_prefault = pytest.mark.skipif(not prefaulter.enabled,
                                    reason="no MADV_POPULATE_WRITE here (Linux 5.14+), or LLMCORE_PREFAULT=0")


def make_pool(**kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("grow_blocks", 2)
    return BlockPool(2, 2, 8, **kw)


def test_alloc_free_refcount():
    p = make_pool()
    assert p.capacity == 0 and p.n_used == 0  # nothing allocated up front
    a = p.alloc(3)
    assert len(set(a.tolist())) == 3 and all(p.refcount[a] == 1) and p.n_used == 3
    p.incref(a[:1])
    p.decref(a)
    assert p.refcount[a[0]] == 1 and p.n_used == 1
    p.decref(a[:1])
    assert p.n_used == 0
    with pytest.raises(RuntimeError):
        p.decref(a[:1])  # double free is detected
    b = p.alloc(2)
    assert set(b.tolist()) <= set(range(p.capacity))  # ids are reused


def test_bytes_accounting():
    p = make_pool(kv_type=nn.KV_F16)
    assert p.bytes_per_token == 2 * 2 * 2 * 8 * 2  # layers * (K+V) * kv_heads * dim * f16
    assert p.bytes_per_block == 4 * p.bytes_per_token
    p.alloc(3)
    assert p.used_bytes == 3 * p.bytes_per_block and p.nbytes >= p.used_bytes
    assert p.k[0].shape[1:] == (4, 2, 8) and p.k[0].dtype == np.float16


def test_growth_keeps_contents():
    p = make_pool()
    a = p.alloc(2)
    p.k[1][a[1]] = 3.0
    p.v[0][a[0]] = -1.5
    cap = p.capacity
    b = p.alloc(5)  # forces a reallocation
    assert p.capacity > cap and p.n_grows >= 2
    assert np.all(p.k[1][a[1]] == 3.0) and np.all(p.v[0][a[0]] == -1.5)
    assert not set(a.tolist()) & set(b.tolist())


def test_large_storage_on_huge_page_boundaries():
    """Layers' storage of a MiB or more is its own mapping from a 2 MiB boundary (where
    transparent huge pages can back it); growth keeps contents there too."""
    from llmcore.hugepages import HUGE_PAGE

    p = BlockPool(2, 3, 64, block_size=32, grow_blocks=64)  # 64 blocks x 32 x 3 x 64 x f16 = 768 KiB
    a = p.alloc(1)
    p.k[0][a[0]] = 2.0
    p.alloc(200)  # past 1 MiB per layer: a mapping of its own
    assert p.k[0].nbytes >= 1 << 20
    for arr in (*p.k, *p.v):
        assert arr.ctypes.data % HUGE_PAGE == 0 and not arr.any() or arr is p.k[0]
    assert np.all(p.k[0][a[0]] == 2.0) and p.k[0].ctypes.data % HUGE_PAGE == 0


def test_limit_by_blocks_and_bytes():
    p = make_pool(max_blocks=5)
    p.alloc(4)
    with pytest.raises(KVCacheFullError) as ei:
        p.alloc(2)
    assert isinstance(ei.value, ContextFullError) and "KV cache full" in str(ei.value)
    assert p.n_used == 4 and p.capacity <= 5  # nothing half-allocated
    p.alloc(1)
    q = make_pool(max_bytes=3 * make_pool().bytes_per_block + 1)
    assert q.max_blocks == 3 and q.can_alloc(3) and not q.can_alloc(4)


def test_kv_state_append_trim():
    p = make_pool()
    s = KVCacheState(p)
    assert s.append(5) == 0 and s.n_tokens == 5 and s.n_blocks == 2
    assert s.append(3) == 5 and s.n_blocks == 2  # fits in the second block
    assert s.append(1) == 8 and s.n_blocks == 3
    assert s.can_trim(0)
    assert s.trim(4) == 4 and s.n_blocks == 1 and p.n_used == 1
    assert s.trim(100) == 4  # cannot grow by trimming
    s.release()
    assert p.n_used == 0 and s.n_tokens == 0


def test_append_all_or_nothing():
    p = make_pool(max_blocks=3)
    s = KVCacheState(p)
    s.append(6)
    with pytest.raises(KVCacheFullError):
        s.append(10)
    assert s.n_tokens == 6 and s.n_blocks == 2 and p.n_used == 2


def test_fork_copy_on_write():
    p = make_pool()
    s = KVCacheState(p)
    s.append(6)  # blocks: full + half
    t = s.block_table.copy()
    for layer in range(2):
        p.k[layer][t[1]] = 7.0
    c = s.fork()
    assert np.array_equal(c.block_table, t) and all(p.refcount[t] == 2)
    assert c.blocks_needed(1) == 1  # the shared half block must be copied
    c.append(1)
    assert c.block_table[0] == t[0] and c.block_table[1] != t[1]
    assert p.refcount[t[0]] == 2 and p.refcount[t[1]] == 1
    for layer in range(2):  # the copy carries every layer's data
        assert np.all(p.k[layer][c.block_table[1]] == 7.0)
    s.append(2)  # sole owner now: writes in place
    assert s.block_table[1] == t[1]
    # a fork at a block boundary shares without copying
    s.trim(4)
    d = s.fork()
    d.append(3)
    assert d.block_table[0] == t[0] and p.refcount[t[0]] == 3
    for x in (s, c, d):
        x.release()
    assert p.n_used == 0


def test_snapshot_restore():
    p = make_pool()
    seq = SeqState({"kv": KVCacheState(p)})
    seq.caches["kv"].append(7)
    seq.tokens.extend(range(7))
    snap = seq.snapshot()
    assert snap.n_tokens == 7 and snap.nbytes == 2 * p.bytes_per_block and p.n_used == 2
    seq.trim(2)
    seq.caches["kv"].append(9)
    seq.tokens.extend(range(9))
    seq.restore(snap)
    assert seq.tokens == list(range(7)) and seq.n_tokens == 7
    assert np.array_equal(seq.caches["kv"].block_table, snap.caches["kv"].blocks)
    seq.restore(snap)  # a snapshot can be restored again
    seq.release_snapshot(snap)
    seq.release()
    assert p.n_used == 0
    assert seq.common_prefix([1, 2]) == 0


def test_quantized_kv_row_shapes():
    p = BlockPool(1, 2, 64, kv_type=nn.KV_Q8_0, block_size=8)
    p.alloc(1)
    assert p.k[0].shape == (p.capacity, 8, 2, 68) and p.k[0].dtype == np.uint8
    assert p.bytes_per_token == 2 * 2 * 68
    with pytest.raises(ValueError):
        BlockPool(1, 2, 16, kv_type=nn.KV_Q4_0)


def test_limited_pool_grows_in_place():
    """A pool with a limit reserves its address space once: growth keeps the arrays'
    memory (views of one mapping per layer, on a 2 MiB boundary), and the contents."""
    from llmcore.hugepages import HUGE_PAGE

    p = BlockPool(2, 3, 64, block_size=32, grow_blocks=8, max_blocks=4096)
    a = p.alloc(3)
    p.k[1][a[2]] = 5.0
    p.v[0][a[0]] = -2.0
    start = [x.ctypes.data for x in (*p.k, *p.v)]
    p.alloc(100)
    p.alloc(1000)
    assert p.n_grows >= 3 and p.capacity >= 1103
    assert [x.ctypes.data for x in (*p.k, *p.v)] == start and all(s % HUGE_PAGE == 0 for s in start)
    assert np.all(p.k[1][a[2]] == 5.0) and np.all(p.v[0][a[0]] == -2.0)
    assert p.k[0].shape[0] == p.capacity and not p.k[0][a[2]].any()
    with pytest.raises(KVCacheFullError):
        p.alloc(4096)
    p.max_blocks = 8192  # a raised limit: one copy into a new reservation
    p.alloc(4096)
    assert np.all(p.k[1][a[2]] == 5.0) and p.k[0].shape[0] == p.capacity >= 5199


def _resident_pages(arr) -> np.ndarray:
    """mincore(2): which 4 KiB pages of arr's memory are resident (Linux)."""
    import ctypes
    import ctypes.util
    import mmap

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    page = mmap.PAGESIZE
    lo = arr.ctypes.data // page * page
    hi = -(-(arr.ctypes.data + arr.nbytes) // page) * page
    vec = (ctypes.c_ubyte * ((hi - lo) // page))()
    assert libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) == 0, ctypes.get_errno()
    return np.frombuffer(vec, dtype=np.uint8) & 1


@needs_prefault
def test_pool_takes_page_faults_ahead_of_use():
    """Once the highest block handed out is half way through a huge page, the next page of
    every K/V array is populated in the background (no step takes a fault in every layer at
    once), never more than that, and populating never changes a byte already written."""

    p = BlockPool(2, 4, 128, block_size=32, grow_blocks=8, max_blocks=4096)  # 32 KiB a block and array
    per_page = HUGE_PAGE // (32 * 4 * 128 * 2)
    a = p.alloc(3)
    assert prefaulter.wait(30)
    assert p._faulted == per_page  # the first page only, which the first writes take anyway
    rng = np.random.default_rng(0)
    want = rng.standard_normal(p.k[1][a].shape).astype(np.float16)
    p.k[1][a] = want
    b = p.alloc(per_page // 2)  # top past half the first page: the second is asked for
    p.v[0][b[-1]] = 7.0
    assert prefaulter.wait(30)
    assert p._faulted == 2 * per_page > p.capacity  # past the view, inside the reservation
    for rs in p._reserved:
        for arr in rs:
            res = _resident_pages(arr[:p._faulted])
            assert res.all(), f"{(res == 0).sum()} of {res.size} pages not resident"
            assert not _resident_pages(arr[p._faulted:]).any()  # no further
    np.testing.assert_array_equal(p.k[1][a], want)
    assert np.all(p.v[0][b[-1]] == 7.0) and not p.k[0][b].any()


def test_pool_grows_by_copies_when_address_space_cannot_be_reserved(monkeypatch):
    """Strict overcommit or a ulimit refuses the reservation: the pool grows as before."""
    import llmcore.cache.pool as pool_mod

    real = pool_mod.huge_page_mapping

    def refuse_reservations(nbytes, reserve_only=False):
        if reserve_only:
            raise OSError(12, "Cannot allocate memory")
        return real(nbytes)

    monkeypatch.setattr(pool_mod, "huge_page_mapping", refuse_reservations)
    p = BlockPool(2, 3, 64, block_size=32, grow_blocks=64, max_blocks=4096)
    a = p.alloc(100)
    p.k[1][a[7]] = 4.0
    p.alloc(900)
    assert p.capacity >= 1000 and p._reserved is None
    assert np.all(p.k[1][a[7]] == 4.0)
    with pytest.raises(KVCacheFullError):
        p.alloc(4096)


@needs_prefault
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork")
def test_prefaulter_works_in_a_forked_child():
    """The prefault thread does not survive a fork: the child starts its own (a worker
    forked after the parent used a pool would otherwise queue spans forever)."""
    import os

    BlockPool(2, 4, 128, block_size=32, max_blocks=4096).alloc(70)
    assert prefaulter.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its pool's pages were populated
        ok = False
        try:
            p = BlockPool(2, 4, 128, block_size=32, max_blocks=4096)
            p.alloc(70)
            ok = prefaulter.wait(30) and bool(_resident_pages(p._reserved[0][0][:p._faulted]).all())
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
