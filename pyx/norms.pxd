# Row functions of norms.pyx, inlined into every module that cimports them (attention.pyx
# normalises q and k heads with the same arithmetic as rms_norm).
from libc.math cimport sqrtf

from simd cimport simd_sumsq


cdef inline void rms_row(float *x, const float *add, const float *w, float eps,
                         float *y, int d) noexcept nogil:
    """y = x / sqrt(mean(x^2) + eps) * w over one row of d values (x += add first when add
    is not NULL; w may be NULL; y may be x). Sum of squares in double, as ggml."""
    cdef int j
    if add != NULL:
        for j in range(d):
            x[j] = x[j] + add[j]
    cdef float mean = <float>(simd_sumsq(x, d) / d)
    cdef float sc = 1.0 / sqrtf(mean + eps)
    if w != NULL:
        for j in range(d):
            y[j] = x[j] * sc * w[j]
    else:
        for j in range(d):
            y[j] = x[j] * sc
