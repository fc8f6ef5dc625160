"""Context checkpoints (cache layer 3): snapshots of the state that trimming cannot rebuild.

Sliding-window KV (tokens that left the window are freed) and recurrent state (overwritten
in place at every token) cannot be cut back to an earlier position. A checkpoint holds a
snapshot of exactly those caches at ``n_tokens``; full-attention KV is not in it (it is
trimmed instead). Restoring checkpoint c into a state with the same token prefix:
full KV caches ``trim(c.n_tokens)``, the other caches ``restore(snap)``.

    ck = take_checkpoint(seq_state, kind="tail")   # None when every cache trims freely
    lst = CheckpointList(max_n=32); erased = lst.add(ck)
    best = lst.best_at_or_before(p)      # newest checkpoint with n_tokens <= p
    restore_checkpoint(seq_state, best)  # state now covers tokens[:best.n_tokens]
    lst.erase_after(p)                   # checkpoints past a divergence are useless

Checkpoints are shared between a slot and prompt-cache entries by a Python-level
reference count (``acquire``/``release``); the last release gives the snapshots back to
their caches (``release_snapshot``: shared blocks are decref'ed).

``plan_positions`` says where prefill should stop to take them: every N tokens, at the
start of the last user message, and a few tokens before the end of the prompt.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from .protocol import Footprint, SnapshotFormatError

TAIL_OFFSET = 4  # a checkpoint this many tokens before the end of the prompt


class CheckpointBudget:
    """The bytes of every live checkpoint (all slots' lists and the RAM cache's entries
    together: a shared checkpoint counts once) against one server-wide limit.

    A model with a large recurrent state (a 35B-A3B hybrid: ~63 MiB per sequence) would
    take 64 GiB with 32 slots x 32 checkpoints each; the budget bounds the total, and the
    engine frees the least valuable checkpoints before it takes one more.
    """

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes  # None: unbounded
        self.used = 0
        self.count = 0

    def over(self) -> int:
        """Bytes above the limit now (<= 0: within it)."""
        return -1 if self.limit_bytes is None else self.used - self.limit_bytes

    def _add(self, ck: "Checkpoint") -> None:
        self.used += ck.nbytes
        self.count += 1

    def _remove(self, ck: "Checkpoint") -> None:
        self.used -= ck.nbytes
        self.count -= 1


class Checkpoint:
    """A partial snapshot (non-trimmable caches only) at ``n_tokens``."""

    __slots__ = ("n_tokens", "snap", "nbytes", "kind", "_refs", "_release", "_budget", "seq")
    _seq = 0

    def __init__(self, n_tokens: int, snap: dict, nbytes: int, kind: str = "periodic",
                 release: Callable[[dict], None] | None = None):
        self.n_tokens = int(n_tokens)
        self.snap = snap
        self.nbytes = int(nbytes)
        self.kind = kind  # periodic | user | tail
        self._refs = 1
        self._release = release
        self._budget: CheckpointBudget | None = None
        Checkpoint._seq += 1
        self.seq = Checkpoint._seq  # creation order

    def charge(self, budget: CheckpointBudget) -> "Checkpoint":
        """Count this checkpoint against `budget` until its last release."""
        if self._budget is None and self._refs > 0:
            self._budget = budget
            budget._add(self)
        return self

    @property
    def refs(self) -> int:
        return self._refs

    def acquire(self) -> "Checkpoint":
        if self._refs <= 0:
            raise RuntimeError("acquire of a released checkpoint")
        self._refs += 1
        return self

    def release(self) -> None:
        if self._refs <= 0:
            return
        self._refs -= 1
        if self._refs == 0:
            if self._budget is not None:
                self._budget._remove(self)
                self._budget = None
            if self._release is not None:
                fn, self._release = self._release, None
                fn(self.snap)

    @property
    def alive(self) -> bool:
        return self._refs > 0

    def footprint(self) -> Footprint:
        fp = Footprint()
        for x in self.snap.values():
            fp.add(x.footprint())
        return fp

    def __repr__(self) -> str:
        return f"<Checkpoint n_tokens={self.n_tokens} kind={self.kind} {self.nbytes} B refs={self._refs}>"


def take_checkpoint(state, kind: str = "periodic") -> Checkpoint | None:
    """Snapshot the caches of a SeqState that cannot be trimmed back; None when it has
    none. The checkpoint gives its snapshots back (release_snapshot) on its last release."""
    snap = {k: c.snapshot() for k, c in state.caches.items() if c.needs_checkpoints}
    if not snap:
        return None
    return checkpoint_of(state, state.n_tokens, snap, kind)


def checkpoint_of(state, n_tokens: int, snap: dict, kind: str) -> Checkpoint:
    """A checkpoint holding `snap` (cache group -> snapshot of `state`'s caches), which it
    gives back to those caches on its last release."""
    caches = state.caches

    def release(s: dict) -> None:
        for k, x in s.items():
            caches[k].release_snapshot(x)

    return Checkpoint(n_tokens, snap, sum(x.nbytes for x in snap.values()), kind, release)


def export_checkpoint(state, ck: Checkpoint) -> dict:
    """Cache group -> SnapshotRecord of a checkpoint (its caches are `state`'s kinds)."""
    return {k: state.caches[k].export_snapshot(x) for k, x in ck.snap.items()}


def import_checkpoint(state, n_tokens: int, kind: str, records: dict) -> Checkpoint:
    """A checkpoint of `state`'s model from its records (see export_checkpoint); all or
    nothing."""
    snap: dict = {}
    try:
        for k, rec in records.items():
            c = state.caches.get(k)
            if c is None or not c.needs_checkpoints or rec.n_tokens != n_tokens:
                raise SnapshotFormatError(f"checkpoint record for group {k!r} at {rec.n_tokens} tokens")
            snap[k] = c.import_snapshot(rec)
    except BaseException:
        for k, x in snap.items():
            state.caches[k].release_snapshot(x)
        raise
    return checkpoint_of(state, n_tokens, snap, kind)


def restore_checkpoint(state, ck: Checkpoint) -> int:
    """Bring `state` back to ``ck.n_tokens`` (its tokens must start with the checkpoint's
    prefix). Returns the new length. Raises if a cache cannot get there."""
    n = ck.n_tokens
    if n > state.n_tokens:
        raise ValueError(f"checkpoint at {n} is past the state's {state.n_tokens} tokens")
    for k, c in state.caches.items():
        if k in ck.snap:
            c.restore(ck.snap[k])
        else:
            got = c.trim(n)
            if got != n:
                raise RuntimeError(f"cache {k!r} cannot be trimmed to {n} (got {got})")
    del state.tokens[n:]
    return n


class CheckpointList:
    """The checkpoints of one token sequence, ordered by ``n_tokens`` (at most ``max_n``;
    when full, the oldest-created one goes first, "user" anchors last)."""

    def __init__(self, max_n: int = 32, items: Iterable[Checkpoint] = ()):
        self.max_n = int(max_n)
        self._items: list[Checkpoint] = []
        self._order: list[Checkpoint] = []  # creation order
        for ck in items:
            self._items.append(ck)
            self._order.append(ck)
        self._items.sort(key=lambda c: c.n_tokens)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Checkpoint]:
        return iter(self._items)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._items)

    def positions(self) -> list[int]:
        return [c.n_tokens for c in self._items]

    def _drop(self, ck: Checkpoint) -> None:
        self._items.remove(ck)
        self._order.remove(ck)
        ck.release()

    def add(self, ck: Checkpoint) -> int:
        """Insert (replacing one at the same position); returns how many were erased."""
        erased = 0
        for old in [c for c in self._items if c.n_tokens == ck.n_tokens]:
            self._drop(old)
            erased += 1
        if self.max_n <= 0:
            ck.release()
            return erased
        while len(self._items) >= self.max_n:
            victim = next((c for c in self._order if c.kind != "user"), self._order[0])
            self._drop(victim)
            erased += 1
        self._items.append(ck)
        self._items.sort(key=lambda c: c.n_tokens)
        self._order.append(ck)
        return erased

    def best_at_or_before(self, n: int) -> Checkpoint | None:
        best = None
        for c in self._items:
            if c.n_tokens <= n:
                best = c
            else:
                break
        return best

    def oldest_unshared(self, keep: "Checkpoint | None" = None) -> "Checkpoint | None":
        """The oldest checkpoint only this list holds (dropping it frees its memory),
        "user" anchors last; never `keep`."""
        cands = [c for c in self._order if c.refs == 1 and c is not keep]
        return next((c for c in cands if c.kind != "user"), cands[0] if cands else None)

    def drop(self, ck: Checkpoint) -> None:
        self._drop(ck)

    def erase_after(self, n: int) -> int:
        """Drop checkpoints with n_tokens > n; returns how many."""
        gone = [c for c in self._items if c.n_tokens > n]
        for c in gone:
            self._drop(c)
        return len(gone)

    def share(self) -> "CheckpointList":
        """A second list holding the same checkpoints (each acquired once more)."""
        return CheckpointList(self.max_n, (c.acquire() for c in self._order))

    def clear(self) -> int:
        n = len(self._items)
        for c in list(self._items):
            self._drop(c)
        return n


def plan_positions(n_start: int, n_prompt: int, every_n: int = 0, user_start: int | None = None,
                   n_ubatch: int = 0, tail: int = TAIL_OFFSET) -> list[tuple[int, str]]:
    """Prefill positions (token counts) where a checkpoint should be taken, with their kind,
    strictly between ``n_start`` (tokens already in the state) and ``n_prompt``."""
    want: dict[int, str] = {}
    if every_n and every_n > 0:
        p = (n_start // every_n + 1) * every_n
        while p < n_prompt:
            want[p] = "periodic"
            p += every_n
    if n_ubatch > 0:
        want.setdefault(n_prompt - tail - n_ubatch, "tail")
    want[n_prompt - tail] = "tail"
    if user_start is not None:
        want[int(user_start)] = "user"
    return sorted((p, k) for p, k in want.items() if n_start < p < n_prompt)


__all__ = ["Checkpoint", "CheckpointBudget", "CheckpointList", "take_checkpoint", "restore_checkpoint",
           "checkpoint_of", "export_checkpoint", "import_checkpoint",
           "plan_positions", "TAIL_OFFSET"]
