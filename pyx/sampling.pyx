# cython: language_level=3
"""Sampling kernels: the k largest logits of a row (top-k), for llmcore/sampling.py.

NumPy's argpartition over a 50k-262k vocabulary costs more than the rest of a sampling
step (it negates and copies the row, then selects in several passes): a single pass with
a k-entry min-heap touches each logit once and almost never branches after the first few
thousand.
"""
from libc.math cimport isnan
from libc.stdint cimport int64_t


cdef inline bint _less(float va, int64_t ia, float vb, int64_t ib) noexcept nogil:
    """(va, ia) ranks below (vb, ib): a smaller value, or the same value at a later index."""
    return va < vb or (va == vb and ia > ib)


cdef void _sift_down(float *v, int64_t *ix, int64_t n, int64_t i) noexcept nogil:
    cdef int64_t c, m
    cdef float tv
    cdef int64_t ti
    while True:
        c = 2 * i + 1
        if c >= n:
            return
        m = c
        if c + 1 < n and _less(v[c + 1], ix[c + 1], v[c], ix[c]):
            m = c + 1
        if not _less(v[m], ix[m], v[i], ix[i]):
            return
        tv, v[i], v[m] = v[i], v[m], v[i]
        ti, ix[i], ix[m] = ix[i], ix[m], ix[i]
        i = m


def top_k(const float[::1] x, float[::1] vals, int64_t[::1] ids):
    """The k = len(ids) largest values of x, largest first (equal values: lower index
    first); NaN counts as smaller than everything. Returns how many were found (k, or
    len(x) when that is smaller).

    x : float32 (n,); vals : float32 (k,) and ids : int64 (k,), written
    """
    cdef int64_t n = x.shape[0], k = ids.shape[0], i, m = 0, j
    cdef float v
    if vals.shape[0] != k:
        raise ValueError("top_k: vals and ids must have the same length")
    if k > n:
        k = n
    if k == 0:
        return 0
    cdef float *hv = &vals[0]
    cdef int64_t *hi = &ids[0]
    with nogil:
        # a min-heap (by rank) of the best k so far: its root is the one to beat
        for i in range(n):
            v = x[i]
            if isnan(v):
                continue
            if m < k:
                hv[m] = v
                hi[m] = i
                m += 1
                if m == k:
                    for j in range(k // 2 - 1, -1, -1):
                        _sift_down(hv, hi, k, j)
            elif v > hv[0]:  # a later equal value never displaces an earlier one
                hv[0] = v
                hi[0] = i
                _sift_down(hv, hi, k, 0)
        if m < k:  # fewer than k non-NaN values
            for j in range(m // 2 - 1, -1, -1):
                _sift_down(hv, hi, m, j)
        # pop the heap: the smallest to the back, so the array ends largest first
        j = m
        while j > 1:
            j -= 1
            v, hv[0], hv[j] = hv[0], hv[j], hv[0]
            i, hi[0], hi[j] = hi[0], hi[j], hi[0]
            _sift_down(hv, hi, j, 0)
    return m
