/* Inner loops of the gated DeltaNet kernels (pyx/deltanet.pyx). `omp simd` lets the compiler
 * vectorise the dot-product reductions with a fixed lane order, so results do not depend on
 * the thread count. */
#ifndef LLMCORE_SIMD_DELTANET_H
#define LLMCORE_SIMD_DELTANET_H
#include <math.h>
#include "simd_activations.h" /* act_silu_row: SiLU with ggml's vector exp (llama.cpp's values) */

/* One token of the delta rule on `n` state rows of one value head (row i = value dim i,
 * contiguous over the S key dims; llama.cpp's layout):
 *     sk = (g s_i) . k;  d = beta (v_i - sk);  s_i <- g s_i + d k;  o_i = s_i . q
 * Four rows at a time so that the reductions of independent rows overlap. */
#if defined(__AVX512F__)
/* The same for 8 rows and S % 16 == 0 with explicit 512-bit vectors (the compiler keeps to
 * 256): 8 independent accumulator chains per pass keep both FMA ports busy. */
static inline void gdn_rows8_avx512(float *restrict s, const float *restrict k, const float *restrict q,
                                    const float *restrict v, float g, float beta, float *restrict o, int S) {
    __m512 a[8];
    for (int r = 0; r < 8; r++)
        a[r] = _mm512_setzero_ps();
    for (int j = 0; j < S; j += 16) {
        const __m512 kj = _mm512_loadu_ps(k + j);
        for (int r = 0; r < 8; r++)
            a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(s + r * S + j), kj, a[r]);
    }
    const __m512 vg = _mm512_set1_ps(g);
    __m512 d[8], b[8];
    for (int r = 0; r < 8; r++) {
        d[r] = _mm512_set1_ps(beta * (v[r] - g * _mm512_reduce_add_ps(a[r])));
        b[r] = _mm512_setzero_ps();
    }
    for (int j = 0; j < S; j += 16) {
        const __m512 kj = _mm512_loadu_ps(k + j), qj = _mm512_loadu_ps(q + j);
        for (int r = 0; r < 8; r++) {
            const __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(s + r * S + j), vg, _mm512_mul_ps(d[r], kj));
            _mm512_storeu_ps(s + r * S + j, x);
            b[r] = _mm512_fmadd_ps(x, qj, b[r]);
        }
    }
    for (int r = 0; r < 8; r++)
        o[r] = _mm512_reduce_add_ps(b[r]);
}
#endif

static inline void gdn_rows(float *restrict s, const float *restrict k, const float *restrict q,
                            const float *restrict v, float g, float beta, float *restrict o,
                            int n, int S) {
    int i = 0;
#if defined(__AVX512F__)
    if (S % 16 == 0) {
        for (; i + 8 <= n; i += 8)
            gdn_rows8_avx512(s + (long)i * S, k, q, v + i, g, beta, o + i, S);
    }
#endif
    for (; i + 4 <= n; i += 4) {
        float *restrict s0 = s + (long)i * S, *restrict s1 = s0 + S, *restrict s2 = s1 + S,
              *restrict s3 = s2 + S;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+:a0, a1, a2, a3)
        for (int j = 0; j < S; j++) {
            a0 += s0[j] * k[j];
            a1 += s1[j] * k[j];
            a2 += s2[j] * k[j];
            a3 += s3[j] * k[j];
        }
        const float d0 = beta * (v[i] - g * a0), d1 = beta * (v[i + 1] - g * a1),
                    d2 = beta * (v[i + 2] - g * a2), d3 = beta * (v[i + 3] - g * a3);
        float b0 = 0.0f, b1 = 0.0f, b2 = 0.0f, b3 = 0.0f;
#pragma omp simd reduction(+:b0, b1, b2, b3)
        for (int j = 0; j < S; j++) {
            const float x0 = s0[j] * g + d0 * k[j], x1 = s1[j] * g + d1 * k[j],
                        x2 = s2[j] * g + d2 * k[j], x3 = s3[j] * g + d3 * k[j];
            s0[j] = x0; s1[j] = x1; s2[j] = x2; s3[j] = x3;
            b0 += x0 * q[j]; b1 += x1 * q[j]; b2 += x2 * q[j]; b3 += x3 * q[j];
        }
        o[i] = b0; o[i + 1] = b1; o[i + 2] = b2; o[i + 3] = b3;
    }
    for (; i < n; i++) {
        float *restrict si = s + (long)i * S;
        float a = 0.0f;
#pragma omp simd reduction(+:a)
        for (int j = 0; j < S; j++)
            a += si[j] * k[j];
        const float d = beta * (v[i] - g * a);
        float b = 0.0f;
#pragma omp simd reduction(+:b)
        for (int j = 0; j < S; j++) {
            const float x = si[j] * g + d * k[j];
            si[j] = x;
            b += x * q[j];
        }
        o[i] = b;
    }
}

/* y[c] = sum_k w[k][c] * src_k[c] over K taps for channels [0, n): one conv output row.
 * w is (K, C) (transposed ssm_conv1d.weight), src[k] the input row of tap k. */
static inline void conv_row(float *restrict y, const float *const *src, const float *restrict w,
                            long C, int K, int n) {
    for (int c = 0; c < n; c++)
        y[c] = 0.0f;
    for (int k = 0; k < K; k++) {
        const float *restrict x = src[k];
        const float *restrict wk = w + (long)k * C;
#pragma omp simd
        for (int c = 0; c < n; c++)
            y[c] += wk[c] * x[c];
    }
}

/* Conv output row in place: SiLU. */
static inline void dn_silu_inplace(float *y, int n) { act_silu_row(y, NULL, y, n); }

/* y = o / sqrt(mean(o^2) + eps) * w * silu(z) over one head of n values (the gated RMS norm). */
static inline void dn_gated_norm(const float *restrict o, const float *restrict z, const float *restrict w,
                                 float *restrict y, int n, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+:ss)
    for (int j = 0; j < n; j++)
        ss += o[j] * o[j];
    const float sc = 1.0f / sqrtf(ss / (float)n + eps);
    float g[64];
    for (int j0 = 0; j0 < n; j0 += 64) {
        const int m = n - j0 < 64 ? n - j0 : 64;
        act_silu_row(z + j0, NULL, g, m);
        for (int j = 0; j < m; j++)
            y[j0 + j] = o[j0 + j] * sc * w[j0 + j] * g[j];
    }
}

static inline float dn_sum_sq(const float *restrict x, int n) {
    float a = 0.0f;
#pragma omp simd reduction(+:a)
    for (int j = 0; j < n; j++)
        a += x[j] * x[j];
    return a;
}
#endif
