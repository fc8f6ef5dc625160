# Cython declarations of the shared SIMD helpers (simd.h) that kernel modules call.
from libc.stdint cimport uint16_t

cdef extern from "simd.h" nogil:
    int SIMD_AVX512_VNNI
    void *simd_alloc(size_t n)
    void simd_f16_to_f32_row(const uint16_t *x, float *y, int n)
    void simd_f32_to_f16_row(const float *x, uint16_t *y, int n)
    void simd_f16_round_row(const float *x, float *y, int n)
    double simd_sumsq(const float *x, int n)
    float simd_max(const float *x, int n)
    float simd_dot(const float *a, const float *b, int n)
