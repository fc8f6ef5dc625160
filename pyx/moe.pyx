# cython: language_level=3
"""Mixture-of-experts kernels (llmcore/models/moe.py owns the contract): the softmax
router's expert choice, and the weighted sum of each token's expert outputs read straight
from the expert-sorted rows.

    route_softmax_topk(logits, k, norm, ids, w, n_threads)
    combine(y, row_of, w, out, n_threads)

route_softmax_topk, per token (row):

- ``logits`` float32 (n, E): router logits
- ``ids`` int32 (n, k), OUT: the k most probable experts, most probable first (the lower
  expert id first on a tie)
- ``w`` float32 (n, k), OUT: their probabilities, divided by their sum when ``norm``

The probabilities are ggml_soft_max's (ggml's vector exp, the sum in double, times 1/sum),
the renormalising sum is ggml_sum_rows' (in double): llama.cpp's values, so a near-tie falls
the same way. Each row is one thread's, in a fixed order: results do not depend on the batch
or the thread count.

combine:

- ``y``      float32 (n*k, d): expert outputs, rows sorted by expert
- ``row_of`` int64 (n*k,): row of y holding pair p = token * k + slot
- ``w``      float32 (n*k,): routing weight of pair p
- ``out``    float32 (n, d), OUT: out[t] = sum over slots j (in order) of w[t*k+j] * y[row_of[t*k+j]]

One pass over y instead of scaling, scattering and summing it (three passes over n*k rows).
Each token's sum has a fixed order: results do not depend on the thread count or the batch.
"""
from cython.parallel cimport parallel, prange
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc
cimport cython

from simd cimport simd_max

cdef extern from "simd_activations.h" nogil:
    double act_exp_sub_sum(const float *x, float *y, float m, int n)

cdef enum:
    MIN_PARALLEL_ROWS = 64  # fewer tokens run on one thread


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline void _combine_row(const float *y, int64_t d, const int64_t *rows, const float *w, int k,
                              float *o) noexcept nogil:
    cdef int64_t i
    cdef int j
    cdef const float *r = y + rows[0] * d
    cdef float wj = w[0]
    for i in range(d):
        o[i] = wj * r[i]
    for j in range(1, k):
        r = y + rows[j] * d
        wj = w[j]
        for i in range(d):
            o[i] = o[i] + wj * r[i]


@cython.boundscheck(False)
@cython.wraparound(False)
def combine(const float[:, ::1] y, const int64_t[::1] row_of, const float[::1] w, float[:, ::1] out,
            int n_threads=1):
    cdef int64_t n = out.shape[0], d = out.shape[1], t
    if n == 0:
        return
    if row_of.shape[0] % n or w.shape[0] != row_of.shape[0] or y.shape[1] != d or y.shape[0] != row_of.shape[0]:
        raise ValueError("moe.combine: y (n*k, d), row_of (n*k,), w (n*k,), out (n, d)")
    cdef int k = <int>(row_of.shape[0] // n)
    cdef int64_t i, m = y.shape[0]
    for i in range(row_of.shape[0]):
        if row_of[i] < 0 or row_of[i] >= m:
            raise IndexError("moe.combine: row out of range")
    cdef int nt = n_threads if n >= MIN_PARALLEL_ROWS and n_threads > 1 else 1
    cdef const float *yp = &y[0, 0]
    cdef const int64_t *rp = &row_of[0]
    cdef const float *wp = &w[0]
    cdef float *op = &out[0, 0]
    with nogil:
        for t in prange(n, num_threads=nt, schedule="static"):
            _combine_row(yp, d, rp + t * k, wp + t * k, k, op + t * d)


cdef enum:
    MIN_PARALLEL_ROUTE = 32  # fewer tokens are routed on one thread


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _route_row(const float *lg, int E, int k, bint norm, float *p, int32_t *ids, float *w) noexcept nogil:
    cdef int j, e, best
    cdef float inv = <float>(1.0 / act_exp_sub_sum(lg, p, simd_max(lg, E), E))
    cdef double s = 0.0
    for e in range(E):
        p[e] = p[e] * inv
    for j in range(k):
        best = 0
        for e in range(1, E):
            if p[e] > p[best]:
                best = e
        ids[j] = best
        w[j] = p[best]
        s += <double>p[best]
        p[best] = -1.0  # taken (probabilities are >= 0)
    if norm:
        for j in range(k):
            w[j] = w[j] / <float>s


@cython.boundscheck(False)
@cython.wraparound(False)
def route_softmax_topk(const float[:, ::1] logits, int k, bint norm, int32_t[:, ::1] ids, float[:, ::1] w,
                       int n_threads=1):
    """Softmax router: the top-k experts of each token and their weights (module docstring).

    logits : float32 (n, E); ids : int32 (n, k), OUT; w : float32 (n, k), OUT
    norm : divide the k weights by their sum; n_threads : OpenMP threads over tokens
    """
    cdef Py_ssize_t n = logits.shape[0], i
    cdef int E = <int>logits.shape[1]
    if ids.shape[0] != n or w.shape[0] != n or ids.shape[1] != k or w.shape[1] != k:
        raise ValueError("moe.route_softmax_topk: logits (n, E), ids and w (n, k)")
    if not 1 <= k <= E:
        raise ValueError(f"moe.route_softmax_topk: k = {k} not in [1, {E}]")
    if n == 0:
        return
    cdef int nt = n_threads if n >= MIN_PARALLEL_ROUTE and n_threads > 1 else 1
    cdef float *p
    with nogil, parallel(num_threads=nt):
        p = <float *>malloc(E * sizeof(float))
        for i in prange(n, schedule="static"):
            _route_row(&logits[i, 0], E, k, norm, p, &ids[i, 0], &w[i, 0])
        free(p)
