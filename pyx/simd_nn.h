/* SIMD helpers for pyx/nn.pyx: vector exp, f16 conversion, ggml Q8_0/Q4_0 rows,
 * and the two attention micro-kernels (scores of a query tile against a transposed
 * key block, and P·V accumulation).
 *
 * AVX-512 paths are used when the build targets them (-march=native on this CPU);
 * every function has a plain C fallback so portable builds still work.
 */
#ifndef LLMCORE_SIMD_NN_H
#define LLMCORE_SIMD_NN_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* ---- f16 <-> f32 ------------------------------------------------------------------ */

static inline float nn_h2f(uint16_t h) {
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

static inline uint16_t nn_f2h(float f) {
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

static inline void nn_f16_to_f32_row(const uint16_t *x, float *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = nn_h2f(x[i]);
}

static inline void nn_f32_to_f16_row(const float *x, uint16_t *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) y[i] = nn_f2h(x[i]);
}

/* ---- ggml Q8_0 / Q4_0 rows (blocks of 32), byte-identical to quantize_row_*_ref -------- */

/* No FMA contraction here: ggml's reference computes x*id + 8.5f as two roundings. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
static void nn_quantize_q8_0(const float *x, uint8_t *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 32, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) { float a = fabsf(x[j]); amax = a > amax ? a : amax; }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t hd = nn_f2h(d);
        memcpy(y, &hd, 2);
        for (int j = 0; j < 32; j++) {
            volatile float v = x[j] * id;
            ((int8_t *)y)[2 + j] = (int8_t)roundf(v);
        }
    }
}

static void nn_quantize_q4_0(const float *x, uint8_t *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 32, y += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float a = fabsf(x[j]);
            if (amax < a) { amax = a; max = x[j]; }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t hd = nn_f2h(d);
        memcpy(y, &hd, 2);
        for (int j = 0; j < 16; j++) {
            volatile float p0 = x[j] * id, p1 = x[j + 16] * id;
            float s0 = p0 + 8.5f, s1 = p1 + 8.5f;
            int q0 = (int)(int8_t)s0, q1 = (int)(int8_t)s1;
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

static inline void nn_dequant_q8_0(const uint8_t *x, float *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 34, y += 32) {
        uint16_t hd; memcpy(&hd, x, 2);
        const float d = nn_h2f(hd);
        const int8_t *q = (const int8_t *)(x + 2);
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
    }
}

static inline void nn_dequant_q4_0(const uint8_t *x, float *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 18, y += 32) {
        uint16_t hd; memcpy(&hd, x, 2);
        const float d = nn_h2f(hd);
        const uint8_t *q = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)(q[j] & 0x0f) - 8);
            y[j + 16] = d * (float)((int)(q[j] >> 4) - 8);
        }
    }
}

/* ---- vector exp: llama.cpp's ggml_v_expf (AVX-512), operation for operation -------------
 * The ARM optimized-routines expf polynomial (max error ~1.5 ulp) that ggml's CPU backend uses
 * for soft_max and SiLU. Same constants, same fma/mul/scalef sequence, so the results are
 * bit-identical to llama.cpp's: near-ties (f16 rounding of probabilities, q8 quantization of
 * activations) then fall the same way, which is what keeps long greedy runs on llama.cpp's
 * tokens. exp(x) = 2^n * poly(x - n ln2), n = round(x / ln2) by the 1.5*2^23 shift trick;
 * |n| > 192 gives 0 (n <= 0) or +inf. */

#if defined(__AVX512F__)
static inline __m512 nn_v_exp(__m512 x) {
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

/* y[i] = exp(x[i] - m); returns the sum. Entries equal to -INFINITY give exactly 0.
 * As ggml_vec_soft_max_f32: each 16-lane chunk reduced in float (GCC's _mm512_reduce_add_ps
 * order), the chunk sums accumulated in double. */
static inline double nn_exp_sub_sum(const float *x, float *y, float m, int n) {
    int i = 0;
    double s = 0.0;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(m), ninf = _mm512_set1_ps(-INFINITY);
    for (; i < n; i += 16) {
        __mmask16 k = (n - i) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __mmask16 live = _mm512_mask_cmp_ps_mask(k, v, ninf, _CMP_NEQ_OQ);
        __m512 e = _mm512_maskz_mov_ps(live, nn_v_exp(_mm512_sub_ps(v, vm)));
        _mm512_mask_storeu_ps(y + i, k, e);
        s += (double)_mm512_reduce_add_ps(e);
    }
#else
    for (; i < n; i++) { y[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - m); s += (double)y[i]; }
#endif
    return s;
}

/* silu / gelu (tanh form) over a row, optionally multiplied by u (u may be NULL). */
static inline void nn_silu_row(const float *g, const float *u, float *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 r = _mm512_div_ps(x, _mm512_add_ps(one, nn_v_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        if (u) r = _mm512_mul_ps(r, _mm512_loadu_ps(u + i));
        _mm512_storeu_ps(y + i, r);
    }
#endif
    for (; i < n; i++) {
        float r = g[i] / (1.0f + expf(-g[i]));
        y[i] = u ? r * u[i] : r;
    }
}

#define NN_GELU_COEF_A 0.044715f
#define NN_SQRT_2_OVER_PI 0.79788456080286535587989211986876f

static inline void nn_gelu_row(const float *g, const float *u, float *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f), half = _mm512_set1_ps(0.5f);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 t = _mm512_mul_ps(_mm512_set1_ps(NN_SQRT_2_OVER_PI),
                                 _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(NN_GELU_COEF_A), x),
                                                 _mm512_mul_ps(x, x), x));
        /* tanh(t) = 1 - 2 / (exp(2t) + 1): exact limits at +-inf, no overflow issue */
        __m512 th = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(nn_v_exp(_mm512_mul_ps(two, t)), one)));
        __m512 r = _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, th));
        if (u) r = _mm512_mul_ps(r, _mm512_loadu_ps(u + i));
        _mm512_storeu_ps(y + i, r);
    }
#endif
    for (; i < n; i++) {
        float x = g[i];
        float r = 0.5f * x * (1.0f + tanhf(NN_SQRT_2_OVER_PI * x * (1.0f + NN_GELU_COEF_A * x * x)));
        y[i] = u ? r * u[i] : r;
    }
}

/* sum(x*x): f32 products summed in double, like ggml_compute_forward_rms_norm (ggml_float). */
static inline double nn_sumsq(const float *x, int n) {
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

static inline float nn_max(const float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static inline float nn_dot(const float *a, const float *b, int n) {
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

/* Prefetch n rows of row_bytes each, stride bytes apart (the next key block of a kv head:
 * its rows are spread over several 4 KiB pages, where hardware prefetch stops). */
static inline void nn_prefetch_rows(const uint8_t *p, long stride, int n, int row_bytes) {
    for (int j = 0; j < n; j++, p += stride)
        for (int c = 0; c < row_bytes; c += 64) __builtin_prefetch(p + c, 0, 3);
}

/* ---- attention micro-kernels ------------------------------------------------------------ */

/* s[r*ldS + j] = scale * sum_d q[r*ldq + d] * kt[d*bs + j] for r < R, j < bs.
 * kt is the key block transposed (D, bs), so 16 keys are scored per FMA without any
 * horizontal reduction; four query rows share each key-vector load. */
static void nn_scores(const float *q, int ldq, int R, const float *kt, int D, int bs,
                      float scale, float *s, int ldS) {
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(scale);
    int r = 0;
    for (; r + 4 <= R; r += 4) {
        const float *q0 = q + (size_t)r * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq;
        for (int j = 0; j < bs; j += 16) {
            __mmask16 k = (bs - j) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (bs - j)) - 1);
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < D; d++) {
                __m512 kv = _mm512_maskz_loadu_ps(k, kt + (size_t)d * bs + j);
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), kv, a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[d]), kv, a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[d]), kv, a2);
                a3 = _mm512_fmadd_ps(_mm512_set1_ps(q3[d]), kv, a3);
            }
            _mm512_mask_storeu_ps(s + (size_t)r * ldS + j, k, _mm512_mul_ps(a0, vs));
            _mm512_mask_storeu_ps(s + (size_t)(r + 1) * ldS + j, k, _mm512_mul_ps(a1, vs));
            _mm512_mask_storeu_ps(s + (size_t)(r + 2) * ldS + j, k, _mm512_mul_ps(a2, vs));
            _mm512_mask_storeu_ps(s + (size_t)(r + 3) * ldS + j, k, _mm512_mul_ps(a3, vs));
        }
    }
    for (; r < R; r++) {
        const float *q0 = q + (size_t)r * ldq;
        for (int j = 0; j < bs; j += 16) {
            __mmask16 k = (bs - j) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (bs - j)) - 1);
            __m512 a0 = _mm512_setzero_ps();
            for (int d = 0; d < D; d++)
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), _mm512_maskz_loadu_ps(k, kt + (size_t)d * bs + j), a0);
            _mm512_mask_storeu_ps(s + (size_t)r * ldS + j, k, _mm512_mul_ps(a0, vs));
        }
    }
#else
    for (int r = 0; r < R; r++) {
        float *sr = s + (size_t)r * ldS;
        for (int j = 0; j < bs; j++) sr[j] = 0.0f;
        for (int d = 0; d < D; d++) {
            const float qd = q[(size_t)r * ldq + d];
            const float *kd = kt + (size_t)d * bs;
            for (int j = 0; j < bs; j++) sr[j] += qd * kd[j];
        }
        for (int j = 0; j < bs; j++) sr[j] *= scale;
    }
#endif
}

/* acc[0:Dv] = acc * f + sum_j p[j] * v[j*Dv + 0:Dv] over j < n (v row-major (n, Dv)). */
static void nn_pv(float *acc, float f, const float *p, const float *v, int n, int Dv) {
#if defined(__AVX512F__)
    const __m512 vf = _mm512_set1_ps(f);
    int c = 0;
    for (; c + 64 <= Dv; c += 64) {
        __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(acc + c), vf);
        __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(acc + c + 16), vf);
        __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(acc + c + 32), vf);
        __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(acc + c + 48), vf);
        for (int j = 0; j < n; j++) {
            if (p[j] == 0.0f) continue;
            const float *vj = v + (size_t)j * Dv + c;
            const __m512 pj = _mm512_set1_ps(p[j]);
            a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj), a0);
            a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16), a1);
            a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 32), a2);
            a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 48), a3);
        }
        _mm512_storeu_ps(acc + c, a0);
        _mm512_storeu_ps(acc + c + 16, a1);
        _mm512_storeu_ps(acc + c + 32, a2);
        _mm512_storeu_ps(acc + c + 48, a3);
    }
    for (; c < Dv; c += 16) {
        __mmask16 k = (Dv - c) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (Dv - c)) - 1);
        __m512 a0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, acc + c), vf);
        for (int j = 0; j < n; j++) {
            if (p[j] == 0.0f) continue;
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(k, v + (size_t)j * Dv + c), a0);
        }
        _mm512_mask_storeu_ps(acc + c, k, a0);
    }
#else
    for (int c = 0; c < Dv; c++) acc[c] *= f;
    for (int j = 0; j < n; j++) {
        if (p[j] == 0.0f) continue;
        const float pj = p[j];
        const float *vj = v + (size_t)j * Dv;
        for (int c = 0; c < Dv; c++) acc[c] += pj * vj[c];
    }
#endif
}


/* ---- llama.cpp rounding emulation (F16 KV, flash attention off) ------------------------- */

/* x[i] = f32(f16(x[i])): ggml converts the f32 operand of an f16 matmul to f16. */
static inline void nn_f16_round_row(const float *x, float *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
#endif
    for (; i < n; i++) y[i] = nn_h2f(nn_f2h(x[i]));
}

/* Max of s[0:n] and sum(exp(s - max)) (entries of -INFINITY contribute 0), summed like
 * ggml's soft_max: 16-lane chunks from s[0] reduced in float, chunk sums added in double. */
static inline float nn_max_sumexp(const float *s, int n, double *sum) {
    float m = -INFINITY;
    int i = 0;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= n; i += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + i));
    m = _mm512_reduce_max_ps(vm);
#endif
    for (; i < n; i++) m = s[i] > m ? s[i] : m;
    if (m == -INFINITY) { *sum = 0.0; return m; }
    double acc = 0.0;
    i = 0;
#if defined(__AVX512F__)
    __m512 mm = _mm512_set1_ps(m), ninf = _mm512_set1_ps(-INFINITY);
    for (; i < n; i += 16) {
        __mmask16 k = (n - i) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(k, s + i);
        __mmask16 live = _mm512_mask_cmp_ps_mask(k, v, ninf, _CMP_NEQ_OQ);
        acc += (double)_mm512_reduce_add_ps(_mm512_maskz_mov_ps(live, nn_v_exp(_mm512_sub_ps(v, mm))));
    }
#else
    for (; i < n; i++) acc += s[i] == -INFINITY ? 0.0 : (double)expf(s[i] - m);
#endif
    *sum = acc;
    return m;
}

/* p[i] = exp(s[i] - m) * inv (0 where s is -INFINITY), rounded to f16 when r16
 * (ggml: soft_max writes normalised f32 probabilities, the V matmul converts them to f16). */
static inline void nn_probs(const float *s, float *p, int n, float m, float inv, int r16) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 mm = _mm512_set1_ps(m), vi = _mm512_set1_ps(inv), ninf = _mm512_set1_ps(-INFINITY);
    for (; i < n; i += 16) {
        __mmask16 k = (n - i) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(k, s + i);
        __mmask16 live = _mm512_mask_cmp_ps_mask(k, v, ninf, _CMP_NEQ_OQ);
        __m512 e = _mm512_maskz_mov_ps(live, _mm512_mul_ps(nn_v_exp(_mm512_sub_ps(v, mm)), vi));
        if (r16) e = _mm512_cvtph_ps(_mm512_cvtps_ph(e, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_mask_storeu_ps(p + i, k, e);
    }
#else
    for (; i < n; i++) {
        float e = s[i] == -INFINITY ? 0.0f : expf(s[i] - m) * inv;
        p[i] = r16 ? nn_h2f(nn_f2h(e)) : e;
    }
#endif
}

/* ---- decode fast path: few query rows against f16 K/V rows read in place ------------------ */

#if defined(__AVX512F__)
/* Sums of the 16 lanes of 16 vectors at once, each grouped exactly like GCC's
 * _mm512_reduce_add_ps (lanes i+8, then i+4, i+2, i+1), so a score equals nn_dot's bit for
 * bit. v is in transposed order: element 4k+e of the result is the sum of v[4e+k]. */
static inline __m512 nn_hsum16x16(const __m512 *v) {
    __m512 a[8], b[4], e[2];
    for (int i = 0; i < 8; i++)   /* i, i+8: 256-bit halves; a[i] = [v2i | v2i+1] */
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)   /* i, i+4: 128-bit lanes; lane k of b[i] = v[4i+k] */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) { /* i, i+2 within a lane */
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        e[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* i, i+1 */
    return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

static inline __attribute__((always_inline)) void nn_scores_f16_R(
        const int R, const int VD, const float *q, const uint16_t *k, long kstride, int n, int D, float scale,
        float *s, int ldS, const uint8_t *pf, long pfstride, int pfbytes) {
    __m512 tmp[4][16];
    const __m512 vs = _mm512_set1_ps(scale);
    for (int j0 = 0; j0 < n; j0 += 16) {
        const int m = (n - j0) < 16 ? (n - j0) : 16;
        for (int jj = 0; jj < m; jj++) {
            const uint16_t *kr = k + (size_t)(j0 + jj) * kstride;
            if (pf) /* a later block's row, one per key: prefetches spread over the loop */
                for (int c = 0; c < pfbytes; c += 64) __builtin_prefetch(pf + (size_t)(j0 + jj) * pfstride + c, 0, 3);
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            if (VD) {
                /* ggml_vec_dot_f16 order (llama.cpp's K.Q for a 1-token batch): 4 accumulators
                 * over 64-wide steps, combined (c0 + c2) + (c1 + c3); needs D % 64 == 0 */
                __m512 c[4][4];
                for (int r = 0; r < 4; r++)
                    for (int u = 0; u < 4; u++) c[r][u] = _mm512_setzero_ps();
                for (int d = 0; d < D; d += 64)
                    for (int u = 0; u < 4; u++) {
                        const int du = d + 16 * u;
                        const __m512 kv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + du)));
                        c[0][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q + du), kv, c[0][u]);
                        if (R > 1) c[1][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q + D + du), kv, c[1][u]);
                        if (R > 2) c[2][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q + 2 * D + du), kv, c[2][u]);
                        if (R > 3) c[3][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q + 3 * D + du), kv, c[3][u]);
                    }
#define NN_VD_SUM(r) _mm512_add_ps(_mm512_add_ps(c[r][0], c[r][2]), _mm512_add_ps(c[r][1], c[r][3]))
                a0 = NN_VD_SUM(0);
                if (R > 1) a1 = NN_VD_SUM(1);
                if (R > 2) a2 = NN_VD_SUM(2);
                if (R > 3) a3 = NN_VD_SUM(3);
#undef NN_VD_SUM
            } else {
                /* tinyBLAS order (llama.cpp's K.Q for batches of >= 2 tokens): one chain */
                for (int d = 0; d < D; d += 16) {
                    const __m512 kv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + d)));
                    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), kv, a0);
                    if (R > 1) a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + D + d), kv, a1);
                    if (R > 2) a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 2 * D + d), kv, a2);
                    if (R > 3) a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 3 * D + d), kv, a3);
                }
            }
            const int slot = 4 * (jj & 3) + (jj >> 2);  /* transposed order for nn_hsum16x16 */
            tmp[0][slot] = a0;
            if (R > 1) tmp[1][slot] = a1;
            if (R > 2) tmp[2][slot] = a2;
            if (R > 3) tmp[3][slot] = a3;
        }
        for (int r = 0; r < R; r++) {
            for (int jj = m; jj < 16; jj++) tmp[r][4 * (jj & 3) + (jj >> 2)] = _mm512_setzero_ps();
            const __mmask16 km = m == 16 ? (__mmask16)0xffff : (__mmask16)((1u << m) - 1);
            _mm512_mask_storeu_ps(s + (size_t)r * ldS + j0, km, _mm512_mul_ps(nn_hsum16x16(tmp[r]), vs));
        }
    }
}

static inline __attribute__((always_inline)) void nn_pv_f16_R(
        const int R, float *acc, int ldacc, const float *p, int ldp, const uint16_t *v, long vstride,
        int n, int Dv, const uint8_t *pf, long pfstride, int pfbytes) {
    if (pf)
        for (int j = 0; j < n; j++)
            for (int c = 0; c < pfbytes; c += 64) __builtin_prefetch(pf + (size_t)j * pfstride + c, 0, 3);
    for (int c = 0; c < Dv; c += 64) {
        const int w = (Dv - c) < 64 ? (Dv - c) : 64;   /* multiple of 16 */
        const int nv = w / 16;
        __m512 a[4][4];
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 4; i++)
                a[r][i] = i < nv ? _mm512_loadu_ps(acc + (size_t)r * ldacc + c + 16 * i) : _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const uint16_t *vr = v + (size_t)j * vstride + c;
            __m512 vv[4];
            for (int i = 0; i < 4; i++)
                vv[i] = i < nv ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * i))) : _mm512_setzero_ps();
            for (int r = 0; r < R; r++) {
                const __m512 pj = _mm512_set1_ps(p[(size_t)r * ldp + j]);
                for (int i = 0; i < 4; i++) a[r][i] = _mm512_fmadd_ps(pj, vv[i], a[r][i]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int i = 0; i < nv; i++) _mm512_storeu_ps(acc + (size_t)r * ldacc + c + 16 * i, a[r][i]);
    }
}
#define NN_HAVE_F16_ROWS 1
#else
#define NN_HAVE_F16_ROWS 0
#endif

#define nn_scores_f16_R_vd(R, vd, ...) \
    ((vd) ? nn_scores_f16_R(R, 1, __VA_ARGS__) : nn_scores_f16_R(R, 0, __VA_ARGS__))

/* s[r*ldS + j] = scale * q_r . k_j for r < R, j < n; q (R, D) contiguous, key j = f16 row at
 * k + j*kstride (elements). Needs D % 16 == 0; rows are done 4 at a time. Returns 0 (and
 * does nothing) when this build has no fast path. */
static int nn_scores_f16_rows(const float *q, int R, const uint16_t *k, long kstride, int n, int D,
                              float scale, float *s, int ldS, const uint8_t *pf, long pfstride, int pfbytes, int vd) {
#if NN_HAVE_F16_ROWS
    if (D % 16) return 0;
    if (D % 64) vd = 0;
    for (int r = 0; r < R; r += 4) {
        const float *qr = q + (size_t)r * D;
        float *sr = s + (size_t)r * ldS;
        switch (R - r) {
            case 1: nn_scores_f16_R_vd(1, vd, qr, k, kstride, n, D, scale, sr, ldS, r ? NULL : pf, pfstride, pfbytes); break;
            case 2: nn_scores_f16_R_vd(2, vd, qr, k, kstride, n, D, scale, sr, ldS, r ? NULL : pf, pfstride, pfbytes); break;
            case 3: nn_scores_f16_R_vd(3, vd, qr, k, kstride, n, D, scale, sr, ldS, r ? NULL : pf, pfstride, pfbytes); break;
            default: nn_scores_f16_R_vd(4, vd, qr, k, kstride, n, D, scale, sr, ldS, r ? NULL : pf, pfstride, pfbytes); break;
        }
    }
    return 1;
#else
    (void)q; (void)R; (void)k; (void)kstride; (void)n; (void)D; (void)scale; (void)s; (void)ldS; (void)pf; (void)pfstride; (void)pfbytes; (void)vd;
    return 0;
#endif
}

/* ---- llama.cpp's P.V summation order (f16 V) ---------------------------------------------
 * llama.cpp computes each output element of P.V as a dot product over key positions: for a
 * 1-token batch ggml_vec_dot_f16 (4 accumulators x 16 float lanes, position p in lane p % 64,
 * combined (c0 + c2) + (c1 + c3)), for larger batches tinyBLAS (16 lanes, position p in lane
 * p % 16); the lanes are then summed in _mm512_reduce_add_ps order. nn_pv_lanes_f16 adds keys
 * into per-lane partial sums accl (R, NL, Dv), NL = 64 or 16, and nn_pv_lanes_reduce combines
 * them the same way, so the attention output is bit-identical to llama.cpp's. */
static __thread float *nn_lane_buf = NULL;
static __thread size_t nn_lane_cap = 0;

/* zeroed per-thread (R, NL, Dv) lane sums, or NULL */
static float *nn_lane_scratch(size_t nfloats) {
    if (nfloats > nn_lane_cap) {
        free(nn_lane_buf);
        size_t cap = (nfloats + 15) & ~(size_t)15;
        nn_lane_buf = (float *)aligned_alloc(64, cap * sizeof(float));
        nn_lane_cap = nn_lane_buf ? cap : 0;
        if (!nn_lane_buf) return NULL;
    }
    memset(nn_lane_buf, 0, nfloats * sizeof(float));
    return nn_lane_buf;
}

static inline int nn_have_pv_lanes(int Dv) {
#if NN_HAVE_F16_ROWS
    return Dv % 16 == 0 && Dv <= 512;
#else
    (void)Dv;
    return 0;
#endif
}

/* accl[(r*NL + (pos0+j) % NL)*Dv + c] += p[r*ldp + j] * v_j[c], j < n (v_j: f16 row at v + j*vstride) */
static void nn_pv_lanes_f16(float *accl, int R, int NL, const float *p, int ldp, const uint16_t *v,
                            long vstride, int n, int Dv, long pos0) {
#if NN_HAVE_F16_ROWS
    __m512 vv[32];
    const int nv = Dv / 16;
    for (int j = 0; j < n; j++) {
        int any = 0;
        for (int r = 0; r < R; r++) any |= p[(size_t)r * ldp + j] != 0.0f;
        if (!any) continue;  /* fma(0, v, acc) == acc */
        const uint16_t *vr = v + (size_t)j * vstride;
        for (int i = 0; i < nv; i++) vv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * i)));
        const int lane = (int)((pos0 + j) % NL);
        for (int r = 0; r < R; r++) {
            const float pj = p[(size_t)r * ldp + j];
            if (pj == 0.0f) continue;
            float *a = accl + ((size_t)r * NL + lane) * Dv;
            const __m512 pv = _mm512_set1_ps(pj);
            for (int i = 0; i < nv; i++)
                _mm512_storeu_ps(a + 16 * i, _mm512_fmadd_ps(pv, vv[i], _mm512_loadu_ps(a + 16 * i)));
        }
    }
#else
    (void)accl; (void)R; (void)NL; (void)p; (void)ldp; (void)v; (void)vstride; (void)n; (void)Dv; (void)pos0;
#endif
}

/* acc[r*ldacc + c] = the lanes of accl combined in llama.cpp's order */
static void nn_pv_lanes_reduce(const float *accl, int R, int NL, int Dv, float *acc, int ldacc) {
#if NN_HAVE_F16_ROWS
    for (int r = 0; r < R; r++)
        for (int d = 0; d < Dv; d += 16) {
            __m512 x[16];
            const float *b = accl + (size_t)r * NL * Dv + d;
            for (int l = 0; l < 16; l++) {
                if (NL == 64)
                    x[l] = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(b + (size_t)l * Dv), _mm512_loadu_ps(b + (size_t)(32 + l) * Dv)),
                                         _mm512_add_ps(_mm512_loadu_ps(b + (size_t)(16 + l) * Dv), _mm512_loadu_ps(b + (size_t)(48 + l) * Dv)));
                else
                    x[l] = _mm512_loadu_ps(b + (size_t)l * Dv);
            }
            for (int l = 0; l < 8; l++) x[l] = _mm512_add_ps(x[l], x[l + 8]);
            for (int l = 0; l < 4; l++) x[l] = _mm512_add_ps(x[l], x[l + 4]);
            for (int l = 0; l < 2; l++) x[l] = _mm512_add_ps(x[l], x[l + 2]);
            _mm512_storeu_ps(acc + (size_t)r * ldacc + d, _mm512_add_ps(x[0], x[1]));
        }
#else
    (void)accl; (void)R; (void)NL; (void)Dv; (void)acc; (void)ldacc;
#endif
}

/* acc[r*ldacc + c] += sum_j p[r*ldp + j] * v_j[c] for r < R, c < Dv; value j = f16 row at
 * v + j*vstride. Needs Dv % 16 == 0. Returns 0 when this build has no fast path. */
static int nn_pv_f16_rows(float *acc, int ldacc, int R, const float *p, int ldp, const uint16_t *v,
                          long vstride, int n, int Dv, const uint8_t *pf, long pfstride, int pfbytes) {
#if NN_HAVE_F16_ROWS
    if (Dv % 16) return 0;
    for (int r = 0; r < R; r += 4) {
        float *ar = acc + (size_t)r * ldacc;
        const float *pr = p + (size_t)r * ldp;
        switch (R - r) {
            case 1: nn_pv_f16_R(1, ar, ldacc, pr, ldp, v, vstride, n, Dv, r ? NULL : pf, pfstride, pfbytes); break;
            case 2: nn_pv_f16_R(2, ar, ldacc, pr, ldp, v, vstride, n, Dv, r ? NULL : pf, pfstride, pfbytes); break;
            case 3: nn_pv_f16_R(3, ar, ldacc, pr, ldp, v, vstride, n, Dv, r ? NULL : pf, pfstride, pfbytes); break;
            default: nn_pv_f16_R(4, ar, ldacc, pr, ldp, v, vstride, n, Dv, r ? NULL : pf, pfstride, pfbytes); break;
        }
    }
    return 1;
#else
    (void)acc; (void)ldacc; (void)R; (void)p; (void)ldp; (void)v; (void)vstride; (void)n; (void)Dv; (void)pf; (void)pfstride; (void)pfbytes;
    return 0;
#endif
}

#endif /* LLMCORE_SIMD_NN_H */
