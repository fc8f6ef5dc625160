"""Building blocks shared by the architectures: fused linears, embedding, attention over the
block pool, SwiGLU/GeGLU feed-forward, output head.

Every block takes float32 activations (n_tokens, dim) and a :class:`ForwardBatch`.
"""
from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

from .. import _kernels, nn, quant
from ..threads import get_num_threads
from ..gguf_file import Tensor
from .batch import ForwardBatch

# The fast paths call the kernels directly (no wrapper checks); with LLMCORE_NO_KERNELS=1
# the layers run the llmcore.nn ops (NumPy references) instead.
if _kernels.ENABLED:
    _norms, _activations, _attention, _rope = (_kernels.load(m) for m in ("norms", "activations", "attention", "rope"))
_FUSED_QKV = _kernels.ENABLED

# Decode and batched decode (a few rows per step) reuse per-thread scratch activations
# instead of allocating them at every layer; larger batches (prefill) allocate as before,
# so the scratch stays small. Scratch never escapes a layer call.
SCRATCH_MAX_ROWS = 64
_tls = threading.local()
# steps of at least this many tokens compute each rope cos/sin table once for all layers
ROPE_TABLE_MIN_ROWS = 16


def scratch(tag: str, n: int, *dims: int) -> np.ndarray:
    """A float32 (n, *dims) work array, reused across calls with the same tag and dims
    while n <= SCRATCH_MAX_ROWS (contents undefined); a fresh array otherwise."""
    if n > SCRATCH_MAX_ROWS:
        return np.empty((n, *dims), dtype=np.float32)
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    key = (tag, dims)
    b = bufs.get(key)
    if b is None:
        b = bufs[key] = np.empty((SCRATCH_MAX_ROWS, *dims), dtype=np.float32)
    return b[:n]


def matmul_into(lin: quant.Linear, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y = lin(x) for C-contiguous float32 x (n, in) and y (n, out), straight to the kernel."""
    packed = lin._packed
    if packed is None:
        return lin(x, out=y)
    lin._kernel.matmul(packed, x, y, quant._threads_for(x.shape[0], lin.nbytes))
    if lin.bias is not None:
        y += lin.bias
    return y


def rms_norm_into(x: np.ndarray, weight: np.ndarray | None, eps: float, out: np.ndarray,
                  add: np.ndarray | None = None) -> np.ndarray:
    """out = rms_norm(x (+= add)) * weight for float32 (n, d) arrays with contiguous rows
    (x updated in place when `add` is given): one kernel call, no wrapper checks."""
    if not _kernels.ENABLED:
        if add is not None:
            x += add
        return nn.rms_norm(x, weight, eps, out=out)
    _norms.rms_norm(x, weight, eps, out, add, get_num_threads())
    return out


def post_add_norm_into(x: np.ndarray, y: np.ndarray, post: "RMSNorm", norm: "RMSNorm",
                       out: np.ndarray) -> np.ndarray:
    """y = post(y); x += y; out = norm(x): a sublayer's post-norm, the residual add and the
    next pre-norm, one kernel call (float32 (n, d) arrays with contiguous rows)."""
    if not _kernels.ENABLED:
        rms_norm_into(y, post.weight, post.eps, y)
        return rms_norm_into(x, norm.weight, norm.eps, out, add=y)
    _norms.rms_norm_post_add(x, y, post.weight, post.eps, norm.weight, norm.eps, out, get_num_threads())
    return out


def tensor_rows(t: Tensor, rows, name: str | None = None) -> Tensor:
    """Rows ``rows`` (output features) of a 2-D GGUF tensor as a new tensor, a copy in that
    order: how a projection stored in another layout (fused, interleaved by head) is split
    or reordered at load time. Each row is whole quantized blocks, so any type works."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    data = np.ascontiguousarray(t.raw()[rows])
    return Tensor(name or t.name, t.ggml_type, (int(rows.shape[0]), int(t.shape[1])), data)


class FusedLinear:
    """Several Linears over the same input computed as one matmul (``quant.Linear.concat``:
    same weight type and input size), else as one matmul per run of consecutive tensors of
    one type (gemma3's Q5_0 q, k and Q8_0 v: [q; k] and v); returns the parts."""

    def __init__(self, tensors: Sequence[Tensor], biases: Sequence[np.ndarray | None] | None = None):
        self.in_features = int(tensors[0].shape[1])
        self.sizes = [t.shape[0] for t in tensors]
        ends = np.cumsum(self.sizes).tolist()
        self.bounds = list(zip([0] + ends[:-1], ends))
        biases = list(biases) if biases is not None else [None] * len(tensors)
        self.fused = (quant.Linear(tensors[0], bias=biases[0]) if len(tensors) == 1
                      else quant.Linear.concat(list(tensors), biases=biases))
        self.parts = None  # Linears of the runs, side by side at part_bounds
        self.part_bounds = None
        if self.fused is None:
            self.parts, self.part_bounds = [], []
            i = 0
            while i < len(tensors):
                j = i + 1
                while j < len(tensors) and int(tensors[j].ggml_type) == int(tensors[i].ggml_type):
                    j += 1
                lin = quant.Linear.concat(tensors[i:j], biases=biases[i:j]) if j > i + 1 else None
                if lin is None:
                    j = i + 1
                    lin = quant.Linear(tensors[i], bias=biases[i])
                self.parts.append(lin)
                self.part_bounds.append((self.bounds[i][0], self.bounds[j - 1][1]))
                i = j
        self.out_features = sum(self.sizes)

    def into(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """All parts side by side in y (n, out_features), C-contiguous float32 x and y: one
        matmul when fused, else each part into its columns (straight into them for a
        single row, where a column range is contiguous)."""
        if self.fused is not None:
            return matmul_into(self.fused, x, y)
        n = x.shape[0]
        for (a, b), part in zip(self.part_bounds, self.parts):
            if n == 1:
                matmul_into(part, x, y[:, a:b])
            else:
                y[:, a:b] = matmul_into(part, x, scratch("fused.part", n, b - a))
        return y

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        if self.fused is not None:
            y = self.fused(x)
            if len(self.sizes) == 1:
                return [y]
            return [y[:, a:b] for a, b in self.bounds]
        out = []
        for p in self.parts:
            y = p(x)
            out.extend([y] if len(p.parts) == 1 else p.split(y))
        return out


class Embedding:
    def __init__(self, tensor: Tensor, scale: float = 1.0):
        self.tensor = tensor
        self.scale = scale
        self.n_vocab, self.dim = tensor.shape
        # the kernel and the rows' bytes, found once: a decode step looks up one row
        self._kernel = quant.kernel_for(tensor.ggml_type)
        self._rows = quant._c_uint8(tensor.raw()).reshape(self.n_vocab, -1) if self._kernel is not None else None

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        if self._kernel is not None:  # the kernel checks the ids' range (IndexError)
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            x = np.empty((ids.shape[0], self.dim), dtype=np.float32)
            self._kernel.get_rows(self._rows, int(self.tensor.ggml_type), ids, x, get_num_threads())
        else:
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
        self.qkv = self._projection(wq, wk, wv, biases)
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

    def _projection(self, wq: Tensor, wk: Tensor, wv: Tensor, biases) -> FusedLinear:
        """The fused input projection (a subclass may add outputs after q, k, v)."""
        return FusedLinear([wq, wk, wv], biases)

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

    def _fused_ok(self, x: np.ndarray) -> bool:
        return (_FUSED_QKV and x.dtype == np.float32 and x.ndim == 2
                and x.flags.c_contiguous and self.qkv.in_features == x.shape[1]
                and (self.q_norm is None or self.q_norm.weight is not None)
                and (self.k_norm is None or self.k_norm.weight is not None))

    def _pool_views(self, pool):
        """Byte views of this layer's K/V pools (rebuilt when the pool has grown)."""
        kp, vp = pool.k[self.layer_idx], pool.v[self.layer_idx]
        c = getattr(self, "_pv_cache", None)
        if c is None or c[0] is not kp or c[1] is not vp:
            kt = pool.kv_type
            c = (kp, vp, nn._pool_bytes(kp), nn._pool_bytes(vp), nn._KV_CODE[kt], nn.pool_block_size(kp),
                 nn.kv_row_bytes(kt, self.head_dim), nn.kv_row_bytes(kt, self.head_dim_v), nn.pool_tiled(kp))
            self._pv_cache = c
        return c

    def _fused(self, x: np.ndarray, fb: ForwardBatch, pool, out: np.ndarray | None) -> np.ndarray:
        """q/k/v matmul (one, or one per weight type into the same rows), then one kernel for
        norms + rope + KV store, one attention call, output projection; activations in
        scratch."""
        qkv = self.qkv.into(x, scratch("attn.qkv", x.shape[0], self.qkv.out_features))
        o = self._attend(qkv, fb, pool)
        y = out if out is not None else np.empty((x.shape[0], self.wo.out_features), dtype=np.float32)
        return matmul_into(self.wo, o, y)

    def _attend(self, qkv: np.ndarray, fb: ForwardBatch, pool) -> np.ndarray:
        """From the projected rows qkv (n, H*D + KVH*D + KVH*Dv; last axis contiguous): q/k
        norms, rope and the KV store in one kernel, then one attention call. Returns the
        attention output (n, H*Dv) in scratch."""
        n = qkv.shape[0]
        H, D, Dv = self.n_head, self.head_dim, self.head_dim_v
        q = scratch("attn.q", n, H * D).reshape(n, H, D)
        _, _, kb, vb, code, bs, krow, vrow, k_tiled = self._pool_views(pool)
        tables = fb.tables_for(self.group)
        nt = get_num_threads()
        cs = None
        if self.rope_dim and n >= ROPE_TABLE_MIN_ROWS:
            key = (self.rope_dim, self.rope_base, self.rope_freq_scale)
            cs = fb.rope_tables.get(key)
            if cs is None:
                cs = fb.rope_tables[key] = np.empty((n, self.rope_dim), dtype=np.float32)
                _rope.cos_sin_table(fb.positions, self.rope_dim, self.rope_base, self.rope_freq_scale, cs, nt)
        bad = _attention.qkv_post(qkv, q, kb, vb, code, bs, self.n_head_kv, krow, vrow, Dv, tables, fb.seg_start,
                                   fb.positions, self.rope_dim, self.rope_base, self.rope_neox, self.rope_freq_scale,
                                   None if self.q_norm is None else self.q_norm.weight,
                                   None if self.k_norm is None else self.k_norm.weight,
                                   self.q_norm.eps if self.q_norm is not None else
                                   (self.k_norm.eps if self.k_norm is not None else 0.0), nt, cs, k_tiled)
        if bad:
            raise ValueError(f"kv_store: {bad} positions map to no block (block table too short or id < 0)")
        o = scratch("attn.o", n, H * Dv)
        _attention.attention(q, kb, vb, code, bs, self.n_head_kv, krow, vrow, Dv, tables, fb.seg_start, fb.positions,
                              self.scale, self.window, self.softcap, self.sinks, o.reshape(n, H, Dv), nt,
                              fb.decode_seqs, k_tiled)
        return o

    def __call__(self, x: np.ndarray, fb: ForwardBatch, pool=None, out: np.ndarray | None = None) -> np.ndarray:
        """Attention output projection (n, n_embd); written into `out` when given."""
        pool = self.pool if pool is None else pool
        if self._fused_ok(x) and (self.q_norm is None or self.k_norm is None
                                  or self.q_norm.eps == self.k_norm.eps):
            return self._fused(x, fb, pool, out)
        q, k, v = self.project(x, fb)
        kp, vp = pool.k[self.layer_idx], pool.v[self.layer_idx]
        kv_type = pool.kv_type
        g = self.group
        pos = fb.positions
        ss = fb.seg_start
        tables = fb.tables_for(g)
        nn.kv_store(kp, kv_type, tables, pos, k, seg_start=ss)
        nn.kv_store(vp, kv_type, tables, pos, v, seg_start=ss)
        o = nn.attention(q, kp, vp, kv_type, fb.tables_for(g), ss, pos, self.scale,
                         window=self.window, softcap=self.softcap, sinks=self.sinks, decode_seqs=fb.decode_seqs)
        return self.wo(o.reshape(x.shape[0], self.n_head * self.head_dim_v), out=out)


class GatedFFN:
    """down(act(gate(x)) * up(x)); act 'silu' (SwiGLU) or 'gelu' (GeGLU)."""

    def __init__(self, gate: Tensor, up: Tensor, down: Tensor, act: str = "silu"):
        self.gate_up = FusedLinear([gate, up])
        self.down = quant.Linear(down)
        self.act = nn.silu_mul if act == "silu" else nn.gelu_mul
        self.act_kind = 0 if act == "silu" else 1
        f = self.gate_up.fused
        self._fast = (_kernels.ENABLED and f is not None
                      and len(self.gate_up.sizes) == 2 and self.gate_up.sizes[0] == self.gate_up.sizes[1])
        # gate/up product and activation in one kernel (no (n, 2F) intermediate) where the
        # weight kernel has one (legacy quants)
        self._glu = (self._fast and f._packed is not None and f.bias is None
                     and hasattr(f._kernel, "matmul_glu"))

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(n, n_embd) output; written into `out` when given."""
        if self._fast and x.dtype == np.float32 and x.ndim == 2 and x.flags.c_contiguous:
            n, F = x.shape[0], self.gate_up.sizes[0]
            a = scratch("ffn.act", n, F)
            if self._glu and n > SCRATCH_MAX_ROWS:  # prefill
                f = self.gate_up.fused
                f._kernel.matmul_glu(f._packed, x, a, self.act_kind, quant._threads_for(n, f.nbytes))
            else:
                gu = matmul_into(self.gate_up.fused, x, scratch("ffn.gu", n, 2 * F))
                _activations.act_rows(self.act_kind, gu[:, :F], gu[:, F:], a, get_num_threads())
            y = out if out is not None else np.empty((n, self.down.out_features), dtype=np.float32)
            return matmul_into(self.down, a, y)
        g, u = self.gate_up(x)
        return self.down(self.act(g, u), out=out)


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
