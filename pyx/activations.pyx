# cython: freethreading_compatible=True
"""Activations: SiLU and GELU (tanh approximation, as ggml), optionally times a multiplier
(SwiGLU / GeGLU), and softmax over rows. The vector code is in simd_activations.h.

Called through llmcore/nn.py (and the feed-forward fast path of llmcore/models/layers.py),
which own the API contract and the thread count.
"""
from cython.parallel cimport prange

from simd cimport simd_max

cdef extern from "simd_activations.h" nogil:
    double act_exp_sub_sum(const float *x, float *y, float m, int n)
    void act_silu_row(const float *g, const float *u, float *y, int n)
    void act_gelu_row(const float *g, const float *u, float *y, int n)

cdef enum:
    SILU = 0
    GELU = 1
    ACT_CHUNK = 4096  # values per work item of act()


cdef inline void _act_row(int kind, const float *g, const float *u, float *y, int n) noexcept nogil:
    if kind == SILU:
        act_silu_row(g, u, y, n)
    else:
        act_gelu_row(g, u, y, n)


def act(int kind, const float[::1] g, const float[::1] u, float[::1] out, int n_threads=1):
    """out = act(g) (* u).

    kind : 0 SiLU, 1 GELU (tanh approximation)
    g : float32 (n,)
    u : float32 (n,) multiplier, or None
    out : float32 (n,)
    n_threads : OpenMP threads over chunks of ACT_CHUNK values (small inputs run on one)
    """
    cdef Py_ssize_t n = g.shape[0], c, nc, c0, m
    if n == 0:
        return
    cdef const float *gp = &g[0]
    cdef const float *up = &u[0] if u is not None else NULL
    cdef float *op = &out[0]
    nc = (n + ACT_CHUNK - 1) // ACT_CHUNK
    if n_threads < 1 or n < 65536:
        n_threads = 1
    with nogil:
        for c in prange(nc, num_threads=n_threads, schedule='static'):
            c0 = c * ACT_CHUNK
            m = n - c0 if n - c0 < ACT_CHUNK else ACT_CHUNK
            _act_row(kind, gp + c0, up + c0 if up != NULL else NULL, op + c0, <int>m)


def act_rows(int kind, const float[:, :] g, const float[:, :] u, float[:, ::1] out, int n_threads=1):
    """out = act(g) (* u) row by row, reading strided rows in place (no copy of the column
    slices of a fused gate/up matmul output).

    kind : 0 SiLU, 1 GELU (tanh approximation)
    g : float32 (n, d), last axis contiguous
    u : float32 (n, d), last axis contiguous, or None
    out : float32 (n, d)
    n_threads : OpenMP threads over rows (small inputs run on one)
    """
    cdef Py_ssize_t n = g.shape[0], i
    cdef int d = <int>g.shape[1]
    if n == 0 or d == 0:
        return
    if g.strides[1] != 4 or (u is not None and u.strides[1] != 4):
        raise ValueError("act_rows: the last axis must be contiguous")
    cdef const float *gp = &g[0, 0]
    cdef const float *up = &u[0, 0] if u is not None else NULL
    cdef Py_ssize_t gs = g.strides[0] // 4, us = u.strides[0] // 4 if u is not None else 0
    cdef float *op = &out[0, 0]
    if n_threads < 1 or n * d < 65536:
        n_threads = 1
    with nogil:
        for i in prange(n, num_threads=n_threads, schedule='static'):
            _act_row(kind, gp + i * gs, up + i * us if up != NULL else NULL, op + i * d, d)


def softmax_rows(const float[:, ::1] x, float[:, ::1] out, int n_threads=1):
    """out[i] = exp(x[i] - max) / sum, as ggml_soft_max (1/sum in double).

    x : float32 (n, d)
    out : float32 (n, d), may alias x
    n_threads : OpenMP threads over rows (small inputs run on one)
    """
    cdef Py_ssize_t n = x.shape[0], i, j
    cdef int d = <int>x.shape[1]
    cdef float m, s
    if n == 0 or d == 0:
        return
    if n_threads < 1 or n * d < 65536:
        n_threads = 1
    with nogil:
        for i in prange(n, num_threads=n_threads, schedule='static'):
            m = simd_max(&x[i, 0], d)
            s = <float>(1.0 / act_exp_sub_sum(&x[i, 0], &out[i, 0], m, d))  # ggml: 1/sum in double
            for j in range(d):
                out[i, j] = out[i, j] * s
