"""KV block pool: fixed-size token blocks shared by all layers of one attention-layer group.

One block id covers the same token range (``block_size`` positions) in every layer of the
group, so a sequence needs a single block table per group. Blocks are reference counted:
sequences, snapshots and prompt-cache entries that share a prefix share its blocks.

Storage grows on demand (in chunks, never the whole context up front) up to ``max_blocks``
(or ``max_bytes``); running out raises :class:`KVCacheFullError` and never corrupts state.
Growth reallocates the per-layer arrays, so callers must read ``pool.k[i]`` / ``pool.v[i]``
at each forward step rather than keeping references across steps.
"""
from __future__ import annotations

import os

import numpy as np

from .. import nn
from ..hugepages import HUGE_PAGE, huge_page_mapping, prefaulter
from ..errors import ContextFullError
from .protocol import LazyArray, SnapshotRecord


class KVCacheFullError(ContextFullError):
    """The KV block pool has no room left for the requested tokens."""


class BlockRefcountError(RuntimeError):
    """A block was referenced or released while free: a cached state was used after it was
    freed. A bug, never a user error; with ``STRICT_REFCOUNTS`` (the tests set it) the
    engine lets it fail the request instead of treating it as a cache miss."""


# tests (and debug runs: LLMCORE_STRICT_REFCOUNTS=1) turn refcount errors into failures
STRICT_REFCOUNTS = os.environ.get("LLMCORE_STRICT_REFCOUNTS") == "1"


def kv_row_shape(kv_type: str, head_dim: int) -> tuple[int, np.dtype]:
    """Last-axis length and dtype of one (token, kv head) row for a KV storage type."""
    if kv_type == nn.KV_F16:
        return head_dim, np.dtype(np.float16)
    if kv_type == nn.KV_F32:
        return head_dim, np.dtype(np.float32)
    if kv_type in (nn.KV_Q8_0, nn.KV_Q4_0):
        if head_dim % 32:
            raise ValueError(f"kv type {kv_type} needs head_dim % 32 == 0, got {head_dim}")
        per_block = 34 if kv_type == nn.KV_Q8_0 else 18
        return head_dim // 32 * per_block, np.dtype(np.uint8)
    raise ValueError(f"unknown kv type {kv_type!r} (expected f16, f32, q8_0 or q4_0)")


# a Q4_0 K pool (block_size % 16 == 0) stores 16-key tiles, the decode scores kernel's layout
# (LLMCORE_K_TILES=0: rows, as a V pool)
K_TILES = os.environ.get("LLMCORE_K_TILES", "1") != "0"

# storage at least this large gets its own anonymous mapping (see _make_pool)
OWN_MAPPING_BYTES = 1 << 20


def _make_pool(n_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, kv_type: str,
               reserve_only: bool = False, k_tiles: bool = False) -> np.ndarray:
    """Zeroed storage of one layer's K or V for n_blocks blocks.

    Large storage lives in its own anonymous memory mapping, not on the malloc heap: a
    pool grows by reallocating, and freed heap arrays of a few MB stay resident as
    fragments (glibc raises its mmap threshold after the first frees), so RSS outside the
    caches grew run after run; an unmapped array goes back to the OS at once.

    The mapping asks for transparent huge pages, from a 2 MiB boundary: decode attention
    reads each sequence's blocks in table order, scattered over the pool, and on 4 KiB
    pages every few rows cost a TLB miss and stop the hardware prefetcher (K/V read at
    5-7 GB/s per thread; 9-11 GB/s on huge pages, bench/attn_decode.py)."""
    empty = nn.make_kv_pool(kv_type, 0, block_size, n_kv_heads, head_dim, k_tiles=k_tiles)
    shape = (n_blocks, *empty.shape[1:])
    nbytes = int(np.prod(shape, dtype=np.int64)) * empty.dtype.itemsize
    if nbytes < OWN_MAPPING_BYTES:
        return np.zeros(shape, dtype=empty.dtype)
    return np.frombuffer(huge_page_mapping(nbytes, reserve_only=reserve_only), dtype=empty.dtype).reshape(shape)



class BlockPool:
    """K and V block storage for ``n_layers`` layers with a shared block allocator.

    ``k[i]``, ``v[i]``: arrays (capacity, block_size, n_kv_heads, row) for layer i of the group;
    a Q4_0 K in 16-key tiles (``k_tiled``: nn.make_kv_pool(k_tiles=True), the decode scores
    kernel's layout) is (capacity, block_size // 16, n_kv_heads, 16, row).
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim_k: int, head_dim_v: int | None = None,
                 *, block_size: int = 32, kv_type: str = nn.KV_F16, max_blocks: int | None = None,
                 max_bytes: int | None = None, grow_blocks: int = 64, name: str = "kv"):
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.name = name
        self.n_layers = n_layers
        self.n_kv_heads = n_kv_heads
        self.head_dim_k = head_dim_k
        self.head_dim_v = head_dim_k if head_dim_v is None else head_dim_v
        self.block_size = block_size
        self.kv_type = kv_type
        rk, dk = kv_row_shape(kv_type, self.head_dim_k)
        rv, dv = kv_row_shape(kv_type, self.head_dim_v)
        self.bytes_per_block = n_layers * block_size * n_kv_heads * (rk * dk.itemsize + rv * dv.itemsize)
        limit = max_blocks
        if max_bytes is not None and max_bytes >= 0:
            by_bytes = max_bytes // max(1, self.bytes_per_block)
            limit = by_bytes if limit is None else min(limit, by_bytes)
        self.max_blocks: int | None = limit  # None: unlimited
        self.grow_blocks = max(1, grow_blocks)
        self.capacity = 0
        self.k_tiled = K_TILES and nn.k_tiles_ok(kv_type, block_size, self.head_dim_k)
        self.k: list[np.ndarray] = [_make_pool(0, block_size, n_kv_heads, self.head_dim_k, kv_type, k_tiles=self.k_tiled)
                                    for _ in range(n_layers)]
        self.v: list[np.ndarray] = [_make_pool(0, block_size, n_kv_heads, self.head_dim_v, kv_type) for _ in range(n_layers)]
        self.refcount = np.zeros(0, dtype=np.int32)
        self._reserved: list[list[np.ndarray]] | None = None  # (K, V) x layers: max_blocks each
        self._may_reserve = True
        self._free: list[int] = []  # stack of free ids (low ids popped first)
        self.n_grows = 0
        # blocks [0, _faulted) of the arrays have their pages (or were handed to the
        # prefaulter); once the highest block handed out is half way through a huge page,
        # the next page of every array is asked for, so no step takes a page fault in every
        # layer at once, and no more than one page an array is taken before it is needed
        self._faulted = 0
        self._block_bytes = max(1, block_size * n_kv_heads * min(rk * dk.itemsize, rv * dv.itemsize))

    # ---- accounting ---------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    @property
    def n_used(self) -> int:
        return self.capacity - len(self._free)

    @property
    def n_free(self) -> int:
        """Blocks that can still be allocated (free now + room to grow)."""
        room = (self.max_blocks - self.capacity) if self.max_blocks is not None else 1 << 40
        return len(self._free) + max(0, room)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for storage (capacity, not just used blocks)."""
        return self.capacity * self.bytes_per_block

    @property
    def used_bytes(self) -> int:
        return self.n_used * self.bytes_per_block

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def can_alloc(self, n_blocks: int) -> bool:
        return n_blocks <= self.n_free

    # ---- growth -------------------------------------------------------------------------
    def _grow(self, need: int) -> None:
        """Make at least `need` more free blocks exist (reallocates the arrays)."""
        if len(self._free) >= need:
            return
        want = self.capacity + need - len(self._free)
        new_cap = max(want, self.capacity + self.grow_blocks, self.capacity + self.capacity // 2)
        if self.max_blocks is not None:
            if want > self.max_blocks:
                raise KVCacheFullError(
                    f"KV cache full: need {need} more blocks of {self.block_size} tokens, "
                    f"{self.n_free} available (limit {self.max_blocks} blocks, "
                    f"{self.max_blocks * self.bytes_per_block // (1 << 20)} MiB)")
            new_cap = min(new_cap, self.max_blocks)
        old = self.capacity
        if self._reserved is not None and new_cap > self._reserved[0][0].shape[0]:
            self._reserved = None  # the limit was raised since: reserve again (one copy)
        if (self._reserved is None and self._may_reserve and self.max_blocks is not None
                and self.max_blocks * self.bytes_per_block >= 2 * self.n_layers * OWN_MAPPING_BYTES):
            # a limited pool (of own mappings) reserves address space for all of it at
            # once: growing is then a longer view, never a copy (a copy of every layer
            # stalled the step that grew it); memory is only taken as blocks are written
            try:
                res = [[_make_pool(self.max_blocks, self.block_size, self.n_kv_heads, hd, self.kv_type,
                                   reserve_only=True, k_tiles=tiles)
                        for _ in range(self.n_layers)]
                       for hd, tiles in ((self.head_dim_k, self.k_tiled), (self.head_dim_v, False))]
            except (OSError, MemoryError, ValueError, OverflowError):
                # no such address space (strict overcommit, a ulimit): grow by copies
                self._may_reserve = False
            else:
                for arrs, rs in zip((self.k, self.v), res):
                    for a, r in zip(arrs, rs):
                        r[:old] = a
                self._reserved = res
                self._faulted = old  # the copy took them
        if self._reserved is not None:
            for arrs, rs in zip((self.k, self.v), self._reserved):
                for i, r in enumerate(rs):
                    arrs[i] = r[:new_cap]
        else:
            for arrs, hd, tiles in ((self.k, self.head_dim_k, self.k_tiled), (self.v, self.head_dim_v, False)):
                for i, a in enumerate(arrs):
                    b = _make_pool(new_cap, self.block_size, self.n_kv_heads, hd, self.kv_type, k_tiles=tiles)
                    if old:
                        b[:old] = a
                    arrs[i] = b
            self._faulted = old  # new arrays: the copy took the old blocks' pages, no more
        rc = np.zeros(new_cap, dtype=np.int32)
        rc[:old] = self.refcount
        self.refcount = rc
        # keep low ids first: push the new ids in reverse so pop() returns the lowest
        self._free = list(range(new_cap - 1, old - 1, -1)) + self._free
        self.capacity = new_cap
        self.n_grows += 1

    # ---- allocation ---------------------------------------------------------------------
    def alloc(self, n: int = 1) -> np.ndarray:
        """n new blocks with refcount 1 (int32 ids). Raises KVCacheFullError, allocating nothing."""
        if n <= 0:
            return np.zeros(0, dtype=np.int32)
        self._grow(n)
        ids = np.array([self._free.pop() for _ in range(n)], dtype=np.int32)
        self.refcount[ids] = 1
        self._fault_ahead_of(int(ids.max()) + 1)
        return ids

    def _fault_ahead_of(self, top: int) -> None:
        """Hand the pages of the blocks up to the end of the huge page that holds block
        ``top`` + half a page (within the reservation, or the capacity of arrays that grow
        by copies) to the background prefaulter, every array's next page before any
        array's later ones."""
        bb = self._block_bytes  # (the arrays start on a huge page boundary)
        limit = self._reserved[0][0].shape[0] if self._reserved is not None else self.capacity
        end = min(limit, ((top * bb + HUGE_PAGE // 2) // HUGE_PAGE + 1) * HUGE_PAGE // bb)
        if end <= self._faulted or not prefaulter.enabled:
            return
        if self._reserved is not None:
            arrays = [r for rs in self._reserved for r in rs]
        else:  # own mappings only (small pools live on the heap, where the faults are few)
            arrays = [a for a in (*self.k, *self.v) if a.nbytes >= OWN_MAPPING_BYTES]
        step = max(1, HUGE_PAGE // bb)
        spans = [(a, b0 * a.strides[0], min(end, b0 + step) * a.strides[0])
                 for b0 in range(self._faulted, end, step) for a in arrays]
        self._faulted = end
        prefaulter.submit(spans)

    def incref(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int32)
        if ids.size:
            if np.any(self.refcount[ids] <= 0):
                raise BlockRefcountError(f"{self.name}: incref of a free block")
            np.add.at(self.refcount, ids, 1)

    def decref(self, ids) -> None:
        """Drop one reference to each id; blocks reaching 0 return to the free list."""
        ids = np.asarray(ids, dtype=np.int32)
        if not ids.size:
            return
        if np.any(self.refcount[ids] <= 0):
            raise BlockRefcountError(f"{self.name}: decref of a free block")
        np.subtract.at(self.refcount, ids, 1)
        for b in ids[::-1].tolist():
            if self.refcount[b] == 0:
                self._free.append(b)

    free = decref

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's K and V in every layer (copy-on-write)."""
        for a in self.k:
            a[dst] = a[src]
        for a in self.v:
            a[dst] = a[src]

    # ---- records (state files) ----------------------------------------------------------
    def layout(self) -> dict:
        """What decides a block's bytes (a state file's fingerprint)."""
        out = {"n_layers": self.n_layers, "n_kv_heads": self.n_kv_heads, "head_dim_k": self.head_dim_k,
               "head_dim_v": self.head_dim_v, "block_size": self.block_size, "kv_type": self.kv_type}
        if self.k_tiled:  # (rows-layout files keep their fingerprint)
            out["k_layout"] = "tiles16"
        return out

    def _block_shapes(self, n: int) -> tuple[tuple, tuple, np.dtype]:
        k, v = self.k[0], self.v[0]
        return (n, *k.shape[1:]), (n, *v.shape[1:]), k.dtype

    def export_blocks(self, ids: np.ndarray) -> dict[str, LazyArray]:
        """K and V of blocks `ids` in every layer as arrays ``k{i}``/``v{i}`` read when
        needed. The caller holds references to the blocks until they are read, so their
        content cannot change (copy-on-write); ``self.k`` is looked up at read time since
        growth replaces the arrays (the old ones keep the same content)."""
        ids = np.asarray(ids, dtype=np.int32).copy()
        if not self.n_layers:
            return {}
        ks, vs, dt = self._block_shapes(len(ids))
        out: dict[str, LazyArray] = {}
        for i in range(self.n_layers):
            out[f"k{i}"] = LazyArray(ks, dt, lambda i=i: self.k[i][ids])
            out[f"v{i}"] = LazyArray(vs, dt, lambda i=i: self.v[i][ids])
        return out

    def import_blocks(self, record: SnapshotRecord, n: int) -> np.ndarray:
        """n new blocks (refcount 1) holding the K/V arrays of `record` (as made by
        ``export_blocks``). Checks every array before taking a block."""
        ks, vs, dt = self._block_shapes(n)
        arrays = [(record.array(f"k{i}", ks, dt), record.array(f"v{i}", vs, dt)) for i in range(self.n_layers)]
        ids = self.alloc(n)
        for i, (k, v) in enumerate(arrays):
            self.k[i][ids] = k
            self.v[i][ids] = v
        return ids

    def stats(self) -> dict:
        return {"name": self.name, "block_size": self.block_size, "kv_type": self.kv_type,
                "capacity_blocks": self.capacity, "used_blocks": self.n_used,
                "max_blocks": self.max_blocks, "bytes": self.nbytes, "used_bytes": self.used_bytes,
                "bytes_per_token": self.bytes_per_token, "grows": self.n_grows}
