/* SIMD helpers shared by the kernels in pyx/: the instruction sets this build targets,
 * f16 / bf16 <-> f32 conversion (scalar and rows), horizontal sums in the orders llama.cpp's
 * CPU backend uses, AVX-512 tail masks, ggml's vector exp and row reductions.
 *
 * The AVX-512 paths are taken when the build targets them (-march=native on a CPU that has
 * them); every helper has a portable C fallback (LLMCORE_PORTABLE=1 builds). The portable
 * f16 conversions are ggml's (GGML_FP16_TO_FP32 / GGML_FP32_TO_FP16 without F16C): round to
 * nearest even, bit-identical to F16C and numpy.
 */
#ifndef LLMCORE_SIMD_H
#define LLMCORE_SIMD_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* AVX-512 with the byte/word, vector-length and VNNI extensions: the integer dot kernels of
 * the weight formats (vpdpbusd). Plain AVX-512F paths test __AVX512F__ directly. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SIMD_AVX512_VNNI 1
#else
#define SIMD_AVX512_VNNI 0
#endif

/* ---- f16 / bf16 <-> f32 ------------------------------------------------------------------ */

static inline float simd_h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) { u = s; }
        else { /* subnormal: normalise */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) { m <<= 1; e--; }
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) { u = s | 0x7f800000 | (m << 13); }
    else { u = s | ((e + 127 - 15) << 23) | (m << 13); }
    float f; memcpy(&f, &u, 4); return f;
#endif
}

static inline uint16_t simd_f2h(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, 0);  /* round to nearest even, like numpy and ggml */
#else
    /* round-to-nearest-even conversion (same algorithm as ggml's fp32_to_fp16) */
    const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    uint32_t w; memcpy(&w, &f, 4);
    const uint32_t shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xff000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    uint32_t bb = (bias >> 1) + 0x07800000u; float bf; memcpy(&bf, &bb, 4);
    base = bf + base;
    uint32_t bits; memcpy(&bits, &base, 4);
    const uint32_t exp_bits = (bits >> 13) & 0x00007c00u, mantissa_bits = bits & 0x00000fffu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
#endif
}

/* f32 -> f16 -> f32 (ggml rounds scales and the f32 operand of f16 products this way) */
static inline float simd_f16_round(float f) { return simd_h2f(simd_f2h(f)); }

/* n bytes on a 64-byte boundary (free() releases them): per-thread scratch that vector code
 * reads and writes. malloc's 16-byte alignment splits every other 32-byte access across two
 * cache lines: the AVX2 attention kernels ran 1.06-1.2x slower on such a buffer. */
static inline void *simd_alloc(size_t n) {
    return aligned_alloc(64, (n + 63) & ~(size_t)63);  /* (aligned_alloc takes whole alignments) */
}

#if defined(__AMX_TILE__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
/* Whether the CPU has AMX-TILE and the AMX feature of cpuid leaf 7 EDX bit `bit` (25: INT8,
 * 22: BF16), and Linux grants this process the tile state (ARCH_REQ_XCOMP_PERM, process-wide;
 * every AMX kernel family asks at its module's import) */
static inline int simd_amx_grant(int bit) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!((d >> 24) & 1u) || !((d >> bit) & 1u)) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#endif

static inline float simd_bf2f(uint16_t h) { uint32_t r = (uint32_t)h << 16; float f; memcpy(&f, &r, 4); return f; }

/* unaligned little-endian reads from packed blocks */
static inline uint16_t simd_rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t simd_rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline float simd_load_f16(const uint8_t *p) { return simd_h2f(simd_rd16(p)); }

static inline void simd_f16_to_f32_row(const uint16_t *x, float *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
#elif defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = simd_h2f(x[i]);
}

static inline void simd_f32_to_f16_row(const float *x, uint16_t *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) y[i] = simd_f2h(x[i]);
}

/* y[i] = f32(f16(x[i])) */
static inline void simd_f16_round_row(const float *x, float *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
#endif
    for (; i < n; i++) y[i] = simd_f16_round(x[i]);
}

/* ---- software prefetch ------------------------------------------------------------------
 * Streaming weight kernels prefetch simd_pf_dist bytes ahead of the bytes they read: a decode
 * matvec reads each weight once, and the hardware prefetcher alone leaves a core at about
 * half the read bandwidth the memory gives it. simd_pf_dist is a variable so benchmarks
 * can tune it (simd_set_pf_dist); 0 turns prefetching off. */
static int simd_pf_dist = 2048;
/* the nbytes from p + dist (dist <= 0: nothing); l2: prefetcht1 (into L2) instead of
 * prefetcht0 (a constant at every call) */
static inline __attribute__((always_inline)) void simd_prefetch_at(const void *p, int64_t dist, int64_t nbytes,
                                                                   const int l2) {
#if defined(__GNUC__)
    if (dist <= 0) return;
    const char *c = (const char *)p + dist;
    for (int64_t o = 0; o < nbytes; o += 64) {
        if (l2) __builtin_prefetch(c + o, 0, 2);
        else __builtin_prefetch(c + o, 0, 3);
    }
#else
    (void)p; (void)dist; (void)nbytes; (void)l2;
#endif
}

static inline __attribute__((always_inline)) void simd_prefetch_span(const void *p, int nbytes, const int l2) {
    simd_prefetch_at(p, simd_pf_dist, nbytes, l2);
}

static inline void simd_prefetch_range(const void *p, int nbytes) { simd_prefetch_span(p, nbytes, 0); }

/* the same requests into L2: for the one-token kernels, whose weights stream from memory
 * with little arithmetic to wait behind (on Zen 4 the L1-bound requests waited on its few
 * miss buffers: a decode step's Q4_1 / Q8_0 matmuls 0.77-0.91 of the time into L2; from 4
 * tokens, and in the tile kernels, 7-20% slower with it) */
static inline void simd_prefetch_range_l2(const void *p, int nbytes) { simd_prefetch_span(p, nbytes, 1); }

/* ---- AVX-512 tail masks ------------------------------------------------------------------ */

#if defined(__AVX512F__)
/* the first min(n, 16) lanes */
static inline __mmask16 simd_mask16(int n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}
#endif

/* ---- horizontal sums ----------------------------------------------------------------------- */

#if defined(__AVX2__)
/* sum of 8 int32 lanes */
static inline int32_t simd_hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* lane u: the sum of v[u]'s 8 int32 lanes (8 sums at once, transposed by hadds) */
static inline __m256i simd_hsum8x8_i32(const __m256i *v) {
    const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* 32 int32 lanes (a, b, c, d in order) -> 32 int8 in order, saturating */
static inline __m256i simd_pack_i8x32(__m256i a, __m256i b, __m256i c, __m256i d) {
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d)),
                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

#if defined(__AVX__)
/* sum of 8 float lanes in ggml's hsum_float_8 order: halves, then pairs, then the last two */
static inline float simd_hsum_f32x8(__m256 v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4);
}

/* the largest of 8 float lanes */
static inline float simd_hmax_f32x8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
#endif

#if defined(__AVX512F__)
/* Sums of the 16 lanes of 16 vectors at once, each grouped exactly like GCC's
 * _mm512_reduce_add_ps (lanes i+8, then i+4, i+2, i+1), so a sum equals a reduce_add of the
 * same vector bit for bit. v is in transposed order: element 4k+e of the result is the sum
 * of v[4e+k]. */
/* simd_hsum16x16's first two levels for one group of its four inputs v[4i..4i+3]: lane k of
 * the result holds the partial sums of v[4i+k]; a caller that has a group's four vectors
 * reduces them at once instead of keeping all sixteen */
static inline __m512 simd_hsum16x16_group(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    /* i, i+8: 256-bit halves; x = [v0 | v1], y = [v2 | v3] */
    const __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xEE));
    const __m512 y = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xEE));
    /* i, i+4: 128-bit lanes; lane k = v[k] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
}

/* simd_hsum16x16's last two levels, over its four groups (simd_hsum16x16_group of each) */
static inline __m512 simd_hsum16x16_tail(const __m512 *b) {
    __m512 e[2];
    for (int i = 0; i < 2; i++) { /* i, i+2 within a lane */
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        e[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* i, i+1 */
    return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

static inline __m512 simd_hsum16x16(const __m512 *v) {
    __m512 b[4];
    for (int i = 0; i < 4; i++) b[i] = simd_hsum16x16_group(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    return simd_hsum16x16_tail(b);
}
#endif

/* ---- vector exp: llama.cpp's ggml_v_expf (AVX-512), operation for operation -------------
 * The ARM optimized-routines expf polynomial (max error ~1.5 ulp) that ggml's CPU backend uses
 * for soft_max and SiLU. Same constants, same fma/mul/scalef sequence, so the results are
 * bit-identical to llama.cpp's: near-ties (f16 rounding of probabilities, q8 quantization of
 * activations) then fall the same way, which is what keeps long greedy runs on llama.cpp's
 * tokens. exp(x) = 2^n * poly(x - n ln2), n = round(x / ln2) by the 1.5*2^23 shift trick;
 * |n| > 192 gives 0 (n <= 0) or +inf. */

#if defined(__AVX512F__)
static inline __m512 simd_exp_f32x16(__m512 x) {
    const __m512 shift = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
    const __m512 n = _mm512_sub_ps(z, shift);
    /* b = x - n*ln2, ln2 split in a hi and a lo part */
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 hi = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)),
                                      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f)));
    const __m512 j = _mm512_fmadd_ps(hi, u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    if (!big) return res;
    const __m512 sat = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(big, res, sat);
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* ggml_v_expf's AVX2 form, operation for operation (llama.cpp's AVX2 builds): the same
 * polynomial as simd_exp_f32x16; 2^n through the exponent bits, with the |n| > 126 cases
 * split in two factors and |n| > 192 saturated to 0 / +inf. */
static inline __m256 simd_exp_f32x8(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256i c = _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(126), _CMP_GT_OQ));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(_mm256_castsi256_ps(c))) return _mm256_fmadd_ps(j, k, k);
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256i d = _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(192), _CMP_GT_OQ));
    return _mm256_or_ps(
        _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(_mm256_castsi256_ps(d),
                         _mm256_or_ps(_mm256_and_ps(_mm256_castsi256_ps(c), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                                      _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)))));
}
#endif

/* ---- row reductions -------------------------------------------------------------------------- */

/* sum(x*x): f32 products summed in double, like ggml_compute_forward_rms_norm (ggml_float). */
static inline double simd_sumsq(const float *x, int n) {
    int i = 0;
    double s = 0.0;
#if defined(__AVX512F__)
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 p = _mm512_mul_ps(v, v);
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1))));
    }
    s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#endif
    for (; i < n; i++) s += (double)(x[i] * x[i]);
    return s;
}

static inline float simd_max(const float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* a . b: one 16-lane fma chain, reduced in _mm512_reduce_add_ps order, then the tail */
static inline float simd_dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

#endif /* LLMCORE_SIMD_H */
