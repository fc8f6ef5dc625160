"""The one interface every per-sequence cache kind implements, and what its snapshots tell.

A model keeps, per sequence, one cache state per cache group (full-attention KV, windowed
KV of sliding-window layers, recurrent state of Mamba/DeltaNet-style layers). The engine,
the prompt cache and the checkpoints meet all of them through :class:`CacheState` and
:class:`Snapshot`; nothing outside ``llmcore.cache`` asks which kind a cache is.

Positions: ``n_tokens`` is the cache's offset, the position the next token goes to.
Trimming: ``trim(n)`` keeps the first n tokens where the kind can (full KV: always;
windowed KV: while the keys the query at n needs are still held; recurrent: only n ==
n_tokens or 0). ``min_trim()`` is the shortest length ``trim`` can reach.
Checkpoints: a kind that cannot be trimmed freely (``needs_checkpoints``) is snapshotted
at planned positions during prefill; ``checkpoint_nbytes`` is what one such snapshot costs
at most. Memory: kinds backed by a :class:`~llmcore.cache.pool.BlockPool` (``pool`` not
None) say how many blocks an append takes and how many a sequence holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

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

    def fork(self) -> "CacheState": ...

    def release(self) -> None: ...


__all__ = ["CacheState", "Snapshot", "Footprint"]
