"""Per-sequence cache state: full-attention KV, and the state of a whole sequence.

A :class:`SeqState` is what a slot (or a prompt-cache entry) holds for one sequence: the
tokens it has state for and one :class:`~llmcore.cache.protocol.CacheState` per cache group
of the model (``"kv"`` for full attention, ``"swa"`` for sliding-window layers
(:mod:`llmcore.cache.swa`), ``"rec"`` for recurrent layers (:mod:`llmcore.cache.recurrent`)).
Models create it with ``model.new_state()`` from their ``make_cache()``.

:class:`KVCacheState`: a block table into a :class:`~llmcore.cache.pool.BlockPool`. A
snapshot shares the blocks (reference counts, no copy); appending into a shared, partially
filled last block first copies that block (copy-on-write).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .pool import BlockPool
from .protocol import CacheState, Footprint, Snapshot, SnapshotFormatError, SnapshotRecord


@dataclass(frozen=True)
class KVSnapshot:
    pool: BlockPool
    blocks: np.ndarray  # int32, increfed while the snapshot lives
    n_tokens: int

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * self.pool.bytes_per_block

    def footprint(self) -> Footprint:
        return Footprint.of_blocks(self.pool, self.blocks)


class BlockTableState(CacheState):
    """Growth shared by the block-table states (full KV, windowed KV): ``pool``, ``_table``
    (int32 block ids, ``_n_blocks`` entries in use), ``n_blocks`` (blocks held), ``n_tokens``.
    Subclasses store new block ids with ``_extend_table``."""

    pool: BlockPool
    _table: np.ndarray
    _n_blocks: int

    @property
    def n_blocks(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def _extend_table(self, ids: np.ndarray) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _cow_last(self, n: int) -> bool:
        """Whether appending n tokens first copies the last block: it is partially filled,
        held and shared with another state (copy-on-write)."""
        return bool(n > 0 and self.n_tokens % self.pool.block_size and self.n_blocks
                    and self.pool.refcount[self._table[self._n_blocks - 1]] > 1)

    # ---- snapshots: a subclass's snapshot holds its blocks (reference counted) as ``blocks``
    def release_snapshot(self, snap: Any) -> None:
        self.pool.decref(snap.blocks)

    def retain_snapshot(self, snap: Any) -> Any:
        self.pool.incref(snap.blocks)
        return snap

    # ---- memory ---------------------------------------------------------------------------
    def blocks_to_hold(self, n_tokens: int, chunk: int) -> int:
        return self.pool.blocks_for(n_tokens)

    # ---- growth ---------------------------------------------------------------------------
    def blocks_needed(self, n: int) -> int:
        """New blocks that append(n) would allocate (incl. a copy-on-write copy)."""
        need = self.pool.blocks_for(self.n_tokens + n) - self._n_blocks
        return need + 1 if self._cow_last(n) else need

    def append(self, n: int) -> int:
        if n < 0:
            raise ValueError("append: n must be >= 0")
        start = self.n_tokens
        if n == 0:
            return start
        pool = self.pool
        new_total = pool.blocks_for(start + n) - self._n_blocks
        cow = self._cow_last(n)
        if new_total <= 0 and not cow:  # room in the last block (most decode steps)
            self.n_tokens = start + n
            return start
        ids = pool.alloc(new_total + (1 if cow else 0))  # all-or-nothing
        if cow:
            last = int(self._table[self._n_blocks - 1])
            dst = int(ids[-1])
            pool.copy_block(last, dst)
            pool.decref([last])
            self._table[self._n_blocks - 1] = dst
            ids = ids[:-1]
        if len(ids):
            self._extend_table(ids)
        self.n_tokens = start + n
        return start


class KVCacheState(BlockTableState):
    """Full-attention KV of one sequence: a block table into a :class:`BlockPool`."""

    needs_checkpoints = False  # trims to any length
    checkpoint_nbytes = 0

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.n_tokens = 0
        self._table = np.zeros(8, dtype=np.int32)
        self._n_blocks = 0

    # ---- views --------------------------------------------------------------------------
    @property
    def block_table(self) -> np.ndarray:
        """int32 block ids covering positions [0, n_tokens) (a view; do not modify)."""
        return self._table[: self._n_blocks]

    @property
    def n_blocks(self) -> int:
        return self._n_blocks

    @property
    def nbytes(self) -> int:
        return self._n_blocks * self.pool.bytes_per_block

    def _set_blocks(self, blocks: np.ndarray) -> None:
        n = len(blocks)
        if n > len(self._table):
            self._table = np.zeros(max(n, 2 * len(self._table)), dtype=np.int32)
        self._table[:n] = blocks
        self._n_blocks = n

    def _extend_table(self, ids: np.ndarray) -> None:
        self._set_blocks(np.concatenate([self.block_table, ids]))

    # ---- trimming -------------------------------------------------------------------------
    def can_trim(self, n: int) -> bool:
        return 0 <= n

    def min_trim(self) -> int:
        return 0

    def trim(self, n: int) -> int:
        n = max(0, min(n, self.n_tokens))
        keep = self.pool.blocks_for(n)
        if keep < self._n_blocks:
            self.pool.decref(self._table[keep: self._n_blocks].copy())
            self._n_blocks = keep
        self.n_tokens = n
        return n

    # ---- sharing --------------------------------------------------------------------------
    def snapshot(self) -> KVSnapshot:
        blocks = self.block_table.copy()
        self.pool.incref(blocks)
        return KVSnapshot(self.pool, blocks, self.n_tokens)

    def restore(self, snap: KVSnapshot) -> None:
        if snap.pool is not self.pool:
            raise ValueError("snapshot belongs to another pool")
        self.pool.incref(snap.blocks)
        old = self.block_table.copy()
        self._set_blocks(snap.blocks)
        self.n_tokens = snap.n_tokens
        self.pool.decref(old)

    # ---- records ------------------------------------------------------------------------
    record_kind = "kv"

    def layout(self) -> dict:
        return {"kind": self.record_kind, "pool": self.pool.name, **self.pool.layout()}

    def export_snapshot(self, snap: KVSnapshot) -> SnapshotRecord:
        return SnapshotRecord(self.record_kind, snap.n_tokens, {"n_blocks": len(snap.blocks)},
                              self.pool.export_blocks(snap.blocks))

    def import_snapshot(self, record: SnapshotRecord) -> KVSnapshot:
        n = _record_blocks(record, self.record_kind)
        if n != self.pool.blocks_for(record.n_tokens):
            raise SnapshotFormatError(f"kv record of {record.n_tokens} tokens with {n} blocks")
        return KVSnapshot(self.pool, self.pool.import_blocks(record, n), record.n_tokens)

    def fork(self) -> "KVCacheState":
        other = KVCacheState(self.pool)
        blocks = self.block_table.copy()
        self.pool.incref(blocks)
        other._set_blocks(blocks)
        other.n_tokens = self.n_tokens
        return other

    def release(self) -> None:
        self.trim(0)


def _record_blocks(record: SnapshotRecord, kind: str) -> int:
    """The block count of a block-table record of `kind` (SnapshotFormatError otherwise)."""
    if record.kind != kind:
        raise SnapshotFormatError(f"a {record.kind!r} record cannot restore a {kind!r} cache")
    try:
        n = int(record.meta["n_blocks"])
    except (KeyError, TypeError, ValueError):
        raise SnapshotFormatError(f"{kind} record without a block count") from None
    if n < 0 or record.n_tokens < 0:
        raise SnapshotFormatError(f"{kind} record with {n} blocks, {record.n_tokens} tokens")
    return n


@dataclass(frozen=True)
class SeqSnapshot:
    tokens: tuple[int, ...]
    caches: dict  # group name -> cache snapshot

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.caches.values())

    def footprint(self) -> Footprint:
        fp = Footprint()
        for s in self.caches.values():
            fp.add(s.footprint())
        return fp


@dataclass
class SeqState:
    """State of one sequence: its tokens and one CacheState per cache group.

    ``tokens`` holds exactly the tokens whose state is in the caches (the model's forward
    extends it); all caches have ``n_tokens == len(tokens)`` between forward calls.
    """

    caches: dict[str, CacheState]
    tokens: list[int] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches.values())

    # ---- what the engine plans with ----------------------------------------------------------
    @property
    def needs_checkpoints(self) -> bool:
        """Some cache cannot be trimmed back freely (windowed KV, recurrent state)."""
        return any(c.needs_checkpoints for c in self.caches.values())

    @property
    def checkpoint_nbytes(self) -> int:
        """Bytes one context checkpoint of this sequence costs at most."""
        return sum(c.checkpoint_nbytes for c in self.caches.values() if c.needs_checkpoints)

    @property
    def fixed_state_nbytes(self) -> int:
        """Bytes of the fixed-size state (not per token, not in a pool: recurrent layers)
        one sequence holds at most."""
        return sum(c.checkpoint_nbytes for c in self.caches.values() if c.pool is None)

    def min_trim(self) -> int:
        """Shortest prefix this state can be cut back to without a checkpoint."""
        return min(self.n_tokens, max((c.min_trim() for c in self.caches.values()), default=0))

    def blocks_needed(self, n: int) -> dict[BlockPool, int]:
        """New blocks per pool that evaluating n more tokens takes."""
        out: dict[BlockPool, int] = {}
        for c in self.caches.values():
            if c.pool is not None:
                out[c.pool] = out.get(c.pool, 0) + c.blocks_needed(n)
        return out

    def blocks_held(self) -> dict[BlockPool, int]:
        out: dict[BlockPool, int] = {}
        for c in self.caches.values():
            if c.pool is not None:
                out[c.pool] = out.get(c.pool, 0) + c.n_blocks
        return out

    def blocks_to_hold(self, n_tokens: int, chunk: int) -> dict[BlockPool, int]:
        """Most blocks per pool a sequence of n_tokens holds, evaluated in chunks."""
        out: dict[BlockPool, int] = {}
        for c in self.caches.values():
            if c.pool is not None:
                out[c.pool] = out.get(c.pool, 0) + c.blocks_to_hold(n_tokens, chunk)
        return out

    def can_trim(self, n: int) -> bool:
        return all(c.can_trim(n) for c in self.caches.values())

    def trim(self, n: int) -> int:
        """Keep the first n tokens (as far as every cache can); returns the new length."""
        n = max(0, min(n, len(self.tokens)))
        if not self.can_trim(n):  # the nearest length >= n every cache accepts (before cutting any)
            n = next((m for m in range(n + 1, len(self.tokens)) if self.can_trim(m)), len(self.tokens))
        got = [c.trim(n) for c in self.caches.values()]
        new = max(got) if got else n
        if new != n:  # some cache could not go back that far: bring all to the same length
            got = [c.trim(new) for c in self.caches.values()]
            if any(g != new for g in got):
                raise RuntimeError("caches disagree after trim")
        del self.tokens[new:]
        return new

    def snapshot(self) -> SeqSnapshot:
        return SeqSnapshot(tuple(self.tokens), {k: c.snapshot() for k, c in self.caches.items()})

    def restore(self, snap: SeqSnapshot) -> None:
        for k, c in self.caches.items():
            c.restore(snap.caches[k])
        self.tokens = list(snap.tokens)

    def release_snapshot(self, snap: SeqSnapshot) -> None:
        for k, c in self.caches.items():
            c.release_snapshot(snap.caches[k])

    def retain_snapshot(self, snap: SeqSnapshot) -> SeqSnapshot:
        for k, c in self.caches.items():
            c.retain_snapshot(snap.caches[k])
        return snap

    # ---- records (state files) ---------------------------------------------------------------
    def layout(self) -> dict:
        """Cache group -> what decides its snapshots' bytes."""
        return {k: c.layout() for k, c in self.caches.items()}

    def export_snapshot(self, snap: SeqSnapshot) -> dict[str, SnapshotRecord]:
        return {k: c.export_snapshot(snap.caches[k]) for k, c in self.caches.items()}

    def import_snapshot(self, tokens, records: dict[str, SnapshotRecord]) -> SeqSnapshot:
        """A SeqSnapshot of `tokens` from one record per cache group (all or nothing:
        what was imported is given back when a later group fails)."""
        tokens = tuple(int(t) for t in tokens)
        if set(records) != set(self.caches):
            raise SnapshotFormatError(f"records for groups {sorted(records)}, this model has {sorted(self.caches)}")
        done: dict = {}
        try:
            for k, c in self.caches.items():
                if records[k].n_tokens != len(tokens):
                    raise SnapshotFormatError(f"{k} record at {records[k].n_tokens} tokens, the state has {len(tokens)}")
                done[k] = c.import_snapshot(records[k])
        except BaseException:
            for k, snap in done.items():
                self.caches[k].release_snapshot(snap)
            raise
        return SeqSnapshot(tokens, done)

    def fork(self) -> "SeqState":
        return SeqState({k: c.fork() for k, c in self.caches.items()}, list(self.tokens))

    def release(self) -> None:
        for c in self.caches.values():
            c.release()
        self.tokens.clear()

    def common_prefix(self, tokens) -> int:
        """Length of the common prefix of this state's tokens and `tokens`."""
        a = self.tokens
        n = min(len(a), len(tokens))
        i = 0
        while i < n and a[i] == tokens[i]:
            i += 1
        return i
