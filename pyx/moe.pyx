# cython: language_level=3
"""Mixture-of-experts row moves: the weighted sum of each token's expert outputs, read
straight from the expert-sorted rows (llmcore/models/moe.py owns the contract).

    combine(y, row_of, w, out, n_threads)

- ``y``      float32 (n*k, d): expert outputs, rows sorted by expert
- ``row_of`` int64 (n*k,): row of y holding pair p = token * k + slot
- ``w``      float32 (n*k,): routing weight of pair p
- ``out``    float32 (n, d), OUT: out[t] = sum over slots j (in order) of w[t*k+j] * y[row_of[t*k+j]]

One pass over y instead of scaling, scattering and summing it (three passes over n*k rows).
Each token's sum has a fixed order: results do not depend on the thread count or the batch.
"""
from cython.parallel cimport prange
from libc.stdint cimport int64_t
cimport cython

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
