/* Activation rows for pyx/activations.pyx: SiLU and GELU (tanh form), optionally times a
 * multiplier row, and softmax's exp-and-sum, with ggml's vector exp (simd.h) so results are
 * bit-identical to llama.cpp's CPU backend on AVX-512 builds. */
#ifndef LLMCORE_SIMD_ACTIVATIONS_H
#define LLMCORE_SIMD_ACTIVATIONS_H

#include "simd.h"

/* y[i] = exp(x[i] - m); returns the sum. Entries equal to -INFINITY give exactly 0.
 * As ggml_vec_soft_max_f32: each 16-lane chunk reduced in float (GCC's _mm512_reduce_add_ps
 * order), the chunk sums accumulated in double. */
static inline double act_exp_sub_sum(const float *x, float *y, float m, int n) {
    int i = 0;
    double s = 0.0;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(m), ninf = _mm512_set1_ps(-INFINITY);
    for (; i < n; i += 16) {
        __mmask16 k = simd_mask16(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __mmask16 live = _mm512_mask_cmp_ps_mask(k, v, ninf, _CMP_NEQ_OQ);
        __m512 e = _mm512_maskz_mov_ps(live, simd_exp_f32x16(_mm512_sub_ps(v, vm)));
        _mm512_mask_storeu_ps(y + i, k, e);
        s += (double)_mm512_reduce_add_ps(e);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    {
        const __m256 vm = _mm256_set1_ps(m), ninf = _mm256_set1_ps(-INFINITY);
        for (; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            const __m256 live = _mm256_cmp_ps(v, ninf, _CMP_NEQ_OQ);
            const __m256 e = _mm256_and_ps(live, simd_exp_f32x8(_mm256_sub_ps(v, vm)));
            _mm256_storeu_ps(y + i, e);
            s += (double)simd_hsum_f32x8(e);
        }
    }
    for (; i < n; i++) { y[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - m); s += (double)y[i]; }
#else
    for (; i < n; i++) { y[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - m); s += (double)y[i]; }
#endif
    return s;
}

/* silu / gelu (tanh form) over a row, optionally multiplied by u (u may be NULL). */
static inline void act_silu_row(const float *g, const float *u, float *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 r = _mm512_div_ps(x, _mm512_add_ps(one, simd_exp_f32x16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        if (u) r = _mm512_mul_ps(r, _mm512_loadu_ps(u + i));
        _mm512_storeu_ps(y + i, r);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 r = _mm256_div_ps(x, _mm256_add_ps(one, simd_exp_f32x8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        if (u) r = _mm256_mul_ps(r, _mm256_loadu_ps(u + i));
        _mm256_storeu_ps(y + i, r);
    }
#endif
    for (; i < n; i++) {
        float r = g[i] / (1.0f + expf(-g[i]));
        y[i] = u ? r * u[i] : r;
    }
}

#define ACT_GELU_COEF_A 0.044715f
#define ACT_SQRT_2_OVER_PI 0.79788456080286535587989211986876f

static inline void act_gelu_row(const float *g, const float *u, float *y, int n) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f), half = _mm512_set1_ps(0.5f);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 t = _mm512_mul_ps(_mm512_set1_ps(ACT_SQRT_2_OVER_PI),
                                 _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(ACT_GELU_COEF_A), x),
                                                 _mm512_mul_ps(x, x), x));
        /* tanh(t) = 1 - 2 / (exp(2t) + 1): exact limits at +-inf, no overflow issue */
        __m512 th = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(simd_exp_f32x16(_mm512_mul_ps(two, t)), one)));
        __m512 r = _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, th));
        if (u) r = _mm512_mul_ps(r, _mm512_loadu_ps(u + i));
        _mm512_storeu_ps(y + i, r);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), half = _mm256_set1_ps(0.5f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 t = _mm256_mul_ps(_mm256_set1_ps(ACT_SQRT_2_OVER_PI),
                                 _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(ACT_GELU_COEF_A), x),
                                                 _mm256_mul_ps(x, x), x));
        __m256 th = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(simd_exp_f32x8(_mm256_mul_ps(two, t)), one)));
        __m256 r = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, th));
        if (u) r = _mm256_mul_ps(r, _mm256_loadu_ps(u + i));
        _mm256_storeu_ps(y + i, r);
    }
#endif
    for (; i < n; i++) {
        float x = g[i];
        float r = 0.5f * x * (1.0f + tanhf(ACT_SQRT_2_OVER_PI * x * (1.0f + ACT_GELU_COEF_A * x * x)));
        y[i] = u ? r * u[i] : r;
    }
}

#endif /* LLMCORE_SIMD_ACTIVATIONS_H */
