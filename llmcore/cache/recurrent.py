"""Recurrent state cache kind (mamba, mamba2, the short-conv layers of lfm2).

A recurrent layer keeps, per sequence, a fixed-size running state that is overwritten in
place at every token: the last K-1 inputs of its causal convolution (``conv``) and, for
SSM layers, the selective-scan state (``ssm``). The state has no per-token history, so it
cannot be cut back to an earlier position: ``can_trim(n)`` is true only for
``n == n_tokens`` (nothing to do) and ``n == 0`` (reset to the zero state). Going back
anywhere else takes a checkpoint: ``snapshot()`` copies the arrays (that copy is a
context checkpoint, ``.nbytes`` is what it costs), ``restore(snap)`` copies them back.

    st = RecurrentState(conv_shapes=[(3, 256)] * 4, ssm_shapes=[(256, 16)] * 4)
    st.append(n)                       # reserve positions (the model then runs the layers)
    conv, ssm = st.layer(i)            # this sequence's arrays of layer i, updated in place
    snap = st.snapshot(); ...; st.restore(snap)

Arrays are float32 and allocated on first use (an empty state holds no memory).

Rollback: ``append`` only advances ``n_tokens``; the arrays move when the model first
touches them (``layer(i)``). Until then ``trim`` back to the pre-append length is allowed
(``Model.forward`` uses it to undo an append when another cache of the batch is full).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .protocol import CacheState, Footprint, LazyArray, SnapshotFormatError, SnapshotRecord


@dataclass(frozen=True)
class RecurrentSnapshot:
    """A copy of a recurrent state at ``n_tokens`` (a context checkpoint)."""

    n_tokens: int
    conv: tuple  # per layer: float32 array or None (zero state)
    ssm: tuple

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.conv + self.ssm if a is not None)

    def footprint(self) -> Footprint:
        return Footprint(own_bytes=self.nbytes)


def _copy(arrs) -> tuple:
    return tuple(None if a is None else a.copy() for a in arrs)


class RecurrentState(CacheState):
    """Per-sequence conv (+ ssm) state of every recurrent layer (see module docstring).

    ``conv_shapes[i]``: shape of layer i's conv state (typically (K-1, channels));
    ``ssm_shapes[i]``: shape of its scan state, or None for conv-only layers (lfm2).
    """

    needs_checkpoints = True  # overwritten in place at every token
    pool = None  # plain arrays, no block pool
    n_blocks = 0

    def __init__(self, conv_shapes: Sequence[tuple], ssm_shapes: Sequence[tuple | None] | None = None):
        self.conv_shapes = [tuple(s) for s in conv_shapes]
        n = len(self.conv_shapes)
        ssm_shapes = [None] * n if ssm_shapes is None else list(ssm_shapes)
        if len(ssm_shapes) != n:
            raise ValueError("conv_shapes and ssm_shapes differ in length")
        self.ssm_shapes = [None if s is None else tuple(s) for s in ssm_shapes]
        self.n_layers = n
        self.n_tokens = 0
        self._state_pos = 0  # position the arrays currently describe
        self._conv: list[np.ndarray | None] = [None] * n
        self._ssm: list[np.ndarray | None] = [None] * n

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def state_bytes(self) -> int:
        """Bytes of a full state (every layer allocated), i.e. what one checkpoint costs."""
        tot = 0
        for c, s in zip(self.conv_shapes, self.ssm_shapes):
            tot += int(np.prod(c)) * 4
            if s is not None:
                tot += int(np.prod(s)) * 4
        return tot

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._conv + self._ssm if a is not None)

    @property
    def checkpoint_nbytes(self) -> int:
        return self.state_bytes

    def blocks_needed(self, n: int) -> int:
        return 0

    def blocks_to_hold(self, n_tokens: int, chunk: int) -> int:
        return 0

    # ---- access (the model updates these in place) ---------------------------------------------
    def layer(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(conv, ssm) arrays of layer i, allocated (zeros) if needed; the caller is about to
        advance them to ``n_tokens``."""
        if self._conv[i] is None:
            self._conv[i] = np.zeros(self.conv_shapes[i], dtype=np.float32)
        if self.ssm_shapes[i] is not None and self._ssm[i] is None:
            self._ssm[i] = np.zeros(self.ssm_shapes[i], dtype=np.float32)
        self._state_pos = self.n_tokens
        return self._conv[i], self._ssm[i]

    # ---- CacheState -----------------------------------------------------------------------------
    def append(self, n: int) -> int:
        if n < 0:
            raise ValueError("append: n must be >= 0")
        start = self.n_tokens
        self.n_tokens = start + n
        return start

    def can_trim(self, n: int) -> bool:
        return n == self.n_tokens or n == 0 or n == self._state_pos

    def min_trim(self) -> int:
        return self.n_tokens  # (0 is allowed too: a reset, not a trim back)

    def trim(self, n: int) -> int:
        n = max(0, n)
        if n >= self.n_tokens:
            return self.n_tokens
        if n == 0:
            self.release()
            return 0
        if n == self._state_pos:  # undo an append whose tokens never reached the arrays
            self.n_tokens = n
            return n
        return self.n_tokens  # refused: the running state cannot go back

    def snapshot(self) -> RecurrentSnapshot:
        if self._state_pos != self.n_tokens:
            raise RuntimeError("snapshot of a recurrent state in the middle of a step")
        return RecurrentSnapshot(self.n_tokens, _copy(self._conv), _copy(self._ssm))

    def restore(self, snap: RecurrentSnapshot) -> None:
        if len(snap.conv) != self.n_layers:
            raise ValueError("snapshot belongs to another model")
        for dst, src in ((self._conv, snap.conv), (self._ssm, snap.ssm)):
            for i, a in enumerate(src):
                if a is None:
                    dst[i] = None
                elif dst[i] is not None and dst[i].shape == a.shape:
                    dst[i][...] = a
                else:
                    dst[i] = a.copy()
        self.n_tokens = self._state_pos = snap.n_tokens

    def release_snapshot(self, snap: RecurrentSnapshot) -> None:
        pass  # a copy: nothing shared to give back

    def retain_snapshot(self, snap: RecurrentSnapshot) -> RecurrentSnapshot:
        return snap  # immutable copies: a second holder shares them

    # ---- records ------------------------------------------------------------------------
    record_kind = "rec"

    def layout(self) -> dict:
        return {"kind": self.record_kind, "conv": [list(s) for s in self.conv_shapes],
                "ssm": [None if s is None else list(s) for s in self.ssm_shapes]}

    def export_snapshot(self, snap: RecurrentSnapshot) -> SnapshotRecord:
        arrays = {}
        for name, arrs in (("conv", snap.conv), ("ssm", snap.ssm)):
            for i, a in enumerate(arrs):
                if a is not None:
                    arrays[f"{name}{i}"] = LazyArray.of(a)
        return SnapshotRecord(self.record_kind, snap.n_tokens, {"n_layers": self.n_layers}, arrays)

    def import_snapshot(self, record: SnapshotRecord) -> RecurrentSnapshot:
        if record.kind != self.record_kind or record.meta.get("n_layers") != self.n_layers:
            raise SnapshotFormatError(f"a {record.kind!r} record of {record.meta.get('n_layers')} layers "
                                      f"cannot restore this recurrent state ({self.n_layers} layers)")
        known = {f"conv{i}" for i in range(self.n_layers)} | {
            f"ssm{i}" for i, s in enumerate(self.ssm_shapes) if s is not None}
        if set(record.arrays) - known:
            raise SnapshotFormatError(f"rec record with unknown arrays {sorted(set(record.arrays) - known)}")

        def take(name, shapes):
            return tuple(None if f"{name}{i}" not in record.arrays else
                         np.ascontiguousarray(record.array(f"{name}{i}", shapes[i], np.float32))
                         for i in range(self.n_layers))

        return RecurrentSnapshot(record.n_tokens, take("conv", self.conv_shapes), take("ssm", self.ssm_shapes))

    def fork(self) -> "RecurrentState":
        other = RecurrentState(self.conv_shapes, self.ssm_shapes)
        other._conv = list(_copy(self._conv))
        other._ssm = list(_copy(self._ssm))
        other.n_tokens = self.n_tokens
        other._state_pos = self._state_pos
        return other

    def release(self) -> None:
        self._conv = [None] * self.n_layers
        self._ssm = [None] * self.n_layers
        self.n_tokens = self._state_pos = 0


__all__ = ["RecurrentState", "RecurrentSnapshot"]
