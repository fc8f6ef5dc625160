/* Attention micro-kernels for pyx/attention.pyx: scores of a query tile against a key block,
 * P.V accumulation, the softmax statistics and probabilities, and the decode fast path that
 * reads f16 K/V rows in place in llama.cpp's summation orders (flash attention off), so an
 * f16 cache gives llama.cpp's attention output bit for bit on AVX-512 builds.
 *
 * Every function has a plain C fallback; the f16 fast paths report (return 0) when this
 * build has none, and the caller takes the generic path. */
#ifndef LLMCORE_SIMD_ATTENTION_H
#define LLMCORE_SIMD_ATTENTION_H

#include "simd.h"

/* Prefetch n rows of row_bytes each, stride bytes apart (the next key block of a kv head:
 * its rows are spread over several 4 KiB pages, where hardware prefetch stops). */
static inline void attn_prefetch_rows(const uint8_t *p, long stride, int n, int row_bytes) {
    for (int j = 0; j < n; j++, p += stride)
        for (int c = 0; c < row_bytes; c += 64) __builtin_prefetch(p + c, 0, 3);
}

/* ---- attention micro-kernels ------------------------------------------------------------ */

/* s[r*ldS + j] = scale * sum_d q[r*ldq + d] * kt[d*bs + j] for r < R, j < bs.
 * kt is the key block transposed (D, bs), so 16 keys are scored per FMA without any
 * horizontal reduction; four query rows share each key-vector load. */
static void attn_scores(const float *q, int ldq, int R, const float *kt, int D, int bs,
                        float scale, float *s, int ldS) {
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(scale);
    int r = 0;
    for (; r + 4 <= R; r += 4) {
        const float *q0 = q + (size_t)r * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq;
        for (int j = 0; j < bs; j += 16) {
            __mmask16 k = simd_mask16(bs - j);
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
            __mmask16 k = simd_mask16(bs - j);
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
static void attn_pv(float *acc, float f, const float *p, const float *v, int n, int Dv) {
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
        __mmask16 k = simd_mask16(Dv - c);
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


/* Max of s[0:n] and sum(exp(s - max)) (entries of -INFINITY contribute 0), summed like
 * ggml's soft_max: 16-lane chunks from s[0] reduced in float, chunk sums added in double. */
static inline float attn_max_sumexp(const float *s, int n, double *sum) {
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
        __mmask16 k = simd_mask16(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, s + i);
        __mmask16 live = _mm512_mask_cmp_ps_mask(k, v, ninf, _CMP_NEQ_OQ);
        acc += (double)_mm512_reduce_add_ps(_mm512_maskz_mov_ps(live, simd_exp_f32x16(_mm512_sub_ps(v, mm))));
    }
#else
    for (; i < n; i++) acc += s[i] == -INFINITY ? 0.0 : (double)expf(s[i] - m);
#endif
    *sum = acc;
    return m;
}

/* p[i] = exp(s[i] - m) * inv (0 where s is -INFINITY), rounded to f16 when r16
 * (ggml: soft_max writes normalised f32 probabilities, the V matmul converts them to f16). */
static inline void attn_probs(const float *s, float *p, int n, float m, float inv, int r16) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 mm = _mm512_set1_ps(m), vi = _mm512_set1_ps(inv), ninf = _mm512_set1_ps(-INFINITY);
    for (; i < n; i += 16) {
        __mmask16 k = simd_mask16(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, s + i);
        __mmask16 live = _mm512_mask_cmp_ps_mask(k, v, ninf, _CMP_NEQ_OQ);
        __m512 e = _mm512_maskz_mov_ps(live, _mm512_mul_ps(simd_exp_f32x16(_mm512_sub_ps(v, mm)), vi));
        if (r16) e = _mm512_cvtph_ps(_mm512_cvtps_ph(e, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_mask_storeu_ps(p + i, k, e);
    }
#else
    for (; i < n; i++) {
        float e = s[i] == -INFINITY ? 0.0f : expf(s[i] - m) * inv;
        p[i] = r16 ? simd_f16_round(e) : e;
    }
#endif
}

/* ---- decode fast path: few query rows against f16 K/V rows read in place ------------------ */

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void attn_scores_f16_R(
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
#define ATTN_VD_SUM(r) _mm512_add_ps(_mm512_add_ps(c[r][0], c[r][2]), _mm512_add_ps(c[r][1], c[r][3]))
                a0 = ATTN_VD_SUM(0);
                if (R > 1) a1 = ATTN_VD_SUM(1);
                if (R > 2) a2 = ATTN_VD_SUM(2);
                if (R > 3) a3 = ATTN_VD_SUM(3);
#undef ATTN_VD_SUM
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
            const int slot = 4 * (jj & 3) + (jj >> 2);  /* transposed order for simd_hsum16x16 */
            tmp[0][slot] = a0;
            if (R > 1) tmp[1][slot] = a1;
            if (R > 2) tmp[2][slot] = a2;
            if (R > 3) tmp[3][slot] = a3;
        }
        for (int r = 0; r < R; r++) {
            for (int jj = m; jj < 16; jj++) tmp[r][4 * (jj & 3) + (jj >> 2)] = _mm512_setzero_ps();
            const __mmask16 km = simd_mask16(m);
            _mm512_mask_storeu_ps(s + (size_t)r * ldS + j0, km, _mm512_mul_ps(simd_hsum16x16(tmp[r]), vs));
        }
    }
}

static inline __attribute__((always_inline)) void attn_pv_f16_R(
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
#define ATTN_HAVE_F16_ROWS 1
#else
#define ATTN_HAVE_F16_ROWS 0
#endif

#define attn_scores_f16_R_vd(R, vd, ...) \
    ((vd) ? attn_scores_f16_R(R, 1, __VA_ARGS__) : attn_scores_f16_R(R, 0, __VA_ARGS__))

/* s[r*ldS + j] = scale * q_r . k_j for r < R, j < n; q (R, D) contiguous, key j = f16 row at
 * k + j*kstride (elements). Needs D % 16 == 0; rows are done 4 at a time. Returns 0 (and
 * does nothing) when this build has no fast path. */
static int attn_scores_f16_rows(const float *q, int R, const uint16_t *k, long kstride, int n, int D,
                                float scale, float *s, int ldS, const uint8_t *pf, long pfstride, int pfbytes, int vd) {
#if ATTN_HAVE_F16_ROWS
    if (D % 16) return 0;
    if (D % 64) vd = 0;
    for (int r = 0; r < R; r += 4) {
        const float *qr = q + (size_t)r * D;
        float *sr = s + (size_t)r * ldS;
        switch (R - r) {
            case 1: attn_scores_f16_R_vd(1, vd, qr, k, kstride, n, D, scale, sr, ldS, r ? NULL : pf, pfstride, pfbytes); break;
            case 2: attn_scores_f16_R_vd(2, vd, qr, k, kstride, n, D, scale, sr, ldS, r ? NULL : pf, pfstride, pfbytes); break;
            case 3: attn_scores_f16_R_vd(3, vd, qr, k, kstride, n, D, scale, sr, ldS, r ? NULL : pf, pfstride, pfbytes); break;
            default: attn_scores_f16_R_vd(4, vd, qr, k, kstride, n, D, scale, sr, ldS, r ? NULL : pf, pfstride, pfbytes); break;
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
 * p % 16); the lanes are then summed in _mm512_reduce_add_ps order. attn_pv_lanes_f16 adds keys
 * into per-lane partial sums accl (R, NL, Dv), NL = 64 or 16, and attn_pv_lanes_reduce combines
 * them the same way, so the attention output is bit-identical to llama.cpp's. */
static __thread float *attn_lane_buf = NULL;
static __thread size_t attn_lane_cap = 0;

/* zeroed per-thread (R, NL, Dv) lane sums, or NULL */
static float *attn_lane_scratch(size_t nfloats) {
    if (nfloats > attn_lane_cap) {
        free(attn_lane_buf);
        size_t cap = (nfloats + 15) & ~(size_t)15;
        attn_lane_buf = (float *)aligned_alloc(64, cap * sizeof(float));
        attn_lane_cap = attn_lane_buf ? cap : 0;
        if (!attn_lane_buf) return NULL;
    }
    memset(attn_lane_buf, 0, nfloats * sizeof(float));
    return attn_lane_buf;
}

static inline int attn_have_pv_lanes(int Dv) {
#if ATTN_HAVE_F16_ROWS
    return Dv % 16 == 0 && Dv <= 512;
#else
    (void)Dv;
    return 0;
#endif
}

/* accl[(r*NL + (pos0+j) % NL)*Dv + c] += p[r*ldp + j] * v_j[c], j < n (v_j: f16 row at v + j*vstride) */
static void attn_pv_lanes_f16(float *accl, int R, int NL, const float *p, int ldp, const uint16_t *v,
                              long vstride, int n, int Dv, long pos0) {
#if ATTN_HAVE_F16_ROWS
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
static void attn_pv_lanes_reduce(const float *accl, int R, int NL, int Dv, float *acc, int ldacc) {
#if ATTN_HAVE_F16_ROWS
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
static int attn_pv_f16_rows(float *acc, int ldacc, int R, const float *p, int ldp, const uint16_t *v,
                            long vstride, int n, int Dv, const uint8_t *pf, long pfstride, int pfbytes) {
#if ATTN_HAVE_F16_ROWS
    if (Dv % 16) return 0;
    for (int r = 0; r < R; r += 4) {
        float *ar = acc + (size_t)r * ldacc;
        const float *pr = p + (size_t)r * ldp;
        switch (R - r) {
            case 1: attn_pv_f16_R(1, ar, ldacc, pr, ldp, v, vstride, n, Dv, r ? NULL : pf, pfstride, pfbytes); break;
            case 2: attn_pv_f16_R(2, ar, ldacc, pr, ldp, v, vstride, n, Dv, r ? NULL : pf, pfstride, pfbytes); break;
            case 3: attn_pv_f16_R(3, ar, ldacc, pr, ldp, v, vstride, n, Dv, r ? NULL : pf, pfstride, pfbytes); break;
            default: attn_pv_f16_R(4, ar, ldacc, pr, ldp, v, vstride, n, Dv, r ? NULL : pf, pfstride, pfbytes); break;
        }
    }
    return 1;
#else
    (void)acc; (void)ldacc; (void)R; (void)p; (void)ldp; (void)v; (void)vstride; (void)n; (void)Dv; (void)pf; (void)pfstride; (void)pfbytes;
    return 0;
#endif
}

#endif /* LLMCORE_SIMD_ATTENTION_H */
