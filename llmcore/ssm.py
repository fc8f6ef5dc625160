"""Recurrent-layer ops: short causal conv with a rolling state, Mamba-1 and Mamba-2 scans.

CONTRACT (models rely on exactly this API):

Every op runs a batch of ``n`` consecutive tokens of ONE sequence and updates that
sequence's state array in place, so calling it on tokens split 5 + 7 + 1 gives the same
outputs and final state as one call on all 13 (the model calls it per sequence; a fresh
sequence starts from zeros; a checkpoint is a copy of the state arrays). All arrays are
float32; 2-D inputs may be row-strided views (e.g. slices of a fused projection output)
as long as their last axis is contiguous; states must be C-contiguous float32.
``n_threads <= 0`` means llmcore.threads.get_num_threads(). Results do not depend on the
thread count (each output is computed by one thread, in a fixed order). The GIL is
released while the kernels run.

- ``conv1d(x, state, weight, bias=None, *, silu=False, out=None, n_threads=0) -> out``
  Depthwise causal conv (ggml_ssm_conv). x (n, C); state (K-1, C) holds the previous K-1
  inputs, oldest first; weight (C, K) (GGUF ``ssm_conv1d.weight`` / ``shortconv.conv.weight``
  as loaded, ne = [K, C]); bias (C,) or None.
  ``out[t, c] = bias[c] + sum_k xx[t + k, c] * weight[c, k]`` with ``xx = state ++ x``
  (so ``weight[:, K-1]`` multiplies the current token), then silu if ``silu``.
  Afterwards ``state`` = the last K-1 rows of ``state ++ x``.
  Mamba/Mamba-2: bias + silu; LFM2 short conv: no bias, no activation.

- ``mamba_scan(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, out=None,
  n_threads=0) -> out (n, d_inner)``  Mamba-1 selective scan (ggml_ssm_scan).
  state (d_inner, d_state); x, dt (n, d_inner); A (d_inner, d_state) (GGUF ``ssm_a``,
  which already holds -exp(A_log)); B, C (n, d_state). Per token t, channel i:
  ``d = softplus(dt[t,i] + dt_bias[i])`` (softplus(v) = v if v > 20 else log1p(exp(v)));
  ``state[i,:] = state[i,:] * exp(d * A[i,:]) + B[t,:] * (x[t,i] * d)``;
  ``y = state[i,:] . C[t,:]``; then ``y += x[t,i] * D[i]`` and ``y *= silu(z[t,i])`` when
  given.

- ``mamba2_scan(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, out=None,
  n_threads=0) -> out`` (shape of x)  Mamba-2 SSD scan, scalar A per head.
  state (n_head, head_dim, d_state); x (n, n_head, head_dim) or (n, n_head*head_dim);
  dt (n, n_head); A (n_head,) (GGUF ``ssm_a``, ne [1, n_head]); B, C (n, n_group, d_state)
  or (n, n_group*d_state); D (n_head,); z like x; dt_bias (n_head,). Head h uses group
  ``g = h // (n_head // n_group)``. Per token t, head h, row p:
  ``d = softplus(dt[t,h] + dt_bias[h])``; ``state[h,p,:] = state[h,p,:] * exp(d * A[h])
  + B[t,g,:] * (x[t,h,p] * d)``; ``y = state[h,p,:] . C[t,g,:]``; ``y += x[t,h,p] * D[h]``;
  ``y *= silu(z[t,h,p])``. (Mamba-2's grouped RMS norm comes after, in the model.)

State sizes per layer (for the cache): conv ``(d_conv - 1, channels)`` where channels is
d_inner (mamba), d_inner + 2*n_group*d_state (mamba2) or n_embd (lfm2, d_conv =
l_cache); scan ``(d_inner, d_state)`` (mamba) or ``(n_head, head_dim, d_state)`` (mamba2).
``conv_state_shape`` / ``mamba_state_shape`` / ``mamba2_state_shape`` compute them.

The Cython kernels live in pyx/ssm.pyx (llmcore._kernels.ssm); with LLMCORE_NO_KERNELS=1
the same ops run in NumPy.
"""
from __future__ import annotations

import numpy as np

from . import _kernels
from .threads import get_num_threads

_k = _kernels.load("ssm") if _kernels.ENABLED else None  # None: the NumPy versions below

__all__ = ["conv1d", "mamba_scan", "mamba2_scan", "conv_state_shape", "mamba_state_shape",
           "mamba2_state_shape", "have_kernels"]


def have_kernels() -> bool:
    return _k is not None


def conv_state_shape(d_conv: int, channels: int) -> tuple[int, int]:
    return (d_conv - 1, channels)


def mamba_state_shape(d_inner: int, d_state: int) -> tuple[int, int]:
    return (d_inner, d_state)


def mamba2_state_shape(n_head: int, head_dim: int, d_state: int) -> tuple[int, int, int]:
    return (n_head, head_dim, d_state)


# ---- argument checks -------------------------------------------------------------------

def _f32_2d(a, name, shape=None):
    a = np.asarray(a, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected 2-D, got shape {a.shape}")
    if a.shape[1] > 1 and a.strides[1] != 4 or a.strides[0] < 0:
        a = np.ascontiguousarray(a)
    if shape is not None and a.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {a.shape}")
    return a


def _f32_1d(a, name, size):
    if a is None:
        return None
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32).reshape(-1))
    if a.shape[0] != size:
        raise ValueError(f"{name}: expected {size} values, got {a.shape[0]}")
    return a


def _state(s, name, shape):
    if not isinstance(s, np.ndarray) or s.dtype != np.float32 or not s.flags.c_contiguous:
        raise ValueError(f"{name}: must be a C-contiguous float32 ndarray (updated in place)")
    if s.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {s.shape}")
    return s


def _out(out, shape):
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if out.dtype != np.float32 or out.shape != tuple(shape) or (out.shape[1] > 1 and out.strides[1] != 4):
        raise ValueError(f"out: expected float32 {tuple(shape)} with a contiguous last axis")
    return out


def _threads(n):
    return n if n and n > 0 else get_num_threads()


# ---- ops -------------------------------------------------------------------------------

def conv1d(x, state, weight, bias=None, *, silu=False, out=None, n_threads=0):
    x = _f32_2d(x, "x")
    n, C = x.shape
    weight = _f32_2d(weight, "weight")
    if weight.shape[0] != C:
        raise ValueError(f"weight: expected ({C}, K), got {weight.shape}")
    K = weight.shape[1]
    _state(state, "state", (K - 1, C))
    bias = _f32_1d(bias, "bias", C)
    out = _out(out, (n, C))
    if np.shares_memory(out, x):
        raise ValueError("out must not alias x")
    if _k is not None:
        _k.conv1d(x, state, weight, bias, out, bool(silu), _threads(n_threads))
        return out
    xx = np.concatenate([state, x], 0)
    y = np.zeros((n, C), dtype=np.float32)
    for k in range(K):
        y += xx[k:k + n] * weight[:, k]
    if bias is not None:
        y += bias
    if silu:
        y = y / (1.0 + np.exp(-y))
    out[:] = y
    state[:] = xx[n:]
    return out


def _softplus(v):
    return np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0)))).astype(np.float32)


def mamba_scan(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, out=None, n_threads=0):
    x = _f32_2d(x, "x")
    n, di = x.shape
    ds = state.shape[1] if isinstance(state, np.ndarray) and state.ndim == 2 else -1
    _state(state, "state", (di, ds))
    dt = _f32_2d(dt, "dt", (n, di))
    A = _f32_2d(A, "A", (di, ds))
    B = _f32_2d(B, "B", (n, ds))
    C = _f32_2d(C, "C", (n, ds))
    D = _f32_1d(D, "D", di)
    dt_bias = _f32_1d(dt_bias, "dt_bias", di)
    if z is not None:
        z = _f32_2d(z, "z", (n, di))
    out = _out(out, (n, di))
    if _k is not None:
        _k.mamba_scan(state, x, dt, A, B, C, D, z, dt_bias, out, _threads(n_threads))
        return out
    for t in range(n):
        d = dt[t] + dt_bias if dt_bias is not None else dt[t]
        d = _softplus(d)
        state[:] = state * np.exp(d[:, None] * A) + B[t][None, :] * (x[t] * d)[:, None]
        y = state @ C[t]
        if D is not None:
            y = y + x[t] * D
        if z is not None:
            y = y * (z[t] / (1.0 + np.exp(-z[t])))
        out[t] = y
    return out


def mamba2_scan(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, out=None, n_threads=0):
    if not isinstance(state, np.ndarray) or state.ndim != 3:
        raise ValueError("state: expected (n_head, head_dim, d_state)")
    nh, hd, ds = state.shape
    _state(state, "state", (nh, hd, ds))
    x_in = np.asarray(x)
    n = x_in.shape[0]
    x = _f32_2d(x_in.reshape(n, nh * hd), "x")
    dt = _f32_2d(dt, "dt", (n, nh))
    A = _f32_1d(A, "A", nh)
    Bq = np.asarray(B)
    ng = Bq.shape[1] if Bq.ndim == 3 else Bq.shape[1] // ds
    if ng < 1 or nh % ng:
        raise ValueError(f"B: n_group {ng} must divide n_head {nh}")
    B = _f32_2d(Bq.reshape(n, ng * ds), "B")
    C = _f32_2d(np.asarray(C).reshape(n, ng * ds), "C")
    D = _f32_1d(D, "D", nh)
    dt_bias = _f32_1d(dt_bias, "dt_bias", nh)
    if z is not None:
        z = _f32_2d(np.asarray(z).reshape(n, nh * hd), "z")
    out2 = _out(None if out is None else out.reshape(n, nh * hd), (n, nh * hd))
    st = state.reshape(nh * hd, ds)
    if _k is not None:
        _k.mamba2_scan(st, x, dt, A, B, C, D, z, dt_bias, out2, nh, ng, _threads(n_threads))
    else:
        g = np.arange(nh) // (nh // ng)
        s3 = state
        for t in range(n):
            d = dt[t] + dt_bias if dt_bias is not None else dt[t]
            d = _softplus(d)
            dA = np.exp(d * A)
            xt = x[t].reshape(nh, hd)
            Bt = B[t].reshape(ng, ds)[g]
            Ct = C[t].reshape(ng, ds)[g]
            s3[:] = s3 * dA[:, None, None] + (xt * d[:, None])[:, :, None] * Bt[:, None, :]
            y = np.einsum("hps,hs->hp", s3, Ct)
            if D is not None:
                y = y + xt * D[:, None]
            if z is not None:
                zt = z[t].reshape(nh, hd)
                y = y * (zt / (1.0 + np.exp(-zt)))
            out2[t] = y.reshape(-1)
    if out is not None:
        return out
    return out2.reshape(x_in.shape)
