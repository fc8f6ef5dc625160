# cython: freethreading_compatible=True
"""RMS norm (ggml_rms_norm + ggml_mul), optionally fused with the residual add.

Called through llmcore/nn.py, which owns the API contract and the thread count; the
per-row function is in norms.pxd (shared with attention.pyx).
"""
from cython.parallel cimport prange

from norms cimport rms_row


def rms_norm(float[:, :] x, const float[::1] weight, float eps, float[:, :] out,
             const float[:, :] add=None, int n_threads=1):
    """out = x / sqrt(mean(x^2) + eps) * weight, row by row.

    x : float32 (rows, d), last axis contiguous; updated in place (x += add) when add is given
    weight : float32 (d,) or None
    out : float32 (rows, d), last axis contiguous; may be x itself
    add : float32 (rows, d), last axis contiguous, or None: residual added to x first
    n_threads : OpenMP threads (small inputs run on one)
    """
    cdef Py_ssize_t n = x.shape[0], i
    cdef int d = <int>x.shape[1]
    if n == 0:
        return
    cdef const float *w = &weight[0] if weight is not None else NULL
    cdef bint has_add = add is not None
    cdef float *xp = &x[0, 0]
    cdef float *op = &out[0, 0]
    if x.strides[1] != 4 or out.strides[1] != 4 or (has_add and add.strides[1] != 4):
        raise ValueError("rms_norm: the last axis must be contiguous")
    cdef const float *ap = &add[0, 0] if has_add else NULL
    cdef Py_ssize_t xs = x.strides[0] // 4, os = out.strides[0] // 4
    cdef Py_ssize_t as_ = add.strides[0] // 4 if has_add else 0
    if n_threads < 1 or n * d < 32768:
        n_threads = 1
    with nogil:
        for i in prange(n, num_threads=n_threads, schedule='static'):
            rms_row(xp + i * xs, ap + i * as_ if has_add else NULL, w, eps, op + i * os, d)


def rms_norm_post_add(float[:, :] x, float[:, :] y, const float[::1] y_weight, float y_eps,
                      const float[::1] weight, float eps, float[:, :] out, int n_threads=1):
    """A sublayer's post-norm, the residual add and the next pre-norm in one pass, row by row:
    y = rms_norm(y) * y_weight (in place); x += y; out = rms_norm(x) * weight. The same
    arithmetic as rms_norm(y, y_weight, out=y) then rms_norm(x, weight, out, add=y).

    x, y, out : float32 (rows, d), last axis contiguous; x and y updated in place
    y_weight, weight : float32 (d,) or None
    n_threads : OpenMP threads (small inputs run on one)
    """
    cdef Py_ssize_t n = x.shape[0], i
    cdef int d = <int>x.shape[1]
    if y.shape[0] != n or y.shape[1] != d or out.shape[0] != n or out.shape[1] != d:
        raise ValueError("rms_norm_post_add: x, y and out must have the same shape")
    if n == 0:
        return
    if x.strides[1] != 4 or y.strides[1] != 4 or out.strides[1] != 4:
        raise ValueError("rms_norm_post_add: the last axis must be contiguous")
    cdef const float *wy = &y_weight[0] if y_weight is not None else NULL
    cdef const float *w = &weight[0] if weight is not None else NULL
    cdef float *xp = &x[0, 0]
    cdef float *yp = &y[0, 0]
    cdef float *op = &out[0, 0]
    cdef Py_ssize_t xs = x.strides[0] // 4, ys = y.strides[0] // 4, os = out.strides[0] // 4
    if n_threads < 1 or n * d < 32768:
        n_threads = 1
    with nogil:
        for i in prange(n, num_threads=n_threads, schedule='static'):
            rms_row(yp + i * ys, NULL, wy, y_eps, yp + i * ys, d)
            rms_row(xp + i * xs, yp + i * ys, w, eps, op + i * os, d)
