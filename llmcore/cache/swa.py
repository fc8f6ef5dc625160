"""Windowed KV cache state for sliding-window-attention layers.

A :class:`SWAKVCacheState` is the per-sequence state of one group of local (sliding-window)
attention layers: a block table into the group's own :class:`~llmcore.cache.pool.BlockPool`,
indexed like a full table (entry ``pos // block_size``), where blocks that no future query
can see are freed and their entries set to -1 (``nn.attention`` never reads them).

Window semantics (llama.cpp ``LLAMA_SWA_TYPE_STANDARD``): the query at position ``p`` sees
key ``j`` iff ``0 <= p - j < window``. After ``n_tokens`` tokens the next query is at
``n_tokens`` and needs keys from ``n_tokens - window + 1``; a block is freed once it lies
wholly before that (minus ``slack`` tokens kept on purpose so that short trims stay
possible). Freeing happens when a step appends (``append`` frees what that step's queries
cannot see), so between steps a sequence holds at most ``window + slack + block_size``
tokens plus the last step's tokens (memory admission plans with window + chunk + block).
``evict()`` frees the same blocks eagerly (what the next query cannot see).

Trimming: cutting back to ``n`` needs the keys ``[n - window + 1, n)``; once a block of
them was freed that cut is impossible: ``can_trim(n)`` is False and ``trim(n)`` stops at the
shortest length it can really keep (and returns it).

Snapshot: the live blocks the next query needs (increfed, no copy) + ``n_tokens``; a
restore references them again (copy-on-write protects a shared, partially filled last
block on the next append, as for full KV).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .pool import BlockPool
from .protocol import Footprint, SnapshotFormatError, SnapshotRecord
from .state import BlockTableState, _record_blocks


@dataclass(frozen=True)
class SWASnapshot:
    pool: BlockPool
    first_block: int  # table index of blocks[0]; entries before it are freed (-1)
    blocks: np.ndarray  # int32 live block ids, increfed while the snapshot lives
    n_tokens: int

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * self.pool.bytes_per_block

    def footprint(self) -> Footprint:
        return Footprint.of_blocks(self.pool, self.blocks)


class SWAKVCacheState(BlockTableState):
    """KV of one sequence for sliding-window layers (see module docstring).

    ``block_table``: int32 (blocks covering [0, n_tokens)), -1 where freed.
    ``first_live``: index of the first entry that is not freed.
    """

    needs_checkpoints = True  # tokens that left the window are gone

    def __init__(self, pool: BlockPool, window: int, slack: int = 0):
        if window <= 0:
            raise ValueError("SWAKVCacheState needs window > 0")
        self.pool = pool
        self.window = int(window)
        self.slack = max(0, int(slack))
        self.n_tokens = 0
        self._table = np.full(8, -1, dtype=np.int32)
        self._n_blocks = 0
        self.first_live = 0  # entries [0, first_live) are -1

    # ---- views --------------------------------------------------------------------------
    @property
    def block_table(self) -> np.ndarray:
        """int32 entries for positions [0, n_tokens), -1 for freed blocks (view; read only)."""
        return self._table[: self._n_blocks]

    @property
    def live_blocks(self) -> np.ndarray:
        return self._table[self.first_live: self._n_blocks]

    @property
    def n_blocks(self) -> int:
        """Blocks this state holds (live ones)."""
        return self._n_blocks - self.first_live

    @property
    def nbytes(self) -> int:
        return self.n_blocks * self.pool.bytes_per_block

    @property
    def checkpoint_nbytes(self) -> int:
        """A checkpoint holds the blocks the window needs (at most window + one block)."""
        return self.pool.blocks_for(self.window + self.pool.block_size) * self.pool.bytes_per_block

    def blocks_to_hold(self, n_tokens: int, chunk: int) -> int:
        return self.pool.blocks_for(min(n_tokens, self.window + chunk + self.pool.block_size))

    @property
    def first_kept_pos(self) -> int:
        """First position whose K/V is still held."""
        return self.first_live * self.pool.block_size

    def _needed_from(self, n: int) -> int:
        """First position the query at position n can see."""
        return max(0, n - self.window + 1)

    def _set_table(self, n_blocks: int, first: int, live: np.ndarray) -> None:
        if n_blocks > len(self._table):
            self._table = np.full(max(n_blocks, 2 * len(self._table)), -1, dtype=np.int32)
        self._table[:first] = -1
        self._table[first: first + len(live)] = live
        self._n_blocks = n_blocks
        self.first_live = first

    # ---- eviction -----------------------------------------------------------------------
    def evict(self) -> int:
        """Free the blocks the next query (at n_tokens) can no longer see (keeping ``slack``
        tokens more); returns how many blocks were freed."""
        return self._free_before(self.n_tokens)

    def _free_before(self, pos: int) -> int:
        """Free the blocks the query at ``pos`` cannot see (keeping ``slack`` tokens more)."""
        keep_from = max(0, self._needed_from(pos) - self.slack)
        upto = min(keep_from // self.pool.block_size, self._n_blocks)
        if upto <= self.first_live:
            return 0
        ids = self._table[self.first_live: upto].copy()
        self._table[self.first_live: upto] = -1
        self.first_live = upto
        self.pool.decref(ids)
        return len(ids)

    # ---- growth ---------------------------------------------------------------------------
    def _extend_table(self, ids: np.ndarray) -> None:
        nb = self._n_blocks + len(ids)
        if nb > len(self._table):
            t = np.full(max(nb, 2 * len(self._table)), -1, dtype=np.int32)
            t[: self._n_blocks] = self._table[: self._n_blocks]
            self._table = t
        self._table[self._n_blocks: nb] = ids
        self._n_blocks = nb

    def append(self, n: int) -> int:
        start = super().append(n)
        if n:
            # the queries of this step start at `start`: what they cannot see is gone for good
            # (a rollback to `start` stays possible: it needs exactly what is kept)
            self._free_before(start)
        return start

    # ---- trimming -------------------------------------------------------------------------
    def min_trim(self) -> int:
        """Shortest length this state can be cut back to."""
        if self.first_live == 0:
            return 0
        # need first_kept_pos <= n - window + 1
        return min(self.n_tokens, self.first_kept_pos + self.window - 1)

    def can_trim(self, n: int) -> bool:
        if n < 0:
            return False
        return n >= self.n_tokens or n >= self.min_trim()

    def trim(self, n: int) -> int:
        n = max(0, min(n, self.n_tokens))
        n = max(n, self.min_trim())
        keep = self.pool.blocks_for(n)
        if keep < self._n_blocks:
            lo = max(keep, self.first_live)
            if lo < self._n_blocks:
                self.pool.decref(self._table[lo: self._n_blocks].copy())
            self._table[keep: self._n_blocks] = -1
            self._n_blocks = keep
            self.first_live = min(self.first_live, keep)
        self.n_tokens = n
        return n

    # ---- sharing --------------------------------------------------------------------------
    def snapshot(self) -> SWASnapshot:
        bs = self.pool.block_size
        first = max(self.first_live, min(self._needed_from(self.n_tokens) // bs, self._n_blocks))
        blocks = self._table[first: self._n_blocks].copy()
        self.pool.incref(blocks)
        return SWASnapshot(self.pool, first, blocks, self.n_tokens)

    def restore(self, snap: SWASnapshot) -> None:
        if snap.pool is not self.pool:
            raise ValueError("snapshot belongs to another pool")
        self.pool.incref(snap.blocks)
        old = self.live_blocks.copy()
        self._set_table(snap.first_block + len(snap.blocks), snap.first_block, snap.blocks)
        self.n_tokens = snap.n_tokens
        self.pool.decref(old)

    # ---- records ------------------------------------------------------------------------
    record_kind = "swa"

    def layout(self) -> dict:
        return {"kind": self.record_kind, "pool": self.pool.name, "window": self.window, **self.pool.layout()}

    def export_snapshot(self, snap: SWASnapshot) -> SnapshotRecord:
        return SnapshotRecord(self.record_kind, snap.n_tokens,
                              {"n_blocks": len(snap.blocks), "first_block": snap.first_block},
                              self.pool.export_blocks(snap.blocks))

    def import_snapshot(self, record: SnapshotRecord) -> SWASnapshot:
        n = _record_blocks(record, self.record_kind)
        first = record.meta.get("first_block")
        if not isinstance(first, int) or first < 0 or first + n != self.pool.blocks_for(record.n_tokens):
            raise SnapshotFormatError(f"swa record of {record.n_tokens} tokens: blocks {first}+{n}")
        return SWASnapshot(self.pool, first, self.pool.import_blocks(record, n), record.n_tokens)

    def fork(self) -> "SWAKVCacheState":
        other = SWAKVCacheState(self.pool, self.window, self.slack)
        live = self.live_blocks.copy()
        self.pool.incref(live)
        other._set_table(self._n_blocks, self.first_live, live)
        other.n_tokens = self.n_tokens
        return other

    def release(self) -> None:
        self.pool.decref(self.live_blocks.copy())
        self._table[: self._n_blocks] = -1
        self._n_blocks = 0
        self.first_live = 0
        self.n_tokens = 0


__all__ = ["SWAKVCacheState", "SWASnapshot"]
