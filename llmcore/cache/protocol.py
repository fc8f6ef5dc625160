"""The one interface every per-sequence cache kind implements, and what its snapshots tell.

A model keeps, per sequence, one cache state per cache group (full-attention KV, windowed
KV of sliding-window layers, recurrent state of Mamba/DeltaNet-style layers). The engine,
the prompt cache and the checkpoints meet all of them through :class:`CacheState` and
:class:`Snapshot`; nothing outside ``llmcore.cache`` asks which kind a cache is.

Positions: ``n_tokens`` is the cache's offset, the position the next token goes to.
Trimming: ``trim(n)`` keeps the first n tokens where the kind can (full KV: always;
windowed KV: while the keys the query at n needs are still held; recurrent: only n ==
n_tokens or 0). ``min_trim()`` is the shortest length ``trim`` can reach.
Records: ``export_snapshot(snap)`` describes a snapshot as named arrays (a
:class:`SnapshotRecord`, what a state file stores: :mod:`llmcore.cache.state_file`);
``import_snapshot(record)`` builds a snapshot of this kind back from one (taking new pool
blocks). ``retain_snapshot(snap)`` adds a holder to a snapshot (one more
``release_snapshot`` is then due), so a writer can read it after its first holder let go.
Checkpoints: a kind that cannot be trimmed freely (``needs_checkpoints``) is snapshotted
at planned positions during prefill; ``checkpoint_nbytes`` is what one such snapshot costs
at most. Memory: kinds backed by a :class:`~llmcore.cache.pool.BlockPool` (``pool`` not
None) say how many blocks an append takes and how many a sequence holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .pool import BlockPool


@dataclass
class Footprint:
    """What a snapshot holds: bytes it owns outright (copies) and the pool blocks it
    references, by pool name (ids; ``block_bytes`` per pool)."""

    own_bytes: int = 0
    blocks: dict[str, np.ndarray] = field(default_factory=dict)
    block_bytes: dict[str, int] = field(default_factory=dict)

    def add(self, other: "Footprint") -> "Footprint":
        self.own_bytes += other.own_bytes
        for k, ids in other.blocks.items():
            have = self.blocks.get(k)
            self.blocks[k] = ids if have is None else np.concatenate([have, ids])
            self.block_bytes[k] = other.block_bytes[k]
        return self

    @staticmethod
    def of_blocks(pool: "BlockPool", ids: np.ndarray) -> "Footprint":
        return Footprint(0, {pool.name: np.asarray(ids)}, {pool.name: pool.bytes_per_block})


class SnapshotFormatError(ValueError):
    """A snapshot record does not fit the cache it is imported into (another model's,
    or damaged)."""


@dataclass(frozen=True)
class LazyArray:
    """One array of a snapshot record: its shape and dtype now, its content when read
    (``read()`` gathers it from a pool, or returns an array already in memory), so a
    writer streams a record one array at a time."""

    shape: tuple[int, ...]
    dtype: np.dtype
    read: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @staticmethod
    def of(a: np.ndarray) -> "LazyArray":
        return LazyArray(tuple(a.shape), a.dtype, lambda: a)

    def loaded(self) -> "LazyArray":
        """The same array read now (a copy that no longer depends on the source)."""
        return LazyArray.of(np.ascontiguousarray(self.read()))


@dataclass
class SnapshotRecord:
    """A snapshot as plain data: the cache kind that made it, its position, JSON-able
    ``meta`` and named arrays (see the module docstring)."""

    kind: str
    n_tokens: int
    meta: dict
    arrays: dict[str, LazyArray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def loaded(self) -> "SnapshotRecord":
        return SnapshotRecord(self.kind, self.n_tokens, dict(self.meta),
                              {k: a.loaded() for k, a in self.arrays.items()})

    def array(self, name: str, shape: tuple, dtype) -> np.ndarray:
        """The array ``name``, checked against the shape and dtype the importer needs."""
        a = self.arrays.get(name)
        if a is None:
            raise SnapshotFormatError(f"{self.kind} record without array {name!r}")
        if tuple(a.shape) != tuple(shape) or np.dtype(a.dtype) != np.dtype(dtype):
            raise SnapshotFormatError(f"{self.kind} record array {name!r} is {np.dtype(a.dtype)}{tuple(a.shape)}, "
                                      f"this cache needs {np.dtype(dtype)}{tuple(shape)}")
        return a.read()


@runtime_checkable
class Snapshot(Protocol):
    """An immutable handle on a cache's content at ``n_tokens`` (restorable many times)."""

    n_tokens: int

    @property
    def nbytes(self) -> int: ...

    def footprint(self) -> Footprint: ...


@runtime_checkable
class CacheState(Protocol):
    """Per-sequence state of one cache group (see module docstring)."""

    n_tokens: int
    needs_checkpoints: bool  # cannot be trimmed back freely: prefill takes checkpoints
    pool: "BlockPool | None"  # the block pool it takes memory from, if any

    def append(self, n: int) -> int:
        """Reserve n more positions (all or nothing); returns the first new position."""
        ...

    def can_trim(self, n: int) -> bool: ...

    def trim(self, n: int) -> int:
        """Keep the first n tokens as far as possible; returns the new length."""
        ...

    def min_trim(self) -> int:
        """The shortest length ``trim`` can reach now."""
        ...

    @property
    def nbytes(self) -> int: ...

    @property
    def checkpoint_nbytes(self) -> int:
        """Bytes one checkpoint of this cache costs at most (0 when never checkpointed)."""
        ...

    @property
    def n_blocks(self) -> int:
        """Pool blocks held (0 without a pool)."""
        ...

    def blocks_needed(self, n: int) -> int:
        """New pool blocks ``append(n)`` would take (0 without a pool)."""
        ...

    def blocks_to_hold(self, n_tokens: int, chunk: int) -> int:
        """Most pool blocks a sequence of n_tokens holds while it is evaluated in chunks of
        ``chunk`` tokens (a windowed cache frees what the window has left)."""
        ...

    def snapshot(self) -> Snapshot: ...

    def restore(self, snap: Snapshot) -> None: ...

    def release_snapshot(self, snap: Snapshot) -> None: ...

    def retain_snapshot(self, snap: Snapshot) -> Snapshot:
        """One more holder of `snap` (it then needs one more ``release_snapshot``)."""
        ...

    def export_snapshot(self, snap: Snapshot) -> SnapshotRecord: ...

    def import_snapshot(self, record: SnapshotRecord) -> Snapshot:
        """A snapshot of this cache built from `record` (SnapshotFormatError if it does not
        fit; KVCacheFullError when the pool has no room)."""
        ...

    def layout(self) -> dict:
        """What decides the bytes of this kind's snapshots (a state file's fingerprint)."""
        ...

    def fork(self) -> "CacheState": ...

    def release(self) -> None: ...


__all__ = ["CacheState", "Snapshot", "Footprint", "LazyArray", "SnapshotRecord", "SnapshotFormatError"]
