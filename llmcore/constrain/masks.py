"""The token masks of a step's constrained slots, computed while the model runs.

``MaskBatch.start(constraints)`` hands every matcher to llguidance's parallel executor
on a helper thread (the computation drops the GIL) and returns at once; the engine runs
the forward meanwhile, then ``PendingMasks.apply(i, row)`` waits for the masks (usually
ready long before) and gives the logits row with every token the grammar refuses at
-inf. A slot without a constraint is never waited on, so a constrained slot costs the
others nothing but the shared cores.
"""
from __future__ import annotations

import concurrent.futures
import os
from typing import Sequence

import numpy as np

from .constraint import Constraint


class PendingMasks:
    """The masks being computed for one step; row i belongs to constraints[i]."""

    def __init__(self, future: concurrent.futures.Future | None, bits: np.ndarray, n_vocab: int):
        self._future = future
        self._bits = bits
        self._n_vocab = n_vocab

    def wait(self) -> None:
        """Until the masks are written (a matcher is not touched while they are computed);
        raises what the computation raised."""
        if self._future is not None:
            fut = self._future
            fut.result()
            self._future = None

    def settle(self) -> None:
        """Until the computation is over, whatever its outcome (end of a step)."""
        if self._future is not None:
            concurrent.futures.wait([self._future])

    def allowed(self, i: int) -> np.ndarray:
        """Bool array over the grammar's vocabulary: the tokens allowed next."""
        self.wait()
        return np.unpackbits(self._bits[i].view(np.uint8), bitorder="little")[:self._n_vocab].astype(bool)

    def apply(self, i: int, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` with the refused tokens at -inf (ids past the grammar's
        vocabulary, e.g. padding rows of the output matrix, are refused too)."""
        ok = self.allowed(i)
        out = np.full(logits.shape[0], -np.inf, dtype=np.float32)
        n = min(len(ok), logits.shape[0])
        np.copyto(out[:n], logits[:n], where=ok[:n])
        return out


class MaskBatch:
    """Computes masks for a step's constraints on one helper thread (see module doc)."""

    def __init__(self, n_threads: int | None = None):
        import llguidance

        n = n_threads or max(1, min(4, (os.cpu_count() or 2) // 2))
        self._executor = llguidance.LLExecutor(num_threads=n)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmcore-masks")

    def start(self, constraints: Sequence[Constraint]) -> PendingMasks:
        from llguidance.numpy import fill_next_token_bitmask_par

        n_vocab = constraints[0].n_vocab if constraints else 0
        bits = np.full((max(1, len(constraints)), (n_vocab + 31) // 32), -1, dtype=np.int32)
        if not constraints:
            return PendingMasks(None, bits, n_vocab)
        pairs = [(c.matcher, i) for i, c in enumerate(constraints)]
        fut = self._pool.submit(fill_next_token_bitmask_par, self._executor, pairs, bits)
        return PendingMasks(fut, bits, n_vocab)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
