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

/* ---------------------------------------------------------------------------------------- */
/* The chunked (WY / UT-transform) form of the same recurrence, for prefill: the tokens of a   */
/* chunk (at most GDN_CHUNK) of one value head as small matrix products (flash-linear-attention */
/* chunk_gated_delta_rule, llama.cpp's build_delta_net_chunking). With S the state before the  */
/* chunk, G_t = sum_{s<=t} log g_s (within the chunk), gam_t = exp(G_t), for tokens t, s:      */
/*     u_t = b_t (v_t - gam_t S k_t) - sum_{s<t} A[t,s] u_s,  A[t,s] = b_t e^(G_t-G_s) k_t.k_s  */
/*     o_t = gam_t S q_t + sum_{s<=t} e^(G_t-G_s) (q_t.k_s) u_s                                */
/*     S  <- gam_last S + sum_s e^(G_last-G_s) u_s k_s^T                                       */
/* (u_t is the recurrence's d at token t): U = T R with T = (I + A)^-1 (lower triangular, by    */
/* forward substitution), R = diag(b) (V - diag(gam) K S^T). Decays enter only as e^(x <= 0):  */
/* no overflow for decays near 0, nothing lost near 1. Token rows (K, Q, V, U, O) and the      */
/* state transposed (ST[j][i] = S[i][j], key dim j) make every product C (+)= A.B with rows of  */
/* B and C contiguous: one kernel, gdn_gemm. The value heads that read one q/k head share      */
/* k.k and q.k.                                                                                */
/* ---------------------------------------------------------------------------------------- */
#define GDN_CHUNK 64
enum { GDN_TRI_NONE = 0, GDN_TRI_A_LOWER = 1, GDN_TRI_C_LOWER = 2 };

/* C (M x N) = (acc ? C : 0) + A (M x K) . B (K x N): A element (m, k) at A[m*sam + k*sak], B
 * and C row-major (ldb, ldc). tri: GDN_TRI_A_LOWER: A[m][k] = 0 for k > m, skipped;
 * GDN_TRI_C_LOWER: only C[m][n] for n <= m is wanted (blocks past the diagonal skipped, those
 * computed hold the full product). AVX-512: 8 rows x 48 columns of C in registers, M % 8 == 0,
 * N % 16 == 0. */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void
gdn_mk(const int NV, int K, const float *restrict A, long sam, long sak, const float *restrict B, long ldb,
       float *restrict C, long ldc, int acc) {
    __m512 c[8][3];
    for (int r = 0; r < 8; r++)
        for (int v = 0; v < NV; v++) c[r][v] = acc ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 b[3];
        for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_ps(B + k * ldb + 16 * v);
        for (int r = 0; r < 8; r++) {
            const __m512 a = _mm512_set1_ps(A[r * sam + k * sak]);
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
        }
    }
    for (int r = 0; r < 8; r++)
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
}
#endif

static void gdn_gemm(int M, int N, int K, const float *restrict A, long sam, long sak, const float *restrict B,
                     long ldb, float *restrict C, long ldc, int acc, int tri) {
#if defined(__AVX512F__)
    if (M % 8 == 0 && N % 16 == 0) {
        for (int m0 = 0; m0 < M; m0 += 8) {
            const int kend = tri == GDN_TRI_A_LOWER && m0 + 8 < K ? m0 + 8 : K;
            const int nend = tri == GDN_TRI_C_LOWER && ((m0 + 8 + 15) & ~15) < N ? (m0 + 8 + 15) & ~15 : N;
            const float *a = A + (long)m0 * sam;
            for (int n0 = 0; n0 < nend; n0 += 48) {
                float *c = C + (long)m0 * ldc + n0;
                switch (nend - n0 >= 48 ? 3 : (nend - n0) / 16) {
                case 3: gdn_mk(3, kend, a, sam, sak, B + n0, ldb, c, ldc, acc); break;
                case 2: gdn_mk(2, kend, a, sam, sak, B + n0, ldb, c, ldc, acc); break;
                default: gdn_mk(1, kend, a, sam, sak, B + n0, ldb, c, ldc, acc); break;
                }
            }
        }
        return;
    }
#endif
    for (int m = 0; m < M; m++) {
        float *restrict c = C + (long)m * ldc;
        const int kend = tri == GDN_TRI_A_LOWER && m + 1 < K ? m + 1 : K;
        const int nend = tri == GDN_TRI_C_LOWER && m + 1 < N ? m + 1 : N;
        if (!acc)
            for (int n = 0; n < nend; n++) c[n] = 0.0f;
        for (int k = 0; k < kend; k++) {
            const float a = A[(long)m * sam + (long)k * sak];
            const float *restrict b = B + (long)k * ldb;
#pragma omp simd
            for (int n = 0; n < nend; n++) c[n] += a * b[n];
        }
    }
}

/* dst (cols x rows, row stride ldd) = src (rows x cols, row stride lds) transposed, in 16 x 16
 * tiles */
static void gdn_transpose(const float *restrict src, long lds, float *restrict dst, long ldd, int rows, int cols) {
    for (int r0 = 0; r0 < rows; r0 += 16)
        for (int c0 = 0; c0 < cols; c0 += 16) {
            const int r1 = r0 + 16 < rows ? r0 + 16 : rows, c1 = c0 + 16 < cols ? c0 + 16 : cols;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++) dst[(long)c * ldd + r] = src[(long)r * lds + c];
        }
}

/* y[t] = exp(x[t] - x0) for t in [0, n) */
static inline void gdn_exp_diff_row(const float *x, float x0, float *y, int n) {
    int t = 0;
#if defined(__AVX512F__)
    const __m512 v0 = _mm512_set1_ps(x0);
    for (; t + 16 <= n; t += 16) _mm512_storeu_ps(y + t, simd_exp_f32x16(_mm512_sub_ps(_mm512_loadu_ps(x + t), v0)));
#endif
    for (; t < n; t++) y[t] = expf(x[t] - x0);
}

/* tr -= sum_{s<t} ar[s] T[s] over the columns up to t (rows T[s], stride ld, are zero past
 * column s; tr is zero past column t) */
static inline void gdn_tri_row(float *restrict tr, const float *restrict ar, const float *restrict T, long ld, int t) {
#if defined(__AVX512F__)
    if (ld % 16 == 0) {
        for (int x0 = 0; x0 <= t; x0 += 16) {  /* columns x0..x0+15 take rows s >= x0 only */
            __m512 acc = _mm512_loadu_ps(tr + x0);
            for (int s = x0; s < t; s++)
                acc = _mm512_fnmadd_ps(_mm512_set1_ps(ar[s]), _mm512_loadu_ps(T + s * ld + x0), acc);
            _mm512_storeu_ps(tr + x0, acc);
        }
        return;
    }
#endif
    for (int s = 0; s < t; s++) {
        const float a = ar[s];
        const float *ts = T + s * ld;
        for (int x = 0; x <= s; x++) tr[x] -= a * ts[x];
    }
}

/* the cache lines of [p, p + nbytes) on their way in */
static inline void gdn_prefetch(const void *p, long nbytes) {
#if defined(__GNUC__)
    for (long o = 0; o < nbytes; o += 64) __builtin_prefetch((const char *)p + o, 1, 3);
#else
    (void)p; (void)nbytes;
#endif
}

/* floats of the chunked form's scratch for head dim D (gdn_chunk_group, not the states) */
static inline long gdn_chunk_scratch(int D) {
    const long L = GDN_CHUNK;
    return 2 * L * D + D * L + 2 * L * L + 2 * L * D + 3 * L * L + 3 * L * D + 4 * L + 64;
}

/* One chunk of L (1..GDN_CHUNK) tokens of the nh value heads that read one q/k head, in the
 * chunked form. ST[h] (D x D): head h's state transposed (ST[j][i] = S[i][j]), updated in
 * place; k, q: the q/k head's token rows (token t at k + t*ld; q L2-normed and scaled, k
 * L2-normed); v[h], o[h]: head h's value and output rows (v[h] + t*ld, o[h] + t*ldo); lg[h],
 * beta[h]: its log decay and beta at [t*ldg]; w: gdn_chunk_scratch(D) floats. Tokens are
 * padded to a multiple of 16 with zero k, q, v and beta and decay 1: they change nothing. */
static void gdn_chunk_group(int nh, float *const *ST, const float *k, const float *q, const float *const *v, long ld,
                            const float *const *lg, const float *const *beta, long ldg, float *const *o, long ldo,
                            int L, int D, float *restrict w) {
    const int Lp = (L + 15) & ~15;
    float *KQ = w;                     /* 2Lp x D: k rows, then q rows (zero pads) */
    float *KT = KQ + 2L * Lp * D;      /* D x Lp: K^T */
    float *KK = KT + (long)D * Lp;     /* Lp x Lp: k_t.k_s (s <= t) */
    float *QK = KK + (long)Lp * Lp;    /* Lp x Lp: q_t.k_s (s <= t) */
    float *X = QK + (long)Lp * Lp;     /* 2Lp x D: S k_t, then S q_t */
    float *Am = X + 2L * Lp * D;       /* Lp x Lp: A */
    float *T = Am + (long)Lp * Lp;     /* Lp x Lp: (I + A)^-1 */
    float *P = T + (long)Lp * Lp;      /* Lp x Lp: e^(G_t-G_s) q_t.k_s */
    float *R = P + (long)Lp * Lp;      /* Lp x D: R, then e^(G_last-G_s) k_s */
    float *U = R + (long)Lp * D;       /* Lp x D */
    float *O = U + (long)Lp * D;       /* Lp x D */
    float *G = O + (long)Lp * D, *gam = G + Lp, *bet = gam + Lp, *e = bet + Lp;
    for (int t = 0; t < Lp; t++) {
        float *kr = KQ + (long)t * D, *qr = KQ + (long)(Lp + t) * D;
        if (t < L) {
            memcpy(kr, k + t * ld, D * sizeof(float));
            memcpy(qr, q + t * ld, D * sizeof(float));
        } else {
            memset(kr, 0, D * sizeof(float));
            memset(qr, 0, D * sizeof(float));
        }
    }
    gdn_transpose(KQ, D, KT, Lp, Lp, D);
    gdn_gemm(Lp, Lp, D, KQ, D, 1, KT, Lp, KK, Lp, 0, GDN_TRI_C_LOWER);
    gdn_gemm(Lp, Lp, D, KQ + (long)Lp * D, D, 1, KT, Lp, QK, Lp, 0, GDN_TRI_C_LOWER);
    for (int h = 0; h < nh; h++) {
        for (int t = 0; t < Lp; t++) {  /* nG = -G (the exps below take differences of it) */
            G[t] = t < L ? (t ? G[t - 1] : 0.0f) - lg[h][t * ldg] : G[L - 1];
            bet[t] = t < L ? beta[h][t * ldg] : 0.0f;
        }
        for (int t = 0; t < Lp; t++) gam[t] = expf(-G[t]);
        gdn_gemm(2 * Lp, D, D, KQ, D, 1, ST[h], D, X, D, 0, GDN_TRI_NONE); /* X = [K; Q].S^T */
        /* A, P (row t over s <= t, zeros after) and T = (I + A)^-1, lower triangular, by
         * forward substitution: T[t] = e_t - sum_{s<t} A[t][s] T[s] (T[s] is zero past s) */
        for (int t = 0; t < Lp; t++) {
            gdn_exp_diff_row(G, G[t], e, t + 1);  /* e[s] = e^(nG_s - nG_t) = e^(G_t - G_s) <= 1 */
            float *ar = Am + (long)t * Lp, *pr = P + (long)t * Lp, *tr = T + (long)t * Lp;
            const float *kk = KK + (long)t * Lp, *qk = QK + (long)t * Lp;
            const float bt = bet[t];
            for (int s = 0; s < Lp; s++) {
                const float d = s <= t ? e[s] : 0.0f;
                ar[s] = s < t ? bt * d * kk[s] : 0.0f;
                pr[s] = s <= t ? d * qk[s] : 0.0f;  /* past the diagonal qk is not computed */
                tr[s] = s == t ? 1.0f : 0.0f;
            }
            gdn_tri_row(tr, ar, T, Lp, t);
        }
        /* R = diag(b) (V - diag(gam) X_K) */
        for (int t = 0; t < Lp; t++) {
            float *rr = R + (long)t * D;
            const float *xr = X + (long)t * D, *vr = v[h] + t * ld;
            const float b = bet[t], g = gam[t];
            if (t < L) {
#pragma omp simd
                for (int i = 0; i < D; i++) rr[i] = b * (vr[i] - g * xr[i]);
            } else {
                memset(rr, 0, D * sizeof(float));
            }
        }
        gdn_gemm(Lp, D, Lp, T, Lp, 1, R, D, U, D, 0, GDN_TRI_A_LOWER);   /* U = T.R */
        for (int t = 0; t < Lp; t++) {                                   /* O = diag(gam) X_Q + P.U */
            float *orow = O + (long)t * D;
            const float *xr = X + (long)(Lp + t) * D;
            const float g = gam[t];
#pragma omp simd
            for (int i = 0; i < D; i++) orow[i] = g * xr[i];
        }
        gdn_gemm(Lp, D, Lp, P, Lp, 1, U, D, O, D, 1, GDN_TRI_A_LOWER);
        for (int t = 0; t < L; t++) memcpy(o[h] + t * ldo, O + (long)t * D, D * sizeof(float));
        /* S^T <- gam_last S^T + K~^T.U, K~[s] = e^(G_last - G_s) k_s (in R) */
        const float Gl = G[L - 1];
        for (int t = 0; t < Lp; t++) {
            float *kr = R + (long)t * D;
            const float *ks = KQ + (long)t * D;
            const float f = t < L ? expf(G[t] - Gl) : 0.0f;  /* e^(G_last - G_t) */
#pragma omp simd
            for (int j = 0; j < D; j++) kr[j] = f * ks[j];
        }
        const float gl = expf(-Gl);
        float *st = ST[h];
        for (long x = 0; x < (long)D * D; x++) st[x] *= gl;
        gdn_gemm(D, D, Lp, R, 1, D, U, D, st, D, 1, GDN_TRI_NONE);
    }
}

/* y[c] = silu(sum_k w[k][c] * src_k[c]) over K taps for channels [0, n): one conv output row,
 * SiLU applied. w is (K, C) (transposed ssm_conv1d.weight), src[k] the input row of tap k.
 * AVX-512: 16 channels at a time summed in a register, taps in order (as the portable path). */
static inline void conv_silu_row(float *restrict y, const float *const *src, const float *restrict w,
                                 long C, int K, int n) {
    int c = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; c + 16 <= n; c += 16) {
        __m512 a = _mm512_setzero_ps();
        for (int k = 0; k < K; k++)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(w + (long)k * C + c), _mm512_loadu_ps(src[k] + c), a);
        _mm512_storeu_ps(y + c, _mm512_div_ps(a, _mm512_add_ps(one, simd_exp_f32x16(_mm512_sub_ps(_mm512_setzero_ps(), a)))));
    }
#endif
    for (; c < n; c++) {
        float a = 0.0f;
        for (int k = 0; k < K; k++) a += w[(long)k * C + c] * src[k][c];
        y[c] = a / (1.0f + expf(-a));
    }
}

/* y = o / sqrt(mean(o^2) + eps) * w * silu(z) over one head of n values (the gated RMS norm). */
static inline void dn_gated_norm(const float *restrict o, const float *restrict z, const float *restrict w,
                                 float *restrict y, int n, float eps) {
#if defined(__AVX512F__)
    if (n % 16 == 0) {  /* one 16-lane sum of squares; SiLU as act_silu_row's */
        __m512 a = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 16) {
            const __m512 x = _mm512_loadu_ps(o + j);
            a = _mm512_fmadd_ps(x, x, a);
        }
        const __m512 sc = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(a) / (float)n + eps));
        const __m512 one = _mm512_set1_ps(1.0f);
        for (int j = 0; j < n; j += 16) {
            const __m512 zz = _mm512_loadu_ps(z + j);
            const __m512 g = _mm512_div_ps(zz, _mm512_add_ps(one, simd_exp_f32x16(_mm512_sub_ps(_mm512_setzero_ps(), zz))));
            _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(o + j), sc),
                                                                _mm512_loadu_ps(w + j)), g));
        }
        return;
    }
#endif
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
