"""Gated DeltaNet: the linear-attention mixer of the Qwen3.5 / Qwen3.6 / Qwen3-Next hybrids.

On the normed input h, with n_qk q/k heads and n_v value heads of dim D (``ssm.state_size``):

    qkv, z = attn_qkv(h), attn_gate(h)     qkv channels [q (n_qk*D) | k (n_qk*D) | v (n_v*D)]
    beta, alpha = ssm_beta(h), ssm_alpha(h)                              (n_v each)
    xc = silu(conv1d_causal(qkv; ssm_conv1d, K = ssm.conv_kernel, no bias))
    q, k = l2norm(q), l2norm(k) per head (eps = rms eps);  q /= sqrt(D)
    g = exp(ssm_a * softplus(alpha + ssm_dt.bias))   (ssm_a stores -exp(A_log));  b = sigmoid(beta)
    per value head h on q/k head head_map[h], state M_h (D x D, f32):
        M_h <- g M_h;   d = b (v_h - M_h k);   M_h <- M_h + d k^T;   o_h = M_h q
    y = ssm_out(rms_norm(o_h) * ssm_norm * silu(z_h))          (ssm_norm: one D-vector, as stored)

``head_map`` is how the file lays the value heads out: tiled (h % n_qk) in qwen35* files,
grouped (h // (n_v / n_qk)) in qwen3next files; z, beta, alpha, ssm_a, ssm_dt and ssm_out's
columns are in value-head order either way.

State per sequence: conv (K-1, C) and M (n_v, D, D) per layer, in the "rec" cache group
(:class:`~llmcore.cache.recurrent.RecurrentState`), overwritten at every token: it cannot be
trimmed back, context checkpoints snapshot it. Everything between the projections (conv,
norms, gates, the recurrence of every sequence of the step, the gated norm) is one kernel
call: ``llmcore._kernels.deltanet.gated_delta_net`` (pyx/deltanet.pyx), token by token for
decode and short segments, in the chunked form for prefill chunks (64 positions, at fixed
multiples of 64 of the sequence's positions).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _kernels, quant
from ..errors import ModelLoadError
from ..gguf_file import Tensor
from ..threads import get_num_threads
from .batch import ForwardBatch
from .layers import FusedLinear, matmul_into, scratch

# no NumPy runtime path for this layer (the NumPy version is the tests' reference): with
# LLMCORE_NO_KERNELS=1 these models do not load
_dn = _kernels.load("deltanet") if _kernels.ENABLED else None

# below this many state values touched per call (tokens x n_v x D x D) the kernel runs on
# one thread: a parallel region's wake-up costs more than the work
_MIN_PARALLEL_WORK = 1 << 17


def require_kernel() -> None:
    if _dn is None:
        raise ModelLoadError("gated DeltaNet layers need the compiled kernels (LLMCORE_NO_KERNELS=1 "
                             "turns them off)")


@dataclass
class DeltaNetWeights:
    """One layer's tensors in the canonical layout (see the module docstring); an
    architecture that stores them otherwise converts to this at load time."""

    qkv: Tensor  # (2*n_qk*D + n_v*D, n_embd)
    z: Tensor  # (n_v*D, n_embd)
    beta: Tensor  # (n_v, n_embd)
    alpha: Tensor  # (n_v, n_embd)
    conv: np.ndarray  # (C, K) float32, ssm_conv1d.weight as stored
    dt_bias: np.ndarray  # (n_v,)
    ssm_a: np.ndarray  # (n_v,) = -exp(A_log)
    norm: np.ndarray  # (D,)
    out: Tensor  # (n_embd, n_v*D)


def state_shapes(n_qk: int, n_v: int, head_dim: int, conv_kernel: int) -> tuple[tuple, tuple]:
    """(conv state, recurrent state) shapes of one layer of one sequence."""
    return (conv_kernel - 1, 2 * n_qk * head_dim + n_v * head_dim), (n_v, head_dim, head_dim)


class GatedDeltaNet:
    """The mixer (see the module docstring); its state is layer ``rec_idx`` of the
    sequence's "rec" cache."""

    def __init__(self, w: DeltaNetWeights, *, n_qk: int, n_v: int, head_dim: int, head_map,
                 eps: float, rec_idx: int, group: str = "rec"):
        require_kernel()
        self.n_qk, self.n_v, self.head_dim = n_qk, n_v, head_dim
        self.rec_idx, self.group, self.eps = rec_idx, group, float(eps)
        D = head_dim
        self.n_channels = 2 * n_qk * D + n_v * D
        if w.qkv.shape[0] != self.n_channels or w.z.shape[0] != n_v * D:
            raise ModelLoadError(f"{w.qkv.name}: {w.qkv.shape[0]} rows, expected {self.n_channels} "
                                 f"({n_qk} q/k heads and {n_v} value heads of {D})")
        self.in_proj = FusedLinear([w.qkv, w.z])  # [qkv | z]
        self.gates = FusedLinear([w.beta, w.alpha])  # [beta | alpha]
        conv = np.asarray(w.conv, np.float32).reshape(self.n_channels, -1)
        self.conv_kernel = conv.shape[1]
        self.conv_w = np.ascontiguousarray(conv.T)  # (K, C): the kernel's layout
        self.dt_bias = np.ascontiguousarray(w.dt_bias, np.float32).reshape(n_v)
        self.ssm_a = np.ascontiguousarray(w.ssm_a, np.float32).reshape(n_v)
        self.norm = np.ascontiguousarray(w.norm, np.float32).reshape(D)
        self.head_map = np.ascontiguousarray(head_map, np.int32).reshape(n_v)
        if self.head_map.min() < 0 or self.head_map.max() >= n_qk:
            raise ModelLoadError("gated DeltaNet: value head mapped to no q/k head")
        self.out = quant.Linear(w.out)

    def state_shapes(self) -> tuple[tuple, tuple]:
        return state_shapes(self.n_qk, self.n_v, self.head_dim, self.conv_kernel)

    @staticmethod
    def _run(lin: FusedLinear, x: np.ndarray, tag: str) -> list[np.ndarray]:
        y = lin.into(x, scratch(tag, x.shape[0], lin.out_features))
        return [y[:, a:b] for a, b in lin.bounds]

    def __call__(self, h: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        h = np.ascontiguousarray(h, dtype=np.float32)
        n = h.shape[0]
        qkv, z = self._run(self.in_proj, h, "dnet.in")
        beta, alpha = self._run(self.gates, h, "dnet.gates")
        convs, ssms = [], []
        for s in fb.seqs:
            c, m = s.caches[self.group].layer(self.rec_idx)
            convs.append(c)
            ssms.append(m)
        o = scratch("dnet.o", n, self.n_v * self.head_dim)
        work = n * self.n_v * self.head_dim * self.head_dim
        nt = get_num_threads() if work >= _MIN_PARALLEL_WORK else 1
        # positions fix where the kernel's prefill chunks start (multiples of 64 of each
        # sequence's positions), so a prompt cut there gives the bits of one call
        _dn.gated_delta_net(qkv, z, beta, alpha, self.dt_bias, self.ssm_a, self.conv_w, self.norm,
                            self.head_map, convs, ssms, fb.seg_start, self.eps, o, nt,
                            seg_pos=np.asarray(fb.starts, dtype=np.int32))
        y = np.empty((n, self.out.out_features), dtype=np.float32)
        return matmul_into(self.out, o, y)


__all__ = ["DeltaNetWeights", "GatedDeltaNet", "require_kernel", "state_shapes"]
