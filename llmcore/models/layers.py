"""Building blocks shared by the architectures: fused linears, embedding, attention over the
block pool, SwiGLU/GeGLU feed-forward, output head.

Every block takes float32 activations (n_tokens, dim) and a :class:`ForwardBatch`.
"""
from __future__ import annotations

import inspect
import math
from typing import Sequence

import numpy as np

from .. import nn, quant
from ..gguf_file import Tensor
from .base import ForwardBatch

try:
    _BATCHED_KV_STORE = "seg_start" in inspect.signature(nn.kv_store).parameters
except (TypeError, ValueError):  # pragma: no cover
    _BATCHED_KV_STORE = False


def concat_tensors(tensors: Sequence[Tensor], name: str) -> Tensor | None:
    """One (sum(out), in) tensor from row-stacked tensors of the same type, or None."""
    t0 = tensors[0]
    if any(t.ggml_type != t0.ggml_type or len(t.shape) != 2 or t.shape[1] != t0.shape[1] for t in tensors):
        return None
    raws = [t.raw() for t in tensors]
    if any(r.shape[1] != raws[0].shape[1] for r in raws):
        return None
    data = np.ascontiguousarray(np.concatenate(raws, axis=0))
    rows = sum(t.shape[0] for t in tensors)
    return Tensor(name, t0.ggml_type, (rows, t0.shape[1]), data.reshape(-1))


class FusedLinear:
    """Several Linears over the same input computed as one matmul; returns the parts.

    Uses ``quant.Linear.concat`` when the kernels provide it, else stacks the raw rows
    into one tensor (same type), else falls back to separate Linears.
    """

    def __init__(self, tensors: Sequence[Tensor], biases: Sequence[np.ndarray | None] | None = None):
        self.sizes = [t.shape[0] for t in tensors]
        ends = np.cumsum(self.sizes).tolist()
        self.bounds = list(zip([0] + ends[:-1], ends))
        biases = list(biases) if biases is not None else [None] * len(tensors)
        bias = None
        if any(b is not None for b in biases):
            bias = np.concatenate([np.zeros(n, np.float32) if b is None else np.asarray(b, np.float32)
                                   for n, b in zip(self.sizes, biases)])
        self.fused = None
        self.parts = None
        if len(tensors) == 1:
            self.fused = quant.Linear(tensors[0], bias=bias)
        else:
            concat = getattr(quant.Linear, "concat", None)
            if concat is not None:
                self.fused = concat(list(tensors), biases=biases)
            if self.fused is None:
                t = concat_tensors(tensors, "+".join(t.name for t in tensors))
                if t is not None:
                    self.fused = quant.Linear(t, bias=bias)
                else:
                    self.parts = [quant.Linear(t, bias=b) for t, b in zip(tensors, biases)]
        self.out_features = sum(self.sizes)

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        if self.fused is not None:
            y = self.fused(x)
            if len(self.sizes) == 1:
                return [y]
            return [y[:, a:b] for a, b in self.bounds]
        return [p(x) for p in self.parts]


class Embedding:
    def __init__(self, tensor: Tensor, scale: float = 1.0):
        self.tensor = tensor
        self.scale = scale
        self.n_vocab, self.dim = tensor.shape

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        x = quant.get_rows(self.tensor, ids)
        if self.scale != 1.0:
            x *= np.float32(self.scale)
        return np.ascontiguousarray(x, dtype=np.float32)


class RMSNorm:
    def __init__(self, weight: np.ndarray | None, eps: float):
        self.weight = None if weight is None else np.ascontiguousarray(weight, dtype=np.float32)
        self.eps = float(eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return nn.rms_norm(x, self.weight, self.eps)


class Attention:
    """Self-attention over one layer of a KV block pool.

    q/k/v projections (fused), optional per-head q/k RMS norm, rope, kv store into the
    group's pool at layer ``layer_idx``, one ``nn.attention`` call for all sequences,
    output projection.
    """

    def __init__(self, *, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor, n_head: int, n_head_kv: int,
                 head_dim: int, head_dim_v: int | None = None, group: str = "kv", layer_idx: int = 0,
                 rope_base: float = 10000.0, rope_dim: int | None = None, rope_neox: bool = False,
                 rope_freq_scale: float = 1.0, q_norm: np.ndarray | None = None,
                 k_norm: np.ndarray | None = None, norm_eps: float = 1e-6, scale: float | None = None,
                 window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
                 biases: Sequence[np.ndarray | None] | None = None, bo: np.ndarray | None = None,
                 pool=None):
        self.pool = pool  # the group's BlockPool (arrays are read at each call: pools grow)
        self.n_head, self.n_head_kv = n_head, n_head_kv
        self.head_dim = head_dim
        self.head_dim_v = head_dim if head_dim_v is None else head_dim_v
        self.group, self.layer_idx = group, layer_idx
        self.qkv = FusedLinear([wq, wk, wv], biases)
        self.wo = quant.Linear(wo, bias=bo)
        self.rope_base = float(rope_base)
        self.rope_dim = head_dim if not rope_dim else int(rope_dim)
        self.rope_neox = bool(rope_neox)
        self.rope_freq_scale = float(rope_freq_scale)
        self.q_norm = None if q_norm is None else RMSNorm(q_norm, norm_eps)
        self.k_norm = None if k_norm is None else RMSNorm(k_norm, norm_eps)
        self.scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)
        self.window = int(window)
        self.softcap = float(softcap)
        self.sinks = None if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32)

    def project(self, x: np.ndarray, fb: ForwardBatch):
        """q (N,H,D), k (N,KVH,D), v (N,KVH,Dv) after norms and rope."""
        n = x.shape[0]
        q, k, v = self.qkv(x)
        q = np.ascontiguousarray(q).reshape(n, self.n_head, self.head_dim)
        k = np.ascontiguousarray(k).reshape(n, self.n_head_kv, self.head_dim)
        v = np.ascontiguousarray(v).reshape(n, self.n_head_kv, self.head_dim_v)
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim)).reshape(q.shape)
        if self.k_norm is not None:
            k = self.k_norm(k.reshape(-1, self.head_dim)).reshape(k.shape)
        if self.rope_dim:
            q = nn.rope(q, fb.positions, self.rope_dim, self.rope_base, self.rope_neox, self.rope_freq_scale)
            k = nn.rope(k, fb.positions, self.rope_dim, self.rope_base, self.rope_neox, self.rope_freq_scale)
        return q, k, v

    def __call__(self, x: np.ndarray, fb: ForwardBatch, pool=None) -> np.ndarray:
        pool = self.pool if pool is None else pool
        q, k, v = self.project(x, fb)
        kp, vp = pool.k[self.layer_idx], pool.v[self.layer_idx]
        kv_type = pool.kv_type
        g = self.group
        pos = fb.positions
        ss = fb.seg_start
        if _BATCHED_KV_STORE or fb.n_seqs == 1:
            tables = fb.tables_for(g)
            if _BATCHED_KV_STORE:
                nn.kv_store(kp, kv_type, tables, pos, k, seg_start=ss)
                nn.kv_store(vp, kv_type, tables, pos, v, seg_start=ss)
            else:
                nn.kv_store(kp, kv_type, tables[0], pos, k)
                nn.kv_store(vp, kv_type, tables[0], pos, v)
        else:
            for i, s in enumerate(fb.seqs):
                r0, r1 = int(ss[i]), int(ss[i + 1])
                table = s.caches[g].block_table
                nn.kv_store(kp, kv_type, table, pos[r0:r1], k[r0:r1])
                nn.kv_store(vp, kv_type, table, pos[r0:r1], v[r0:r1])
        o = nn.attention(q, kp, vp, kv_type, fb.tables_for(g), ss, pos, self.scale,
                         window=self.window, softcap=self.softcap, sinks=self.sinks)
        return self.wo(o.reshape(x.shape[0], self.n_head * self.head_dim_v))


class GatedFFN:
    """down(act(gate(x)) * up(x)); act 'silu' (SwiGLU) or 'gelu' (GeGLU)."""

    def __init__(self, gate: Tensor, up: Tensor, down: Tensor, act: str = "silu"):
        self.gate_up = FusedLinear([gate, up])
        self.down = quant.Linear(down)
        self.act = nn.silu_mul if act == "silu" else nn.gelu_mul

    def __call__(self, x: np.ndarray) -> np.ndarray:
        g, u = self.gate_up(x)
        return self.down(self.act(g, u))


class OutputHead:
    """Final norm + lm_head (``output.weight``, or the tied ``token_embd.weight``)."""

    def __init__(self, norm: RMSNorm | None, weight: Tensor, softcap: float = 0.0):
        self.norm = norm
        self.proj = quant.Linear(weight)
        self.softcap = float(softcap)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.norm is not None:
            x = self.norm(x)
        y = self.proj(np.ascontiguousarray(x))
        if self.softcap:
            y = np.tanh(y / self.softcap) * self.softcap
        return y.astype(np.float32, copy=False)
