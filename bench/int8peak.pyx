# cython: language_level=3
"""Int8 multiply-add probe (the bound for compute-bound batched decode and prefill), for
bench/batched_decode.py: the peer of a step's weight multiply-adds, as bench/membw.pyx is the
peer of a memory-bound step's bytes.

Each thread runs twelve independent chains of 512-bit VNNI byte dot products (vpdpbusd, 64
multiply-adds each) on registers alone: no loads, so it is the core's integer dot-product
issue rate. Builds without AVX-512 VNNI fall back to AVX2's vpmaddubsw + vpmaddwd (two
instructions for 32 multiply-adds). Built on first use by pyximport (int8peak.pyxbld); not
part of the package.
"""
from cython.parallel cimport prange
from libc.stdint cimport int64_t

cdef extern from *:
    """
    #include <immintrin.h>
    #include <stdint.h>
    /* multiply-adds done by n iterations */
    static int64_t int8peak_run(int64_t n) {
    #if defined(__AVX512VNNI__) && defined(__AVX512F__)
        __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
        __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
        __m512i c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
        for (int64_t i = 0; i < n; i++) {
            c0 = _mm512_dpbusd_epi32(c0, a, b); c1 = _mm512_dpbusd_epi32(c1, a, b);
            c2 = _mm512_dpbusd_epi32(c2, a, b); c3 = _mm512_dpbusd_epi32(c3, a, b);
            c4 = _mm512_dpbusd_epi32(c4, a, b); c5 = _mm512_dpbusd_epi32(c5, a, b);
            c6 = _mm512_dpbusd_epi32(c6, a, b); c7 = _mm512_dpbusd_epi32(c7, a, b);
            c8 = _mm512_dpbusd_epi32(c8, a, b); c9 = _mm512_dpbusd_epi32(c9, a, b);
            c10 = _mm512_dpbusd_epi32(c10, a, b); c11 = _mm512_dpbusd_epi32(c11, a, b);
            /* keeps the chains (the compiler would fold them otherwise) */
            __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5),
                             "+v"(c6), "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
        }
        return n * 12 * 64;
    #elif defined(__AVX2__)
        /* one input a chain: with a shared one, gcc computes maddubs(a, b) once an iteration
         * for all six chains (the probe then counted six times the work it did) */
        __m256i b = _mm256_set1_epi8(2), one = _mm256_set1_epi16(1);
        __m256i a0 = _mm256_set1_epi8(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
        for (int64_t i = 0; i < n; i++) {
            c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(_mm256_maddubs_epi16(a0, b), one));
            c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(_mm256_maddubs_epi16(a1, b), one));
            c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(_mm256_maddubs_epi16(a2, b), one));
            c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(_mm256_maddubs_epi16(a3, b), one));
            c4 = _mm256_add_epi32(c4, _mm256_madd_epi16(_mm256_maddubs_epi16(a4, b), one));
            c5 = _mm256_add_epi32(c5, _mm256_madd_epi16(_mm256_maddubs_epi16(a5, b), one));
            __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5),
                             "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
        }
        return n * 6 * 32;
    #else
        volatile int32_t acc = 0;
        for (int64_t i = 0; i < n; i++) acc += (int32_t)(i & 127) * 3;
        return n;
    #endif
    }
    """
    int64_t int8peak_run(int64_t n) nogil


def int8_macs(int64_t iters, int n_threads=1):
    """Multiply-adds of `iters` probe iterations on each of `n_threads` OpenMP threads."""
    cdef int64_t total = 0
    cdef int t
    for t in prange(n_threads, nogil=True, num_threads=n_threads, schedule="static"):
        total += int8peak_run(iters)
    return total
