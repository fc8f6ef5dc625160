"""What one batched step looks like to the layers.

``model.forward(batch)`` takes a list of ``(SeqState, tokens)`` segments; each segment's
tokens are appended at its sequence's current positions. All tokens of all segments go
through each Linear together, and attention is one call per layer with per-sequence block
tables. :class:`ForwardBatch` is everything the layers need about that step, computed once.
"""
from __future__ import annotations

import numpy as np


class ForwardBatch:
    """One batched step.

    - ``tokens`` int32 (N,), ``positions`` int32 (N,), ``seg_start`` int32 (S+1,)
    - ``seqs``: the SeqStates, ``lengths``: tokens per segment, ``starts``: first position
    - ``block_tables[group]``: int32 (S, max_blocks) padded with 0, per cache group
    - ``last_rows``: int (S,) row index of each segment's last token
    - ``logit_rows``: the rows whose logits the step returns: ``last_rows``, or the last
      ``n_logits[i]`` rows of each segment when given (speculative decoding verifies them)
    - ``rope_tables``: cos/sin tables of the positions per rope configuration, computed by
      the first attention layer that needs one and shared by the others
    - ``decode_seqs``: uint8 (S,), 1 for a segment whose every position's logits are wanted
      (a verify segment): attention gives each of its tokens the bits decoding it alone
      gives, so speculative greedy output is plain decoding's; None when there is none
    """

    __slots__ = ("tokens", "positions", "seg_start", "seqs", "lengths", "starts",
                 "block_tables", "last_rows", "logit_rows", "decode_seqs", "n_tokens", "n_seqs", "rope_tables")

    def __init__(self, seqs, token_arrays, starts, n_logits=None):
        self.seqs = seqs
        self.n_seqs = len(seqs)
        self.lengths = [len(t) for t in token_arrays]
        self.starts = starts
        if len(token_arrays) == 1:
            self.tokens = np.asarray(token_arrays[0], dtype=np.int32)
        else:
            self.tokens = np.concatenate(token_arrays).astype(np.int32, copy=False) if token_arrays else np.zeros(0, np.int32)
        self.n_tokens = int(self.tokens.shape[0])
        if self.n_tokens == self.n_seqs:  # one token per sequence (decode)
            seg = np.arange(self.n_seqs + 1, dtype=np.int32)
        else:
            seg = np.zeros(self.n_seqs + 1, dtype=np.int32)
            np.cumsum(self.lengths, out=seg[1:])
        self.seg_start = seg
        if self.n_seqs == 1:
            self.positions = np.arange(starts[0], starts[0] + self.lengths[0], dtype=np.int32)
        elif self.n_tokens == self.n_seqs:  # batched decode: one token per sequence
            self.positions = np.array(starts, dtype=np.int32)
        else:
            off = np.asarray(starts, dtype=np.int32) - seg[:-1]
            self.positions = (np.arange(self.n_tokens, dtype=np.int32)
                              + np.repeat(off, self.lengths).astype(np.int32, copy=False))
        self.last_rows = seg[1:] - 1
        self.decode_seqs = None
        if n_logits is None:
            self.logit_rows = self.last_rows
        else:
            if len(n_logits) != self.n_seqs or any(not 1 <= k <= n for k, n in zip(n_logits, self.lengths)):
                raise ValueError("forward: n_logits must give 1..len(segment) rows per segment")
            self.logit_rows = np.concatenate([np.arange(e - k, e) for k, e in zip(n_logits, seg[1:])]).astype(np.int64)
            if any(k > 1 for k in n_logits):
                self.decode_seqs = np.array([k > 1 for k in n_logits], dtype=np.uint8)
        self.block_tables: dict[str, np.ndarray] = {}
        self.rope_tables: dict[tuple, np.ndarray] = {}  # the layers' cos/sin tables (layers.Attention)

    def tables_for(self, group: str) -> np.ndarray:
        bt = self.block_tables.get(group)
        if bt is None:
            tabs = [s.caches[group].block_table for s in self.seqs]
            width = max(1, max(len(t) for t in tabs))
            bt = np.zeros((self.n_seqs, width), dtype=np.int32)
            for i, t in enumerate(tabs):
                bt[i, : len(t)] = t
            self.block_tables[group] = bt
        return bt


__all__ = ["ForwardBatch"]
