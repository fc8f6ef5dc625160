"""Attention with an output gate (Qwen3-Next, Qwen3.5 / Qwen3.6 full-attention layers).

    qg = attn_q(h)                       per head [query (D) | gate (D)], interleaved by head
    q, k = rms_norm(query) * attn_q_norm, rms_norm(attn_k(h)) * attn_k_norm
    q, k = rope(q), rope(k)              partial: the first rope.dimension_count dims of a head
    o = attention(q, k, attn_v(h))       over the KV block pool, as every attention layer
    y = attn_output(o * sigmoid(gate))

:func:`split_query_gate` reorders ``attn_q``'s rows into [all queries | all gates] at load
time; the gate rows then go last in the fused projection [q | k | v | gate], so one matmul
feeds the shared attention kernels (:meth:`.layers.Attention._attend`) and the gate.
"""
from __future__ import annotations

import numpy as np

from ..gguf_file import Tensor
from .batch import ForwardBatch
from .layers import Attention, FusedLinear, matmul_into, scratch, tensor_rows


def split_query_gate(wq: Tensor, n_head: int, head_dim: int) -> tuple[Tensor, Tensor]:
    """(query rows, gate rows) of a q projection stored per head as [query | gate]."""
    if wq.shape[0] != 2 * n_head * head_dim:
        raise ValueError(f"{wq.name}: {wq.shape[0]} rows, expected 2 x {n_head} heads x {head_dim}")
    per_head = np.arange(n_head)[:, None] * 2 * head_dim + np.arange(head_dim)[None, :]
    return (tensor_rows(wq, per_head, wq.name + "[query]"),
            tensor_rows(wq, per_head + head_dim, wq.name + "[gate]"))


class GatedAttention(Attention):
    """:class:`~.layers.Attention` whose output is scaled by sigmoid(gate) before the output
    projection. ``wq`` holds the query rows, ``wgate`` the gate rows (n_head * head_dim_v
    each, see :func:`split_query_gate`); the other arguments are Attention's."""

    def __init__(self, *, wgate: Tensor, **kw):
        self._wgate = wgate  # read by _projection during Attention.__init__
        super().__init__(**kw)
        del self._wgate
        H, D, KVH, Dv = self.n_head, self.head_dim, self.n_head_kv, self.head_dim_v
        self.n_qkv = H * D + KVH * D + KVH * Dv
        if wgate.shape[0] != H * Dv:
            raise ValueError(f"{wgate.name}: {wgate.shape[0]} gate rows for {H} heads of {Dv}")

    def _projection(self, wq, wk, wv, biases) -> FusedLinear:
        return FusedLinear([wq, wk, wv, self._wgate], None if biases is None else [*biases, None])

    def _project(self, x: np.ndarray) -> np.ndarray:
        """[q | k | v | gate] rows (n, n_qkv + H*Dv): one matmul when the four weights share
        a type, else each part into its columns."""
        return self.qkv.into(x, scratch("gattn.qkvg", x.shape[0], self.qkv.out_features))

    def __call__(self, x: np.ndarray, fb: ForwardBatch, pool=None, out: np.ndarray | None = None) -> np.ndarray:
        """Gated attention output projection (n, n_embd); written into `out` when given."""
        pool = self.pool if pool is None else pool
        x = np.ascontiguousarray(x, dtype=np.float32)
        qkvg = self._project(x)
        o = self._attend(qkvg[:, :self.n_qkv], fb, pool)
        gate = qkvg[:, self.n_qkv:]
        sig = scratch("gattn.sig", x.shape[0], gate.shape[1])
        np.negative(gate, out=sig)
        np.exp(sig, out=sig)
        sig += 1.0
        o /= sig
        y = out if out is not None else np.empty((x.shape[0], self.wo.out_features), dtype=np.float32)
        return matmul_into(self.wo, o, y)


__all__ = ["GatedAttention", "split_query_gate"]
