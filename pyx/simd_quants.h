/* Legacy-quant (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and float (F32, F16, BF16) kernels.
 *
 * Weights are repacked at load into groups of LQ_G = 16 output rows. For each group and each
 * 32-weight block the packed stream holds
 *     qs    : the 16 rows' quants interleaved 4 bytes per row, so one 64-byte vector holds
 *             4 consecutive weights of each of the 16 rows (one int32 lane per row);
 *     [H]   : (Q5 only) 64 bytes of high bits, one dword per row;
 *     d[16] : f16 row scales;  [m[16] : f16 row mins for Q4_1/Q5_1].
 * A dot product of a block is then sum_c dpbusd(w_c, broadcast(a[4c..4c+3])): no horizontal
 * reductions, 16 rows per accumulator. Weights are stored unsigned (q or q+offset), the
 * offset is folded in through the activation block sums:
 *     y_r += d_r * d_a * (sum(u * a) + moff * sum(a))   (moff = -8 / -16 / -128: Q4_0 / Q5_0 / Q8_0)
 *     y_r += d_r * d_a * sum(u * a) + m_r * s_a          (Q4_1 / Q5_1, s_a = d_a * sum(a))
 *
 * Layout of qs per format:
 *   FMT4 (Q4_0/Q4_1): 4 chunks of 64 B; chunk c, row i, byte t holds q[4c+t] (low nibble) and
 *                     q[16+4c+t] (high nibble): the GGUF qs bytes 4c..4c+3 of the row.
 *   FMT5 (Q5_0/Q5_1): FMT4 nibbles + H: row i byte t, bit c = bit 4 of q[4c+t],
 *                     bit 4+c = bit 4 of q[16+4c+t].
 *   FMT8 (Q8_0):      8 chunks of 64 B; chunk c, row i, byte t holds q[4c+t] + 128.
 * Activations are quantized per row to 32-int8 blocks exactly like ggml's quantize_row_q8_0 /
 * quantize_row_q8_1: q = round_half_even(x * 127/amax), d = amax/127 rounded to f16; for
 * Q4_1/Q5_1 (q8_1) the sum term is s = f16(d_f32 * sum(q)) (the same f16 rounding as ggml);
 * for the offset formats it is the exact integer moff * sum(q), added to the integer dot
 * before scaling, so a block contributes d_w * d_a * sumi exactly as ggml's vec_dot does.
 *
 * Float sums: per output, the blocks in order in one fma chain (Q4_1/Q5_1: the dot and the
 * min term of a block in that chain). That is not ggml's lane-wise order for Q4_1 (eight
 * partial sums per row, reduced at the end): outputs agree with llama.cpp to float rounding,
 * not bit for bit, and the kernel keeps 8 token accumulators live instead of 2 (1.6x the
 * prefill throughput). Results depend on the shapes only, never on the token tile or the
 * thread count.
 *
 * Streaming: the bytes simd_pf_dist ahead of each block are prefetched (simd.h), and the packed
 * weights live in llmcore.quant's huge-page arena.
 *
 * SIMD: AVX-512 VNNI (vpdpbusd) when compiled with it, else AVX2, else portable C (same
 * layout); on AVX-512 builds for a CPU with AMX-INT8, whole 16-token tiles of a matmul run
 * on AMX tiles with the same output bits (see "AMX" below). The work items (a row group, a token tile) are single-threaded; pyx/quants.pyx
 * shares them out over OpenMP threads.
 */
#ifndef LLMCORE_SIMD_QUANTS_H
#define LLMCORE_SIMD_QUANTS_H

#include "simd.h"

#define LQ_VNNI SIMD_AVX512_VNNI

#define LQ_G 16
#define LQ_QK 32
#define LQ_TT 8 /* tokens per tile in the matmul kernels */

/* How the row kernels of one to a few tokens (lq_kernel_vnni, lq_kernel_vnni_pair,
 * lq_kernel_avx2_fmt) ask for a block simd_pf_dist ahead: 1 (default) a part with each of its
 * chunks, 0 the whole block at its start (A/B). Asked for at once, even a block's 5-9 lines held the core's misses back: one
 * thread, one token, one stream from memory, Xeon with AMX: Q5_0 11.3-11.8 GB/s at once,
 * 13.8-16.4 in parts (the K-quant tiles: simd_kquants.h's kq_pf_mode). With the K-quant tiles'
 * parts and 4 KB ahead (step.pyx): generation 1.125x the tokens/s on gemma-3-270m, 1.084x on
 * SmolLM2 (bench/compare_builds.py). A step's tiles (2 or more tokens) keep a whole block at
 * once: in parts, 2-8 SmolLM2 sequences took 1.07-1.2x the time. */
static int lq_pf_mode = 1;
static inline int lq_set_pf_mode(int mode) { const int old = lq_pf_mode; lq_pf_mode = mode; return old; }

/* part c of n of the lines of the bb-byte block at p (p: the block dist bytes ahead): the lines
 * that start in [p + c bb / n, p + (c + 1) bb / n), and for c = 0 the line holding p, so the n
 * parts ask for each line of the block once (a line the next block shares, twice) */
static inline __attribute__((always_inline)) void lq_pf_part(const uint8_t *p, int64_t bb, int c, int n,
                                                             const int l2) {
    const uintptr_t a = (uintptr_t)p + (uintptr_t)((c * bb) / n), e = (uintptr_t)p + (uintptr_t)(((c + 1) * bb) / n);
    if (c == 0 && (a & 63)) {
        if (l2) __builtin_prefetch(p, 0, 2);
        else __builtin_prefetch(p, 0, 3);
    }
    for (uintptr_t q = (a + 63) & ~(uintptr_t)63; q < e; q += 64) {
        if (l2) __builtin_prefetch((const void *)q, 0, 2);
        else __builtin_prefetch((const void *)q, 0, 3);
    }
}

/* A row kernel's request for block blk simd_pf_dist ahead: the block there for lq_pf_part
 * (lq_pf_mode 1), or NULL after asking for it whole (0; into L2 where burst_l2) or with
 * prefetching off */
static inline __attribute__((always_inline)) const uint8_t *lq_pf_block(const uint8_t *blk, int64_t bb,
                                                                       const int burst_l2) {
    if (!lq_pf_mode) {
        if (burst_l2) simd_prefetch_range_l2(blk, (int)bb);
        else simd_prefetch_range(blk, (int)bb);
        return NULL;
    }
    return simd_pf_dist > 0 ? blk + simd_pf_dist : NULL;
}

enum { GT_F32 = 0, GT_F16 = 1, GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q5_0 = 6, GT_Q5_1 = 7, GT_Q8_0 = 8, GT_BF16 = 30 };
enum { LQ_FMT_NONE = -1, LQ_FMT_F32 = 0, LQ_FMT_F16 = 1, LQ_FMT_BF16 = 2, LQ_FMT4 = 4, LQ_FMT5 = 5, LQ_FMT8 = 8 };

typedef struct {
    int type;          /* ggml type */
    int fmt;           /* LQ_FMT_* */
    int has_m;         /* per-row mins stored */
    float moff;        /* multiplier of the activation sums (see above) */
    int64_t rows, cols, nb, ngroups;
    int64_t qbytes;    /* quant bytes per group-block */
    int64_t blk_bytes; /* bytes per group-block (quants + scales) */
    const uint8_t *data;
} lq_packed;

static inline int lq_simd_level(void);

/* ---------------------------------------------------------------- type table */
static inline int lq_block_bytes(int type) {
    switch (type) {
    case GT_Q4_0: return 18; case GT_Q4_1: return 20; case GT_Q5_0: return 22;
    case GT_Q5_1: return 24; case GT_Q8_0: return 34; default: return 0;
    }
}
static inline int lq_fmt_for_type(int type) {
    switch (type) {
    case GT_F32: return LQ_FMT_F32; case GT_F16: return LQ_FMT_F16; case GT_BF16: return LQ_FMT_BF16;
    case GT_Q4_0: case GT_Q4_1: return LQ_FMT4;
    case GT_Q5_0: case GT_Q5_1: return LQ_FMT5;
    case GT_Q8_0: return LQ_FMT8;
    default: return LQ_FMT_NONE;
    }
}

/* Fill the descriptor; data may be NULL (to compute sizes). Returns the packed byte size. */
static inline int64_t lq_init_packed(lq_packed *p, int type, int64_t rows, int64_t cols, const uint8_t *data) {
    p->type = type; p->fmt = lq_fmt_for_type(type); p->rows = rows; p->cols = cols; p->data = data;
    p->qbytes = p->blk_bytes = 0;
    p->has_m = (type == GT_Q4_1 || type == GT_Q5_1);
    p->moff = type == GT_Q4_0 ? -8.f : type == GT_Q5_0 ? -16.f : type == GT_Q8_0 ? -128.f : 1.f;
    p->nb = cols / LQ_QK;
    p->ngroups = (rows + LQ_G - 1) / LQ_G;
    switch (p->fmt) {
    case LQ_FMT_F32: return rows * cols * 4;
    case LQ_FMT_F16: case LQ_FMT_BF16: return rows * cols * 2;
    case LQ_FMT4: p->qbytes = 256; break;
    case LQ_FMT5: p->qbytes = 320; break;
    case LQ_FMT8: p->qbytes = 512; break;
    default: return -1;
    }
    p->blk_bytes = p->qbytes + 32 + (p->has_m ? 32 : 0);
    return p->ngroups * p->nb * p->blk_bytes;
}

/* ---------------------------------------------------------------- repack */
/* Row groups [g0, g1) of the raw GGUF rows (row r at raw + r * bpr) into out (the whole
 * packed buffer, lq_init_packed's size). */
static void lq_pack(const uint8_t *raw, int64_t bpr, int type, int64_t rows, int64_t cols,
                    int64_t g0, int64_t g1, uint8_t *out) {
    lq_packed P;
    lq_init_packed(&P, type, rows, cols, out);
    const int bs = lq_block_bytes(type);
    const int64_t nb = P.nb, bb = P.blk_bytes, qb = P.qbytes;
    for (int64_t g = g0; g < g1; g++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (g * nb + b) * bb;
            memset(o, 0, bb);
            uint16_t *od = (uint16_t *)(o + qb), *om = (uint16_t *)(o + qb + 32);
            for (int i = 0; i < LQ_G; i++) {
                int64_t r = g * LQ_G + i;
                if (r >= rows) break;
                const uint8_t *nat = raw + r * bpr + b * bs;
                od[i] = simd_rd16(nat);
                const uint8_t *qs; uint32_t qh = 0;
                switch (type) {
                case GT_Q4_0: qs = nat + 2; break;
                case GT_Q4_1: om[i] = simd_rd16(nat + 2); qs = nat + 4; break;
                case GT_Q5_0: qh = simd_rd32(nat + 2); qs = nat + 6; break;
                case GT_Q5_1: om[i] = simd_rd16(nat + 2); qh = simd_rd32(nat + 4); qs = nat + 8; break;
                default: qs = nat + 2; break; /* Q8_0 */
                }
                if (P.fmt == LQ_FMT8) {
                    for (int c = 0; c < 8; c++) { /* q + 128 == q ^ 0x80 on each byte */
                        uint32_t v = simd_rd32(qs + 4 * c) ^ 0x80808080u;
                        memcpy(o + 64 * c + 4 * i, &v, 4);
                    }
                } else {
                    for (int c = 0; c < 4; c++) memcpy(o + 64 * c + 4 * i, qs + 4 * c, 4);
                    if (P.fmt == LQ_FMT5) {
                        for (int t = 0; t < 4; t++) {
                            uint8_t h = 0;
                            for (int c = 0; c < 4; c++) {
                                h |= ((qh >> (4 * c + t)) & 1u) << c;
                                h |= ((qh >> (16 + 4 * c + t)) & 1u) << (4 + c);
                            }
                            o[256 + 4 * i + t] = h;
                        }
                    }
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- dequantize (exact) */
/* Same arithmetic as gguf.quants (no FMA contraction: d*q + m rounds twice). */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static void lq_dequant_row(const uint8_t *row, int type, int64_t cols, float *out) {
    int64_t j;
    switch (type) {
    case GT_F32: memcpy(out, row, cols * 4); return;
    case GT_F16: for (j = 0; j < cols; j++) out[j] = simd_h2f(simd_rd16(row + 2 * j)); return;
    case GT_BF16: for (j = 0; j < cols; j++) out[j] = simd_bf2f(simd_rd16(row + 2 * j)); return;
    default: break;
    }
    const int bs = lq_block_bytes(type);
    for (int64_t b = 0; b < cols / LQ_QK; b++) {
        const uint8_t *nat = row + b * bs;
        float *o = out + b * LQ_QK;
        const float d = simd_h2f(simd_rd16(nat));
        switch (type) {
        case GT_Q4_0:
            for (int k = 0; k < 16; k++) {
                o[k] = d * (float)((int)(nat[2 + k] & 15) - 8);
                o[k + 16] = d * (float)((int)(nat[2 + k] >> 4) - 8);
            }
            break;
        case GT_Q4_1: {
            const float m = simd_h2f(simd_rd16(nat + 2));
            for (int k = 0; k < 16; k++) {
                float a = d * (float)(nat[4 + k] & 15), c = d * (float)(nat[4 + k] >> 4);
                o[k] = a + m; o[k + 16] = c + m;
            }
        } break;
        case GT_Q5_0: {
            const uint32_t qh = simd_rd32(nat + 2);
            for (int k = 0; k < 16; k++) {
                int lo = (nat[6 + k] & 15) | (((qh >> k) & 1) << 4);
                int hi = (nat[6 + k] >> 4) | (((qh >> (k + 16)) & 1) << 4);
                o[k] = d * (float)(lo - 16); o[k + 16] = d * (float)(hi - 16);
            }
        } break;
        case GT_Q5_1: {
            const float m = simd_h2f(simd_rd16(nat + 2));
            const uint32_t qh = simd_rd32(nat + 4);
            for (int k = 0; k < 16; k++) {
                int lo = (nat[8 + k] & 15) | (((qh >> k) & 1) << 4);
                int hi = (nat[8 + k] >> 4) | (((qh >> (k + 16)) & 1) << 4);
                float a = d * (float)lo, c = d * (float)hi;
                o[k] = a + m; o[k + 16] = c + m;
            }
        } break;
        case GT_Q8_0:
            for (int k = 0; k < 32; k++) o[k] = (float)(int8_t)nat[2 + k] * d;
            break;
        }
    }
}
#pragma GCC pop_options

/* ---------------------------------------------------------------- activation quantization */
#if defined(__AVX512F__)
/* lane j of the result: the max of v[j] (operands in simd_hsum16x16's tree, then put back in
 * block order) */
static inline __m512 lq_hmax16x16(const __m512 *v) {
    __m512 a[8], b[4], e[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_max_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) {
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        e[i] = _mm512_max_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 r = _mm512_max_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}
#endif

/* One row of K floats (K % 32 == 0) -> q int8[K], d[K/32], s[K/32] = moff * d * sum(q).
 * AVX-512: 16 blocks at a time, their maxima and sums reduced together (a 16 x 16 tree, not
 * one horizontal reduction per block); the same values (max is exact, the sums are of small
 * integers, exact in float). */
static inline void lq_quant_row_q8(const float *x, int64_t K, int8_t *q, float *d, float *s, float moff) {
    int64_t b = 0;
#if defined(__AVX512F__)
    for (; b + 16 <= K / LQ_QK; b += 16) {
        const float *xb = x + b * LQ_QK;
        __m512 t[16];
        for (int j = 0; j < 16; j++)
            t[j] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * j)), _mm512_abs_ps(_mm512_loadu_ps(xb + 32 * j + 16)));
        const __m512 amax = lq_hmax16x16(t);
        const __m512 db = _mm512_div_ps(amax, _mm512_set1_ps(127.f));
        const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ),
                                              _mm512_set1_ps(127.f), amax);
        float idb[16];
        _mm512_storeu_ps(idb, id);
        for (int j = 0; j < 16; j++) {
            const __m512 vid = _mm512_set1_ps(idb[j]);
            const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * j), vid));
            const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * j + 16), vid));
            _mm_storeu_si128((__m128i *)(q + (b + j) * LQ_QK), _mm512_cvtepi32_epi8(i0));
            _mm_storeu_si128((__m128i *)(q + (b + j) * LQ_QK + 16), _mm512_cvtepi32_epi8(i1));
            t[j] = _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1));
        }
        __m512 sum = simd_hsum16x16(t);  /* integers below 2^13: exact in any order */
        sum = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sum);
        const __m512 d16 = _mm512_cvtph_ps(_mm512_cvtps_ph(db, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_storeu_ps(d + b, d16);
        if (moff == 1.f)
            _mm512_storeu_ps(s + b, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(db, sum),
                                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        else
            _mm512_storeu_ps(s + b, _mm512_mul_ps(_mm512_set1_ps(moff), sum));
    }
#endif
    for (; b < K / LQ_QK; b++) {
        const float *xb = x + b * LQ_QK;
#if defined(__AVX512F__)
        __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        __m512 a = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
        float amax = _mm512_reduce_max_ps(a);
        float db = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)(q + b * LQ_QK), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + b * LQ_QK + 16), _mm512_cvtepi32_epi8(i1));
        int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
#elif defined(__AVX2__)
        /* the C loop's arithmetic in lanes (cvtps rounds to nearest even, as nearbyintf) */
        const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        const float amax = simd_hmax_f32x8(_mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absm), _mm256_and_ps(v1, absm)),
                                                         _mm256_max_ps(_mm256_and_ps(v2, absm), _mm256_and_ps(v3, absm))));
        float db = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        const __m256 vid = _mm256_set1_ps(id);
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        _mm256_storeu_si256((__m256i *)(q + b * LQ_QK), simd_pack_i8x32(i0, i1, i2, i3));
        const int sum = simd_hsum_i32x8(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
#else
        float amax = 0.f;
        for (int k = 0; k < LQ_QK; k++) { float v = fabsf(xb[k]); amax = v > amax ? v : amax; }
        float db = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        int sum = 0;
        for (int k = 0; k < LQ_QK; k++) {
            int v = (int)nearbyintf(xb[k] * id);
            q[b * LQ_QK + k] = (int8_t)v; sum += v;
        }
#endif
        d[b] = simd_f16_round(db);
        s[b] = moff == 1.f ? simd_f16_round(db * (float)sum) : moff * (float)sum;
    }
}

/* ---------------------------------------------------------------- block kernels */
/* Group g of P, tokens t0..t0+T-1: y[t*ystride + i] for rows i < nvalid of the group. */
static inline void lq_kernel_scalar(const lq_packed *P, int64_t g, const int8_t *qa, const float *da,
                                    const float *sa, int T, float *y, int64_t ystride, int nvalid) {
    const int64_t nb = P->nb, K = P->cols;
    for (int t = 0; t < T; t++) {
        float acc[LQ_G] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = P->data + (g * nb + b) * P->blk_bytes;
            const uint16_t *dd = (const uint16_t *)(blk + P->qbytes);
            const uint16_t *mm = P->has_m ? dd + 16 : dd;
            const int8_t *a = qa + t * K + b * LQ_QK;
            const float dat = da[t * nb + b], sat = sa[t * nb + b];
            for (int i = 0; i < LQ_G; i++) {
                int isum = 0;
                if (P->fmt == LQ_FMT8) {
                    for (int c = 0; c < 8; c++)
                        for (int u = 0; u < 4; u++) isum += (int)blk[64 * c + 4 * i + u] * a[4 * c + u];
                } else {
                    for (int c = 0; c < 4; c++)
                        for (int u = 0; u < 4; u++) {
                            int byte = blk[64 * c + 4 * i + u];
                            int lo = byte & 15, hi = byte >> 4;
                            if (P->fmt == LQ_FMT5) {
                                int h = blk[256 + 4 * i + u];
                                lo |= ((h >> c) & 1) << 4;
                                hi |= ((h >> (4 + c)) & 1) << 4;
                            }
                            isum += lo * a[4 * c + u] + hi * a[16 + 4 * c + u];
                        }
                }
                if (P->has_m) acc[i] += simd_h2f(dd[i]) * dat * (float)isum + simd_h2f(mm[i]) * sat;
                else acc[i] += simd_h2f(dd[i]) * dat * ((float)isum + sat);
            }
        }
        for (int i = 0; i < nvalid; i++) y[t * ystride + i] = acc[i];
    }
}

/* a thread's buffer for unpacked groups (64-byte aligned; the VNNI and AVX2 kernels), or NULL */
static __thread uint8_t *lq_unp_buf = NULL;
static __thread size_t lq_unp_cap = 0;
static uint8_t *lq_unpack_buffer(size_t bytes) {
    if (bytes > lq_unp_cap) {
        free(lq_unp_buf);
        lq_unp_buf = (uint8_t *)simd_alloc(bytes);
        lq_unp_cap = lq_unp_buf ? bytes : 0;
    }
    return lq_unp_buf;
}

#if LQ_VNNI
/* A block's 8 VNNI chunks w[0..7] (the 4-bit formats' low and high nibbles split, Q5's fifth
 * bits merged), asking with each chunk's load for its part of the block pf (bb bytes; NULL:
 * none; lq_pf_part) */
static inline __attribute__((always_inline)) void lq_unpack_vnni_pf(const uint8_t *blk, const int FMT, __m512i *w,
                                                                     const uint8_t *pf, int64_t bb, const int l2) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), b16 = _mm512_set1_epi8(0x10);
    if (FMT == 8) {
        for (int c = 0; c < 8; c++) {
            if (pf) lq_pf_part(pf, bb, c, 8, l2);
            w[c] = _mm512_loadu_si512((const void *)(blk + 64 * c));
        }
        return;
    }
    for (int c = 0; c < 4; c++) {
        if (pf) lq_pf_part(pf, bb, c, 4, l2);
        __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * c));
        w[c] = _mm512_and_si512(v, m4);
        w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (FMT == 5) {
        __m512i h = _mm512_loadu_si512((const void *)(blk + 256));
        for (int c = 0; c < 4; c++) {
            __mmask64 ml = _mm512_test_epi8_mask(h, _mm512_set1_epi8((char)(1 << c)));
            __mmask64 mh = _mm512_test_epi8_mask(h, _mm512_set1_epi8((char)(1 << (4 + c))));
            w[c] = _mm512_or_si512(w[c], _mm512_maskz_mov_epi8(ml, b16));
            w[4 + c] = _mm512_or_si512(w[4 + c], _mm512_maskz_mov_epi8(mh, b16));
        }
    }
}

/* FMT in {4,5,8}, HAS_M, T are compile-time constants at every call site (always_inline). */
static inline __attribute__((always_inline)) void lq_kernel_vnni(const lq_packed *P, int64_t g, const int8_t *qa,
                                                                  const float *da, const float *sa, const int FMT,
                                                                  const int HAS_M, const int T, float *y,
                                                                  int64_t ystride, int nvalid) {
    const int64_t nb = P->nb, K = P->cols, bb = P->blk_bytes;
    const int QB = FMT == 8 ? 512 : FMT == 5 ? 320 : 256;
    __m512 f[LQ_TT];
    for (int t = 0; t < T; t++) f[t] = _mm512_setzero_ps();
    const uint8_t *blk = P->data + g * nb * bb;
    for (int64_t b = 0; b < nb; b++, blk += bb) {
        /* one or two tokens: into L2 (memory-bound; 0.77-0.91 of the time on Zen 4); from 4
         * tokens the arithmetic covers the wait and L1 is better (L2 was 1.12-1.20x) */
        const uint8_t *pf = lq_pf_block(blk, bb, T <= 2);
        __m512i w[8];
        lq_unpack_vnni_pf(blk, FMT, w, pf, bb, T <= 2);
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + QB)));
        const __m512 mv = HAS_M ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + QB + 32))) : dv;
        for (int t = 0; t < T; t++) {
            const int32_t *aw = (const int32_t *)(qa + t * K + b * LQ_QK);
            __m512i acc = _mm512_setzero_si512();
            for (int c = 0; c < 8; c++) acc = _mm512_dpbusd_epi32(acc, w[c], _mm512_set1_epi32(aw[c]));
            if (HAS_M) {
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(dv, _mm512_set1_ps(da[t * nb + b])), f[t]);
                f[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sa[t * nb + b]), f[t]);
            } else { /* integer offset correction: exact */
                f[t] = _mm512_fmadd_ps(_mm512_add_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(sa[t * nb + b])),
                                       _mm512_mul_ps(dv, _mm512_set1_ps(da[t * nb + b])), f[t]);
            }
        }
    }
    const __mmask16 mask = (__mmask16)((1u << nvalid) - 1u);
    for (int t = 0; t < T; t++) {
        if (nvalid == LQ_G) _mm512_storeu_ps(y + t * ystride, f[t]);
        else _mm512_mask_storeu_ps(y + t * ystride, mask, f[t]);
    }
}

#define LQ_T_SWITCH(FMT, HM)                                                                          \
    switch (T) {                                                                                      \
    case 1: lq_kernel_vnni(P, g, qa, da, sa, FMT, HM, 1, y, ys, nv); break;                           \
    case 2: lq_kernel_vnni(P, g, qa, da, sa, FMT, HM, 2, y, ys, nv); break;                           \
    case 3: lq_kernel_vnni(P, g, qa, da, sa, FMT, HM, 3, y, ys, nv); break;                           \
    case 4: lq_kernel_vnni(P, g, qa, da, sa, FMT, HM, 4, y, ys, nv); break;                           \
    case 5: lq_kernel_vnni(P, g, qa, da, sa, FMT, HM, 5, y, ys, nv); break;                           \
    case 6: lq_kernel_vnni(P, g, qa, da, sa, FMT, HM, 6, y, ys, nv); break;                           \
    case 7: lq_kernel_vnni(P, g, qa, da, sa, FMT, HM, 7, y, ys, nv); break;                           \
    default: lq_kernel_vnni(P, g, qa, da, sa, FMT, HM, 8, y, ys, nv); break;                          \
    }

static void lq_group_vnni(const lq_packed *P, int64_t g, const int8_t *qa, const float *da, const float *sa, int T,
                          float *y, int64_t ys, int nv) {
    if (P->has_m) {
        if (P->fmt == LQ_FMT4) { LQ_T_SWITCH(4, 1) }
        else { LQ_T_SWITCH(5, 1) }
        return;
    }
    if (P->fmt == LQ_FMT4) { LQ_T_SWITCH(4, 0) }
    else if (P->fmt == LQ_FMT5) { LQ_T_SWITCH(5, 0) }
    else { LQ_T_SWITCH(8, 0) }
}

#endif

/* ---------------------------------------------------------------- prefill: token tiles */
/* For a matmul of many tokens (prefill) the quantized activations are laid out by tiles of
 * LQ_TT tokens, the tokens in two halves (0-3, 4-7) whose bytes never share a cache line.
 * A tile of nb 32-value blocks (lq_tile_bytes(nb) bytes):
 *     nb records of LQ_REC bytes, block b at tile + b * LQ_REC:
 *         int32 a[2][8][4]   chunk c (4 int8) of token t at a[t / 4][c][t % 4] (LQ_REC_A)
 *     then per half h a scale area of lq_tile_ds_half(nb) bytes, block b's 32 B at b * 32:
 *         float d[4]   the tokens' scales da
 *         s[4]         int32 moff * sum(q) (offset formats) or float s (Q4_1/Q5_1)
 * tile tau at rec + tau * lq_tile_bytes(nb); tokens past n are zero. A decode step quantizes
 * its rows one by one on whichever thread takes each; with each thread's rows a half of every
 * tile (the step's row shares) no line is written by both (8 tokens side by side in every
 * line moved each line between the cores for every row: ~0.5 ms of an 8-sequence SmolLM2
 * step while the two vCPUs sat on different CCDs). Every load of the kernel is at a fixed
 * offset from one of three pointers (the row-major kernel needs a pointer per token and
 * spills), and the T tokens' dot products run as T independent dpbusd chains.
 * Same arithmetic as lq_kernel_vnni, operation for operation (the integer offset term starts
 * the integer accumulator: |acc| < 2^21, so the float sum is exact either way): the same
 * output bits. */
#define LQ_REC 256
/* (the second half's chunks swap places in pairs, c ^ 2: the kernel reads chunk c of both
 * halves together, and two loads of one cycle at the same offset in two lines may fall in the
 * same L1 bank) */
#define LQ_REC_A(c, t) (128 * ((t) >> 2) + 16 * ((c) ^ (((t) >> 2) << 1)) + 4 * ((t) & 3))
static inline int64_t lq_tile_ds_half(int64_t nb) { return (nb * 32 + 63) & ~(int64_t)63; }
static inline int64_t lq_tile_bytes(int64_t nb) { return nb * LQ_REC + 2 * lq_tile_ds_half(nb); }
/* token t's scale and sum of block b in the tile at tile (nb blocks) */
static inline uint8_t *lq_tile_d(uint8_t *tile, int64_t nb, int64_t b, int t) {
    return tile + nb * LQ_REC + (t >> 2) * lq_tile_ds_half(nb) + b * 32 + 4 * (t & 3);
}
#define LQ_TILE_S 16 /* a sum's offset from its scale */

/* an activation row function of simd_activations.h: y = act(g) * u over n values */
typedef void (*lq_act_fn)(const float *g, const float *u, float *y, int n);

/* scratch bytes lq_quant_tile needs for K */
static inline int64_t lq_quant_tile_tmp(int64_t K) {
    return LQ_TT * (((K + 63) & ~(int64_t)63) + 2 * (K / LQ_QK) * 4) + 128;
}

/* Tokens [0, nt) of x (row stride K floats; nt <= LQ_TT) as the tile at rec (lq_tile_bytes(nb)
 * bytes); tmp: lq_quant_tile_tmp(K) bytes of scratch. The tokens' rows are quantized
 * (lq_quant_row_q8), then each block's 8 x 8 dwords transposed into the record. */
static void lq_quant_tile(const float *x, int64_t K, int nt, float moff, void *tmp, uint8_t *rec) {
    const int64_t nb = K / LQ_QK, qs = (K + 63) & ~(int64_t)63;
    int8_t *q = (int8_t *)(((uintptr_t)tmp + 63) & ~(uintptr_t)63);
    float *d = (float *)(q + LQ_TT * qs), *s = d + LQ_TT * nb;
    for (int t = 0; t < LQ_TT; t++) {
        if (t < nt) lq_quant_row_q8(x + t * K, K, q + t * qs, d + t * nb, s + t * nb, moff);
        else {
            memset(q + t * qs, 0, (size_t)K);
            for (int64_t b = 0; b < nb; b++) d[t * nb + b] = s[t * nb + b] = 0.f;
        }
    }
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *r = rec + b * LQ_REC;
#if defined(__AVX2__)
        __m256i v[8], u[8];
        for (int t = 0; t < 8; t++) v[t] = _mm256_loadu_si256((const __m256i *)(q + t * qs + b * LQ_QK));
        for (int t = 0; t < 8; t += 2) {
            u[t] = _mm256_unpacklo_epi32(v[t], v[t + 1]);
            u[t + 1] = _mm256_unpackhi_epi32(v[t], v[t + 1]);
        }
        for (int t = 0; t < 8; t += 4) {
            v[t] = _mm256_unpacklo_epi64(u[t], u[t + 2]);
            v[t + 1] = _mm256_unpackhi_epi64(u[t], u[t + 2]);
            v[t + 2] = _mm256_unpacklo_epi64(u[t + 1], u[t + 3]);
            v[t + 3] = _mm256_unpackhi_epi64(u[t + 1], u[t + 3]);
        }
        /* v[c]: chunk c of tokens 0-3 (low lane) and chunk c + 4 of tokens 0-3 (high lane);
         * v[c + 4]: the same of tokens 4-7 */
        for (int c = 0; c < 4; c++) {
            _mm_storeu_si128((__m128i *)(r + LQ_REC_A(c, 0)), _mm256_castsi256_si128(v[c]));
            _mm_storeu_si128((__m128i *)(r + LQ_REC_A(c + 4, 0)), _mm256_extracti128_si256(v[c], 1));
            _mm_storeu_si128((__m128i *)(r + LQ_REC_A(c, 4)), _mm256_castsi256_si128(v[c + 4]));
            _mm_storeu_si128((__m128i *)(r + LQ_REC_A(c + 4, 4)), _mm256_extracti128_si256(v[c + 4], 1));
        }
#else
        for (int t = 0; t < LQ_TT; t++)
            for (int c = 0; c < 8; c++) memcpy(r + LQ_REC_A(c, t), q + t * qs + b * LQ_QK + 4 * c, 4);
#endif
        for (int t = 0; t < LQ_TT; t++) {
            uint8_t *dt = lq_tile_d(rec, nb, b, t);
            memcpy(dt, &d[t * nb + b], 4);
            if (moff == 1.f) memcpy(dt + LQ_TILE_S, &s[t * nb + b], 4);
            else { const int32_t si = (int32_t)s[t * nb + b]; memcpy(dt + LQ_TILE_S, &si, 4); }
        }
    }
}

/* A block quantized by lq_quant_row_q8 (q: its 32 values, d, s) stored as block b of token t
 * (< LQ_TT) of the tile at rec (nb blocks; lq_quant_tile's layout). */
static inline void lq_tile_put_block(const int8_t *q, float d, float s, float moff, uint8_t *rec, int64_t nb,
                                     int64_t b, int t) {
    uint8_t *r = rec + b * LQ_REC, *dt = lq_tile_d(rec, nb, b, t);
    for (int c = 0; c < 8; c++) memcpy(r + LQ_REC_A(c, t), q + 4 * c, 4);
    memcpy(dt, &d, 4);
    if (moff == 1.f) memcpy(dt + LQ_TILE_S, &s, 4);
    else { const int32_t si = (int32_t)s; memcpy(dt + LQ_TILE_S, &si, 4); }
}

/* Blocks [b0, b0 + m) of a row (x: their m * 32 values) quantized exactly as lq_quant_row_q8
 * quantizes them (each block's values are its own: the same bits whichever blocks go
 * together), written as token t (< LQ_TT) of the tile at rec (nb blocks). A partial tile's
 * missing tokens are left as they are (the kernel stores none of them). */
static inline void lq_quant_blocks_tile(const float *x, int64_t b0, int64_t m, int64_t nb, int t, float moff,
                                        uint8_t *rec) {
    int8_t q[16 * LQ_QK] __attribute__((aligned(64)));
    float d[16], s[16];
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
        const int64_t k = m - i0 < 16 ? m - i0 : 16;
        lq_quant_row_q8(x + i0 * LQ_QK, k * LQ_QK, q, d, s, moff);
        for (int64_t j = 0; j < k; j++) lq_tile_put_block(q + j * LQ_QK, d[j], s[j], moff, rec, nb, b0 + i0 + j, t);
    }
}

/* Row x (K values) as token t of the tile at rec: the fused decode step quantizes its rows one
 * by one, on whichever thread takes each, into the records lq_group_tiles reads. */
static inline void lq_quant_row_tile(const float *x, int64_t K, int t, float moff, uint8_t *rec) {
    lq_quant_blocks_tile(x, 0, K / LQ_QK, K / LQ_QK, t, moff, rec);
}

/* a tile pass's prefetch: bytes [off, off + len) of each block, dist bytes ahead (0: none) */
typedef struct {
    int64_t dist;
    int off, len;
} lq_tile_pf;

/* (0: the first of a step's tiles asks for the whole next group; A/B) */
static int lq_pf_spread = 1;

#ifndef LQ_TILE_PF_DIST
/* how far ahead (bytes) one tile (2-8 tokens: a few sequences' step, a verify) asks for the
 * weights it streams: a block takes such a pass several times a one-token pass's time, yet
 * the streaming kernels' simd_pf_dist (2048) left it waiting (Xeon with AMX, SmolLM2, 600-token
 * contexts, alternated in one process: 2 / 4 / 8 sequences' steps 0.93x / 0.95x /
 * 0.95-0.97x the time at 4096; 6144 no better, 1024 1.06x; one sequence's matvecs at 4096
 * even). Outside the VNNI section: step.pyx's A/B setter names it in every build. */
#define LQ_TILE_PF_DIST 4096
#endif
static int lq_tile_pf_dist = LQ_TILE_PF_DIST;

#if LQ_VNNI
static inline __attribute__((always_inline)) void lq_unpack_vnni(const uint8_t *blk, const int FMT, __m512i *w) {
    lq_unpack_vnni_pf(blk, FMT, w, NULL, 0, 0);
}

/* T tokens (1 to 4), two row groups in lockstep, block by block: stream s is a group of a
 * weight (first block blk; token t's activations at qa + t * K, da / sa + t * nb; outputs
 * at y + t * ys, nv valid), the two of one format and width (groups of one weight, or of
 * two parts of a fused one), each with lq_kernel_vnni's operations in their order (the
 * same output bits).
 * Why: a one-token matvec streams its weights from memory, and one stream of reads with
 * arithmetic between them kept a core at ~0.76 of the bandwidth a plain read loop gets
 * (Xeon with AMX, Q4_1: 12.2 against 16.0 GB/s, the kernel's in-cache rate 56 GB/s: the
 * times added as if nothing overlapped; the software prefetch distance or hint did not
 * change it); two streams far apart (the two halves of a thread's chunk) reach the plain
 * read loop's rate (16.4 GB/s). */
typedef struct {
    const uint8_t *blk;  /* the group's first block */
    const int8_t *qa;
    const float *da, *sa;
    float *y;
    int nv;
} lq_stream;

#define LQ_PAIR_T 4  /* the most tokens of a pair pass (2 x T accumulators stay in registers) */

static inline __attribute__((always_inline)) void lq_kernel_vnni_pair(const lq_stream *st, int64_t nb, int64_t bb,
                                                                       const int FMT, const int HAS_M, const int T,
                                                                       int64_t K, int64_t ys) {
    const int QB = FMT == 8 ? 512 : FMT == 5 ? 320 : 256;
    __m512 f[2][LQ_PAIR_T];
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < T; t++) f[s][t] = _mm512_setzero_ps();
    const uint8_t *blk[2] = {st[0].blk, st[1].blk};
    for (int64_t b = 0; b < nb; b++) {
        for (int s = 0; s < 2; s++) {
            const uint8_t *p = blk[s];
            __m512i w[8];
            lq_unpack_vnni_pf(p, FMT, w, lq_pf_block(p, bb, T <= 2), bb, T <= 2);
            const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + QB)));
            const __m512 mv = HAS_M ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + QB + 32))) : dv;
            for (int t = 0; t < T; t++) {
                const int32_t *aw = (const int32_t *)(st[s].qa + t * K + b * LQ_QK);
                const float da = st[s].da[t * nb + b], sa = st[s].sa[t * nb + b];
                __m512i acc = _mm512_setzero_si512();
                for (int c = 0; c < 8; c++) acc = _mm512_dpbusd_epi32(acc, w[c], _mm512_set1_epi32(aw[c]));
                if (HAS_M) {
                    f[s][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(dv, _mm512_set1_ps(da)), f[s][t]);
                    f[s][t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sa), f[s][t]);
                } else {
                    f[s][t] = _mm512_fmadd_ps(_mm512_add_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(sa)),
                                              _mm512_mul_ps(dv, _mm512_set1_ps(da)), f[s][t]);
                }
            }
            blk[s] = p + bb;
        }
    }
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < T; t++) {
            if (st[s].nv == LQ_G) _mm512_storeu_ps(st[s].y + t * ys, f[s][t]);
            else _mm512_mask_storeu_ps(st[s].y + t * ys, (__mmask16)((1u << st[s].nv) - 1u), f[s][t]);
        }
}

/* The nb blocks of group g as VNNI chunks (lq_unpack_vnni's w[0..7], 512 B a block) into wu:
 * a prefill work item unpacks its group once for all its token tiles. */
static inline __attribute__((always_inline)) void lq_unpack_group(const lq_packed *P, int64_t g, const int FMT,
                                                                   uint8_t *wu) {
    const int64_t nb = P->nb, bb = P->blk_bytes;
    const uint8_t *blk = P->data + g * nb * bb;
    for (int64_t b = 0; b < nb; b++, blk += bb) {
        __m512i w[8];
        lq_unpack_vnni(blk, FMT, w);
        for (int c = 0; c < 8; c++) _mm512_store_si512((void *)(wu + b * 512 + 64 * c), w[c]);
    }
}

/* group g x the first NT tokens of one tile (records rec): y[t * ys + i] for t < nst (<= NT
 * stored), i < nv. wu: the group unpacked (lq_unpack_group), or NULL (unpack each block
 * here; Q8_0 needs none). pf: what to prefetch ahead of each block (lq_tile_pfd). */
static inline __attribute__((always_inline)) void lq_kernel_vnni_tile_nt(const lq_packed *P, int64_t g, const uint8_t *rec,
                                                                          const int FMT, const int HAS_M, float *y,
                                                                          int64_t ys, int nv, const int NT, int nst,
                                                                          const uint8_t *wu, lq_tile_pf pf) {
    const int64_t nb = P->nb, bb = P->blk_bytes;
    const int QB = FMT == 8 ? 512 : FMT == 5 ? 320 : 256;
    __m512 f[LQ_TT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) f[t] = _mm512_setzero_ps();
    const uint8_t *blk = P->data + g * nb * bb;
    const uint8_t *ds0 = rec + nb * LQ_REC, *ds1 = ds0 + lq_tile_ds_half(nb);
#define LQ_DS(t) ((const void *)(((t) < 4 ? ds0 : ds1) + 4 * ((t) & 3)))
    for (int64_t b = 0; b < nb; b++, blk += bb, rec += LQ_REC, ds0 += 32, ds1 += 32) {
        __m512i w[8];
        if (FMT != 8 && wu) {
            for (int c = 0; c < 8; c++) w[c] = _mm512_load_si512((const void *)(wu + b * 512 + 64 * c));
        } else {
            /* the weights stream from memory (a decode step's few tiles, or Q8_0): the
             * hardware prefetcher alone leaves a core waiting, as in the streaming kernels */
            simd_prefetch_at(blk + pf.off, pf.dist, pf.len, 0);
            lq_unpack_vnni(blk, FMT, w);
        }
        __m512i acc[LQ_TT];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            acc[t] = HAS_M ? _mm512_setzero_si512() : _mm512_set1_epi32(*(const int32_t *)((const uint8_t *)LQ_DS(t) + LQ_TILE_S));
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                acc[t] = _mm512_dpbusd_epi32(acc[t], w[c], _mm512_set1_epi32(*(const int32_t *)(rec + LQ_REC_A(c, t))));
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + QB)));
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]),
                                   _mm512_mul_ps(dv, _mm512_set1_ps(*(const float *)LQ_DS(t))), f[t]);
        if (HAS_M) {
            const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + QB + 32)));
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) f[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(*(const float *)((const uint8_t *)LQ_DS(t) + LQ_TILE_S)), f[t]);
        }
    }
#undef LQ_DS
    const __mmask16 mask = (__mmask16)((1u << nv) - 1u);
    for (int t = 0; t < NT && t < nst; t++) _mm512_mask_storeu_ps(y + t * ys, mask, f[t]);
}

#ifndef LQ_UNPACK_MIN
/* tokens above which a group's weights are unpacked once into a buffer for all its tiles
 * (a prefill); below, each tile unpacks them as it reads them. The unpack pass reads the
 * group from memory with no arithmetic to hide the wait behind: it pays over many tiles
 * (a prompt), not over the two to four of a decode step or a verify (16 rows of SmolLM2:
 * 13.7 ms unpacked, 10.3 inline, 1 thread) */
#define LQ_UNPACK_MIN 64
#endif

/* One tile of nt <= LQ_TT tokens: a partial tile (the last of a step's few rows) computes
 * only its tokens, rounded up to 1, 2, 4 or 8 (each token's sums are its own: same bits). */
static inline __attribute__((always_inline)) void lq_kernel_vnni_tile(const lq_packed *P, int64_t g, const uint8_t *rec,
                                                                       const int FMT, const int HAS_M, float *y,
                                                                       int64_t ys, int nv, int nt, const uint8_t *wu,
                                                                       lq_tile_pf pf) {
    if (nt == 1) lq_kernel_vnni_tile_nt(P, g, rec, FMT, HAS_M, y, ys, nv, 1, nt, wu, pf);
    else if (nt == 2) lq_kernel_vnni_tile_nt(P, g, rec, FMT, HAS_M, y, ys, nv, 2, nt, wu, pf);
    else if (nt <= 4) lq_kernel_vnni_tile_nt(P, g, rec, FMT, HAS_M, y, ys, nv, 4, nt, wu, pf);
    else lq_kernel_vnni_tile_nt(P, g, rec, FMT, HAS_M, y, ys, nv, LQ_TT, nt, wu, pf);
}

/* what a tile pass over group g prefetches (lq_kernel_vnni_tile's pf): one tile (a step's
 * few rows) streams its group from memory, lq_tile_pf_dist ahead; several tiles read the group
 * from cache after the first, whose blocks take only a few cycles more than their loads, so
 * they ask for the next group (the next work item, one group further in memory) while they
 * run (32 tokens from memory at one thread: the Q8_0 head 0.7x, Q4_1 0.8x the time), each
 * tile of a step (up to 8) a slice of every block: all of it from the first tile filled a
 * core's miss buffers and held its arithmetic (an eighth of a 32-sequence step's matmul
 * time sat on those prefetches). simd_pf_dist <= 0 turns both off. */
static inline lq_tile_pf lq_tile_pfd(const lq_packed *P, int64_t n, int64_t t0) {
    lq_tile_pf pf = {simd_pf_dist > 0 ? lq_tile_pf_dist : 0, 0, (int)P->blk_bytes};
    if (n <= LQ_TT || simd_pf_dist <= 0) return pf;
    const int64_t nti = (n + LQ_TT - 1) / LQ_TT;
    pf.dist = P->nb * P->blk_bytes;
    if (!lq_pf_spread || nti > 8) {
        if (t0) pf.dist = 0;
        return pf;
    }
    const int sl = (int)((P->blk_bytes + nti - 1) / nti);
    pf.off = (int)(t0 / LQ_TT) * sl;
    pf.len = pf.off < P->blk_bytes ? sl : 0;
    return pf;
}

static inline __attribute__((always_inline)) void lq_group_tiles_fmt(const lq_packed *P, int64_t g, const uint8_t *rec,
                                                                      int64_t n, float *y, int64_t ys, int nv,
                                                                      const int FMT, const int HAS_M) {
    const int64_t tile = lq_tile_bytes(P->nb);
    uint8_t *wu = FMT != 8 && n > LQ_UNPACK_MIN ? lq_unpack_buffer((size_t)P->nb * 512) : NULL;
    if (wu) lq_unpack_group(P, g, FMT, wu);
    for (int64_t t0 = 0; t0 < n; t0 += LQ_TT, rec += tile) {
        const int nt = (int)(n - t0 < LQ_TT ? n - t0 : LQ_TT);
        lq_kernel_vnni_tile(P, g, rec, FMT, HAS_M, y + t0 * ys, ys, nv, nt, wu, lq_tile_pfd(P, n, t0));
    }
}
#endif

#if LQ_VNNI
/* Gated FFN (prefill): gate group g and up group g + F/16 of a weight whose rows are
 * [gate (F rows); up (F rows)], F % 16 == 0, for each tile, then out = act(gate) * up with the
 * activation row function (simd_activations.h: the bits act_rows gives), so the (n, 2F)
 * gate/up product never goes to memory. */
static inline __attribute__((always_inline)) void lq_group_tiles_glu_fmt(
        const lq_packed *P, int64_t g, const uint8_t *rec, int64_t n, float *out, int64_t ldo, int64_t F,
        lq_act_fn act, const int FMT, const int HAS_M) {
    __attribute__((aligned(64))) float buf[2 * LQ_TT * LQ_G];
    const int64_t tile = lq_tile_bytes(P->nb), gu = g + F / LQ_G;
    uint8_t *wu = FMT != 8 && n > LQ_UNPACK_MIN ? lq_unpack_buffer((size_t)P->nb * 1024) : NULL;
    if (wu) {
        lq_unpack_group(P, g, FMT, wu);
        lq_unpack_group(P, gu, FMT, wu + P->nb * 512);
    }
    for (int64_t t0 = 0; t0 < n; t0 += LQ_TT, rec += tile) {
        const int nt = (int)(n - t0 < LQ_TT ? n - t0 : LQ_TT);
        const lq_tile_pf pfd = lq_tile_pfd(P, n, t0);
        lq_kernel_vnni_tile(P, g, rec, FMT, HAS_M, buf, LQ_G, LQ_G, nt, wu, pfd);
        lq_kernel_vnni_tile(P, gu, rec, FMT, HAS_M, buf + LQ_TT * LQ_G, LQ_G, LQ_G, nt, wu ? wu + P->nb * 512 : NULL,
                            pfd);
        /* the whole tile in one call, in place (a call per token was one 16-value vector whose
         * exp and divisions ran back to back: latency-bound, 6% of gemma-3-270m's prefill) */
        act(buf, buf + LQ_TT * LQ_G, buf, nt * LQ_G);
        for (int t = 0; t < nt; t++)
            _mm512_storeu_ps(out + (t0 + t) * ldo + g * LQ_G, _mm512_load_ps(buf + t * LQ_G));
    }
}
#endif

static void lq_group_tiles_glu(const lq_packed *P, int64_t g, const uint8_t *rec, int64_t n, float *out, int64_t ldo,
                               int64_t F, lq_act_fn act) {
#if LQ_VNNI
    if (P->has_m) {
        if (P->fmt == LQ_FMT4) lq_group_tiles_glu_fmt(P, g, rec, n, out, ldo, F, act, 4, 1);
        else lq_group_tiles_glu_fmt(P, g, rec, n, out, ldo, F, act, 5, 1);
    } else if (P->fmt == LQ_FMT4) lq_group_tiles_glu_fmt(P, g, rec, n, out, ldo, F, act, 4, 0);
    else if (P->fmt == LQ_FMT5) lq_group_tiles_glu_fmt(P, g, rec, n, out, ldo, F, act, 5, 0);
    else lq_group_tiles_glu_fmt(P, g, rec, n, out, ldo, F, act, 8, 0);
#else
    (void)P; (void)g; (void)rec; (void)n; (void)out; (void)ldo; (void)F; (void)act;
#endif
}

/* Whether lq_group_tiles serves a matmul of n tokens (the quant formats on AVX-512 VNNI
 * builds; AMX machines keep their tile path) */
static int lq_amx_on_get(void);
static inline int lq_tiles_ok(const lq_packed *P, int64_t n, int portable) {
    return LQ_VNNI && !portable && !lq_amx_on_get() && n >= 2 * LQ_TT
        && (P->fmt == LQ_FMT4 || P->fmt == LQ_FMT5 || P->fmt == LQ_FMT8);
}

#ifndef LQ_STEP_TILES_MIN
/* tokens from which the fused decode step's matmuls read tile records (lq_quant_row_tile)
 * instead of row-major activations (the row-major kernel keeps a pointer per token and
 * spills: an 8-sequence SmolLM2 step's matmuls 5.8 -> 4.6 ms at 1 thread; on a Zen, 4 tokens
 * in a tile of 8 lost: 3.5 -> 4.1 ms; on a Xeon they won, from 2 tokens: step.pyx sets
 * lq_step_tiles_min by the CPU) */
#define LQ_STEP_TILES_MIN 8
#endif
static int lq_step_tiles_min = LQ_STEP_TILES_MIN;
static inline int lq_step_tiles_ok(const lq_packed *P, int64_t n) {
    return LQ_VNNI && !lq_amx_on_get() && n >= lq_step_tiles_min
        && (P->fmt == LQ_FMT4 || P->fmt == LQ_FMT5 || P->fmt == LQ_FMT8);
}

/* One work item of a prefill matmul: output row group g for the n tokens of the tile records
 * rec (lq_quant_tile); y at the first token, row stride R. */
static void lq_group_tiles(const lq_packed *P, int64_t g, const uint8_t *rec, int64_t n, float *y, int64_t R) {
#if LQ_VNNI
    const int nv = (int)(P->rows - g * LQ_G < LQ_G ? P->rows - g * LQ_G : LQ_G);
    float *yo = y + g * LQ_G;
    if (P->has_m) {
        if (P->fmt == LQ_FMT4) lq_group_tiles_fmt(P, g, rec, n, yo, R, nv, 4, 1);
        else lq_group_tiles_fmt(P, g, rec, n, yo, R, nv, 5, 1);
    } else if (P->fmt == LQ_FMT4) lq_group_tiles_fmt(P, g, rec, n, yo, R, nv, 4, 0);
    else if (P->fmt == LQ_FMT5) lq_group_tiles_fmt(P, g, rec, n, yo, R, nv, 5, 0);
    else lq_group_tiles_fmt(P, g, rec, n, yo, R, nv, 8, 0);
#else
    (void)P; (void)g; (void)rec; (void)n; (void)y; (void)R;
#endif
}


/* ---------------------------------------------------------------- AMX (int8 tiles) */
/* Builds for a CPU with AMX-INT8 (-march=native there) add a tile kernel for 16-token
 * tiles: per 32-weight block one TDPBSUD computes the 16 tokens x 16 rows integer dots
 * (A: 16 activation rows of 32 int8, stride K; B: the block's 8 VNNI chunks, which is what
 * the repacked layout already is for Q8_0 and what the nibble formats unpack to), and the
 * float accumulation is the VNNI kernel's, operation for operation: outputs are bit-identical
 * to the VNNI path, so a token's result never depends on which path its tile took. Linux
 * grants the tile state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM);
 * lq_amx_init asks once, at module import, and the VNNI kernel serves when it is refused,
 * the CPU lacks AMX (cpuid) or LLMCORE_NO_AMX=1. */
#if LQ_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define LQ_AMX_BUILT 1

static int lq_amx_on = 0;

/* enable: 0 leaves AMX off. Returns whether the tile kernel is in use. */
static int lq_amx_init(int enable) {
    lq_amx_on = enable && simd_amx_grant(25); /* AMX-INT8 */
    return lq_amx_on;
}

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} lq_tilecfg;

/* tiles 0-3: C (16 tokens x 16 int32), 4/5: A (16 x 32 int8), 6/7: B (8 x 64 bytes) */
static inline void lq_amx_config(void) {
    lq_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 4; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    for (int i = 4; i < 6; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 32; }
    for (int i = 6; i < 8; i++) { cfg.rows[i] = 8; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
}

/* the block's weights as 8 VNNI chunks (the VNNI kernel's w[0..7]) */
static inline __attribute__((always_inline)) const uint8_t *lq_amx_unpack(const uint8_t *blk, int FMT, uint8_t *wb) {
    if (FMT == 8) return blk;
    const __m512i m4 = _mm512_set1_epi8(0x0f), b16 = _mm512_set1_epi8(0x10);
    __m512i h = FMT == 5 ? _mm512_loadu_si512((const void *)(blk + 256)) : m4;
    for (int c = 0; c < 4; c++) {
        __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * c));
        __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (FMT == 5) {
            __mmask64 ml = _mm512_test_epi8_mask(h, _mm512_set1_epi8((char)(1 << c)));
            __mmask64 mh = _mm512_test_epi8_mask(h, _mm512_set1_epi8((char)(1 << (4 + c))));
            lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(ml, b16));
            hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(mh, b16));
        }
        _mm512_store_si512((void *)(wb + 64 * c), lo);
        _mm512_store_si512((void *)(wb + 256 + 64 * c), hi);
    }
    return wb;
}

/* 16 tokens' float update from one block's integer dots cb (16 x 16 int32) */
static inline __attribute__((always_inline)) void lq_amx_accumulate(__m512 *f, const int32_t *cb, __m512 dv, __m512 mv,
                                                                   const float *da, const float *sa, int64_t nb,
                                                                   int64_t b, int HAS_M) {
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++) {
        const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cb + 16 * t)));
        if (HAS_M) {
            f[t] = _mm512_fmadd_ps(s, _mm512_mul_ps(dv, _mm512_set1_ps(da[t * nb + b])), f[t]);
            f[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sa[t * nb + b]), f[t]);
        } else {
            f[t] = _mm512_fmadd_ps(_mm512_add_ps(s, _mm512_set1_ps(sa[t * nb + b])),
                                   _mm512_mul_ps(dv, _mm512_set1_ps(da[t * nb + b])), f[t]);
        }
    }
}

/* Group g x 16 tokens (qa, da, sa, y at the first token; y row stride ys). W: the group's
 * blocks as VNNI chunks, block b at W + b * ws (the packed blocks themselves for Q8_0, an
 * unpacked copy for the nibble formats). Blocks go in chunks of LQ_AMX_CHUNK: first every
 * block's tile dot (four at a time into four C tiles, results to cb), then the float sums
 * from cb (in L1), so the tile unit does not wait on float work; the 16 tokens' sums are
 * unrolled so their accumulators stay in registers (a loop kept them on the stack: 1.1-1.25x
 * the time in L2). */
#define LQ_AMX_CHUNK 16
static inline __attribute__((always_inline)) void lq_kernel_amx(const lq_packed *P, int64_t g, const uint8_t *W,
                                                                int64_t ws, const int8_t *qa, const float *da,
                                                                const float *sa, const int HAS_M, float *y,
                                                                int64_t ys, int nv) {
    const int64_t nb = P->nb, K = P->cols, bb = P->blk_bytes, QB = P->qbytes;
    __attribute__((aligned(64))) int32_t cb[LQ_AMX_CHUNK][256];
    __m512 f[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++) f[t] = _mm512_setzero_ps();
    const uint8_t *g0 = P->data + g * nb * bb;
    for (int64_t b0 = 0; b0 < nb; b0 += LQ_AMX_CHUNK) {
        const int nc = (int)(nb - b0 < LQ_AMX_CHUNK ? nb - b0 : LQ_AMX_CHUNK);
        int j = 0;
        /* four blocks' products in flight (four C tiles, two A/B pairs) before their stores:
         * a store waits for its product, so two in flight left the tile unit idle */
        for (; j + 4 <= nc; j += 4) {
            _tile_zero(0);
            _tile_loadd(4, qa + (b0 + j) * LQ_QK, K);
            _tile_loadd(6, W + (b0 + j) * ws, 64);
            _tile_dpbsud(0, 4, 6);
            _tile_zero(1);
            _tile_loadd(5, qa + (b0 + j + 1) * LQ_QK, K);
            _tile_loadd(7, W + (b0 + j + 1) * ws, 64);
            _tile_dpbsud(1, 5, 7);
            _tile_zero(2);
            _tile_loadd(4, qa + (b0 + j + 2) * LQ_QK, K);
            _tile_loadd(6, W + (b0 + j + 2) * ws, 64);
            _tile_dpbsud(2, 4, 6);
            _tile_zero(3);
            _tile_loadd(5, qa + (b0 + j + 3) * LQ_QK, K);
            _tile_loadd(7, W + (b0 + j + 3) * ws, 64);
            _tile_dpbsud(3, 5, 7);
            _tile_stored(0, cb[j], 64);
            _tile_stored(1, cb[j + 1], 64);
            _tile_stored(2, cb[j + 2], 64);
            _tile_stored(3, cb[j + 3], 64);
        }
        for (; j < nc; j++) {
            _tile_zero(0);
            _tile_loadd(4, qa + (b0 + j) * LQ_QK, K);
            _tile_loadd(6, W + (b0 + j) * ws, 64);
            _tile_dpbsud(0, 4, 6);
            _tile_stored(0, cb[j], 64);
        }
        for (j = 0; j < nc; j++) {
            const uint8_t *bk = g0 + (b0 + j) * bb;
            const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(bk + QB)));
            const __m512 mv = HAS_M ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(bk + QB + 32))) : dv;
            lq_amx_accumulate(f, cb[j], dv, mv, da, sa, nb, b0 + j, HAS_M);
        }
    }
    const __mmask16 mask = (__mmask16)((1u << nv) - 1u);
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++) {
        if (nv == LQ_G) _mm512_storeu_ps(y + t * ys, f[t]);
        else _mm512_mask_storeu_ps(y + t * ys, mask, f[t]);
    }
}

/* a thread's buffer for one group's unpacked blocks (not lq_scratch: that one holds the
 * calling thread's activations) */
static __thread uint8_t *lq_amx_wbuf = NULL;
static __thread size_t lq_amx_wcap = 0;

/* Row group g for the whole 16-token tiles of n tokens (qa, da, sa, y at the first token, y
 * row stride ys). Returns the number of tokens done (a multiple of 16; 0 when the unpack
 * buffer cannot be had). */
static int64_t lq_group_amx(const lq_packed *P, int64_t g, const int8_t *qa, const float *da, const float *sa,
                            int64_t n, float *y, int64_t ys, int nv) {
    const int64_t nb = P->nb, K = P->cols, bb = P->blk_bytes;
    const uint8_t *W = P->data + g * nb * bb;
    int64_t ws = bb;
    if (P->fmt != LQ_FMT8) { /* unpack the group once for all its token tiles */
        const size_t need = (size_t)nb * 512;
        if (need > lq_amx_wcap) {
            free(lq_amx_wbuf);
            lq_amx_wbuf = (uint8_t *)aligned_alloc(64, need);
            lq_amx_wcap = lq_amx_wbuf ? need : 0;
            if (!lq_amx_wbuf) return 0;
        }
        for (int64_t b = 0; b < nb; b++) {
            if (P->fmt == LQ_FMT5) lq_amx_unpack(W + b * bb, 5, lq_amx_wbuf + b * 512);
            else lq_amx_unpack(W + b * bb, 4, lq_amx_wbuf + b * 512);
        }
        W = lq_amx_wbuf;
        ws = 512;
    }
    lq_amx_config();
    int64_t t0 = 0;
    for (; t0 + 16 <= n; t0 += 16) {
        if (P->has_m) lq_kernel_amx(P, g, W, ws, qa + t0 * K, da + t0 * nb, sa + t0 * nb, 1, y + t0 * ys, ys, nv);
        else lq_kernel_amx(P, g, W, ws, qa + t0 * K, da + t0 * nb, sa + t0 * nb, 0, y + t0 * ys, ys, nv);
    }
    _tile_release();
    return t0;
}
#else
#define LQ_AMX_BUILT 0
static int lq_amx_init(int enable) { (void)enable; return 0; }
#endif
static int lq_amx_on_get(void) {
#if LQ_AMX_BUILT
    return lq_amx_on;
#else
    return 0;
#endif
}

/* ---------------------------------------------------------------- AMX-BF16 (prefill) */
/* Matmuls of ab_min_tokens tokens or more on a CPU with AMX-BF16: each work item dequantizes
 * one or two row groups to bf16 B tiles and runs every token tile on them with f32 sums over
 * the whole row (simd_amx_bf16.h: why, and what it does to the bits). */
#include "simd_amx_bf16.h"
#if AB_BUILT && LQ_VNNI
/* group g's blocks as bf16 B tiles (block b = step b at wb + b * 512): d * (u + moff), or
 * d * u + m for Q4_1 / Q5_1, from the unpacked VNNI chunks */
static inline __attribute__((always_inline)) void lq_ab_dequant_fmt(const lq_packed *P, int64_t g, uint16_t *wb,
                                                                      const int FMT, const int HAS_M) {
    const int64_t nb = P->nb, bb = P->blk_bytes, QB = P->qbytes;
    const uint8_t *blk = P->data + g * nb * bb;
    const __m512 moff = _mm512_set1_ps(P->moff);
    for (int64_t b = 0; b < nb; b++, blk += bb) {
        __m512i w[8];
        lq_unpack_vnni(blk, FMT, w);
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + QB)));
        const __m512 ov = HAS_M ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + QB + 32)))
                                : _mm512_mul_ps(dv, moff);
        for (int J = 0; J < 8; J++) ab_chunk_to_step(w[J], J, dv, ov, wb + b * 512);
    }
}

static void lq_ab_dequant(const lq_packed *P, int64_t g, uint16_t *wb) {
    if (P->has_m) {
        if (P->fmt == LQ_FMT4) lq_ab_dequant_fmt(P, g, wb, 4, 1);
        else lq_ab_dequant_fmt(P, g, wb, 5, 1);
    } else if (P->fmt == LQ_FMT4) lq_ab_dequant_fmt(P, g, wb, 4, 0);
    else if (P->fmt == LQ_FMT5) lq_ab_dequant_fmt(P, g, wb, 5, 0);
    else lq_ab_dequant_fmt(P, g, wb, 8, 0);
}

static inline int lq_ab_ok(const lq_packed *P, int64_t n) { return P->fmt >= LQ_FMT4 && P->nb > 0 && ab_use(n); }

/* Row groups g0 .. g0 + ng - 1 (ng 1 or 2) x the n tokens of the activation tiles xb: y (row
 * stride R) at the groups' columns. Returns 0 when the weight buffer cannot be had. */
static int lq_ab_groups(const lq_packed *P, int64_t g0, int ng, const uint16_t *xb, int64_t n, float *y, int64_t R) {
    const int64_t nb = P->nb;
    uint16_t *wb = ab_weight_buffer((size_t)nb * 2048);
    if (!wb) return 0;
    for (int j = 0; j < ng; j++) lq_ab_dequant(P, g0 + j, wb + j * nb * 512);
    const int nv0 = (int)(P->rows - g0 * LQ_G < LQ_G ? P->rows - g0 * LQ_G : LQ_G);
    const int nv1 = ng > 1 ? (int)(P->rows - (g0 + 1) * LQ_G < LQ_G ? P->rows - (g0 + 1) * LQ_G : LQ_G) : 0;
    ab_config();
    ab_gemm(xb, n, nb, wb, nv0, y + g0 * LQ_G, ng > 1 ? wb + nb * 512 : NULL, nv1, y + (g0 + 1) * LQ_G, R);
    _tile_release();
    return 1;
}

/* A gated FFN's gate group g and up group g + F/16 (F % 16 == 0): out = act(gate) * up */
static int lq_ab_glu(const lq_packed *P, int64_t g, const uint16_t *xb, int64_t n, float *out, int64_t ldo, int64_t F,
                     lq_act_fn act) {
    const int64_t nb = P->nb;
    uint16_t *wb = ab_weight_buffer((size_t)nb * 2048);
    if (!wb) return 0;
    lq_ab_dequant(P, g, wb);
    lq_ab_dequant(P, g + F / LQ_G, wb + nb * 512);
    ab_config();
    ab_gemm_glu(xb, n, nb, wb, wb + nb * 512, out + g * LQ_G, ldo, act);
    _tile_release();
    return 1;
}
#else
static inline int lq_ab_ok(const lq_packed *P, int64_t n) { (void)P; (void)n; return 0; }
static int lq_ab_groups(const lq_packed *P, int64_t g0, int ng, const uint16_t *xb, int64_t n, float *y, int64_t R) {
    (void)P; (void)g0; (void)ng; (void)xb; (void)n; (void)y; (void)R;
    return 0;
}
static int lq_ab_glu(const lq_packed *P, int64_t g, const uint16_t *xb, int64_t n, float *out, int64_t ldo, int64_t F,
                     lq_act_fn act) {
    (void)P; (void)g; (void)xb; (void)n; (void)out; (void)ldo; (void)F; (void)act;
    return 0;
}
#endif

#if !LQ_VNNI && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LQ_AVX2 1
/* Same packed layout, 8 rows per 256-bit half; maddubs+madd instead of vpdpbusd. Each
 * half-block of weights is unpacked once for all T tokens of the call (the tokens' float
 * accumulators stay in L1), and the int16 pair sums of several chunks are added before one
 * madd where they cannot overflow (Q4: 8 x 3810, Q5: 4 x 7874 < 32767). FMT8 uses the signed
 * form (|q| * sign(a, q)), a madd per chunk. Integer sums are exact in any order and each
 * token's float updates are the same fma chain over the blocks, so the outputs do not depend
 * on T. */
static inline __m256i lq_dot_u8s8(__m256i u, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}
/* a token's nv (<= 16) outputs of a group from two 8-lane sums: a whole group as two stores
 * (the element loop became a libc memmove call per token and group, ~2% of a prefill) */
static inline __attribute__((always_inline)) void lq_store_group8x2(float *y, __m256 a, __m256 b, int nv) {
    if (nv == LQ_G) {
        _mm256_storeu_ps(y, a);
        _mm256_storeu_ps(y + 8, b);
        return;
    }
    float tmp[LQ_G];
    _mm256_storeu_ps(tmp, a);
    _mm256_storeu_ps(tmp + 8, b);
    for (int i = 0; i < nv; i++) y[i] = tmp[i];
}

static inline __attribute__((always_inline)) void lq_kernel_avx2_fmt(const lq_packed *P, int64_t g, const int8_t *qa,
                                                                     const float *da, const float *sa, int T, float *y,
                                                                     int64_t ys, int nv, const int FMT, const int HAS_M) {
    const int64_t nb = P->nb, K = P->cols, bb = P->blk_bytes, QB = P->qbytes;
    const __m256i m4 = _mm256_set1_epi8(0x0f), b16 = _mm256_set1_epi8(0x10), x80 = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[LQ_TT][2];
    for (int t = 0; t < T; t++) f[t][0] = f[t][1] = _mm256_setzero_ps();
    const uint8_t *blk = P->data + g * nb * bb;
    for (int64_t b = 0; b < nb; b++, blk += bb) {
        /* the block simd_pf_dist ahead, a part with each chunk of the first half (lq_pf_mode;
         * this CPU's AVX2 build, one thread, one token from memory: Q5_0 / Q8_0 / Q4_0 / Q4_1
         * 8.9 / 12.6 / 9.8 / 10.5 GB/s at once, 11.2 / 15.3 / 13.0 / 12.4 in parts into L2) */
        const uint8_t *pf = lq_pf_block(blk, bb, 0);
        for (int h = 0; h < 2; h++) {
            __m256i w[8];
            if (FMT == LQ_FMT8) {
                for (int c = 0; c < 8; c++) {
                    if (pf && h == 0) lq_pf_part(pf, bb, c, 8, T <= 2);
                    w[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32 * h)), x80);
                }
            } else {
                const __m256i hb = FMT == LQ_FMT5 ? _mm256_loadu_si256((const __m256i *)(blk + 256 + 32 * h)) : m4;
                for (int c = 0; c < 4; c++) {
                    if (pf && h == 0) lq_pf_part(pf, bb, c, 4, T <= 2);
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32 * h));
                    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (FMT == LQ_FMT5) {
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4 - c), b16));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi16(hb, c), b16));
                    }
                    w[c] = lo;
                    w[4 + c] = hi;
                }
            }
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB + 16 * h)));
            const __m256 mv = HAS_M ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB + 32 + 16 * h)))
                                    : _mm256_setzero_ps();
            __m256i wa[8];
            if (FMT == LQ_FMT8)
                for (int c = 0; c < 8; c++) wa[c] = _mm256_abs_epi8(w[c]);
            for (int t = 0; t < T; t++) {
                const int32_t *aw = (const int32_t *)(qa + t * K + b * LQ_QK);
                __m256i acc;
                if (FMT == LQ_FMT8) {
                    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
                    for (int c = 0; c < 8; c += 2) {
                        a0 = _mm256_add_epi32(a0, lq_dot_u8s8(wa[c], _mm256_sign_epi8(_mm256_set1_epi32(aw[c]), w[c])));
                        a1 = _mm256_add_epi32(a1, lq_dot_u8s8(wa[c + 1], _mm256_sign_epi8(_mm256_set1_epi32(aw[c + 1]), w[c + 1])));
                    }
                    acc = _mm256_add_epi32(a0, a1);
                } else {
                    /* lo chunks c with a[4c..], hi chunks with a[16 + 4c..] */
                    __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], _mm256_set1_epi32(aw[0])),
                                                  _mm256_maddubs_epi16(w[4], _mm256_set1_epi32(aw[4])));
                    __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(w[1], _mm256_set1_epi32(aw[1])),
                                                  _mm256_maddubs_epi16(w[5], _mm256_set1_epi32(aw[5])));
                    s0 = _mm256_add_epi16(s0, _mm256_add_epi16(_mm256_maddubs_epi16(w[2], _mm256_set1_epi32(aw[2])),
                                                               _mm256_maddubs_epi16(w[6], _mm256_set1_epi32(aw[6]))));
                    s1 = _mm256_add_epi16(s1, _mm256_add_epi16(_mm256_maddubs_epi16(w[3], _mm256_set1_epi32(aw[3])),
                                                               _mm256_maddubs_epi16(w[7], _mm256_set1_epi32(aw[7]))));
                    if (FMT == LQ_FMT4)
                        acc = _mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones);
                    else
                        acc = _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones));
                }
                const __m256 dat = _mm256_set1_ps(da[t * nb + b]), sat = _mm256_set1_ps(sa[t * nb + b]);
                if (HAS_M) {
                    f[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dv, dat), f[t][h]);
                    f[t][h] = _mm256_fmadd_ps(mv, sat, f[t][h]);
                } else if (FMT == LQ_FMT8) {
                    f[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dv, dat), f[t][h]);
                } else {
                    f[t][h] = _mm256_fmadd_ps(_mm256_add_ps(_mm256_cvtepi32_ps(acc), sat), _mm256_mul_ps(dv, dat), f[t][h]);
                }
            }
        }
    }
    for (int t = 0; t < T; t++) {
        lq_store_group8x2(y + t * ys, f[t][0], f[t][1], nv);
    }
}

/* An even number T (2..LQ_TT) of tokens, any format: per block, the tokens two at a time
 * against both halves (16 rows) at once. Each broadcast of 4 activation bytes then feeds two
 * maddubs (one a half) and each unpacked weight vector two (one a token), and the four
 * (token, half) sums stay in registers (the one-token-at-a-time loop above keeps 8 weight
 * vectors live, pays a broadcast per maddubs, and its per-token chain through memory left
 * the core waiting: this is 11-16% faster at 8 tokens). A block is read from memory once,
 * by the first pair, and from L1 by the others, so all the tokens' work on it hides the next
 * blocks' loads, as in the one-token loop (passes over the whole group per pair were no
 * faster from memory). The integer sums are exact and the float updates the same
 * expressions in the same block order, so the outputs are lq_kernel_avx2_fmt's bit for bit.
 * The asm barriers keep gcc from reassociating the int16 sums into all the products first
 * (spilled to the stack). */
static inline __attribute__((always_inline)) void lq_kernel_avx2_pairs(const lq_packed *P, int64_t g, const int8_t *qa,
                                                                       const float *da, const float *sa, int T, float *y,
                                                                       int64_t ys, int nv, const int FMT, const int HAS_M) {
    const int64_t nb = P->nb, K = P->cols, bb = P->blk_bytes, QB = P->qbytes;
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), x80 = _mm256_set1_epi8((char)0x80);
    const __m256i b16 = _mm256_set1_epi8(0x10);
    __m256 f[LQ_TT][2];  /* f[token][half], in L1 */
    for (int t = 0; t < T; t++) f[t][0] = f[t][1] = _mm256_setzero_ps();
    const uint8_t *blk = P->data + g * nb * bb;
    for (int64_t b = 0; b < nb; b++, blk += bb) {
        simd_prefetch_range(blk, (int)bb);
        const __m256 dv0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB)));
        const __m256 dv1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB + 16)));
        if (FMT == LQ_FMT8 && T % 4 == 0) {
            /* Q8_0, four tokens a pass: the weights' sign fix-up (xor, abs) once for four
             * tokens, eight int32 sums in registers (the pair loop below does the same for
             * two; one helper for both measured 3-5% slower at 6 and 8 tokens) */
            for (int t = 0; t < T; t += 4) {
                const int32_t *a[4];
                for (int k = 0; k < 4; k++) a[k] = (const int32_t *)(qa + (t + k) * K + b * LQ_QK);
                __m256i i0[4], i1[4];
                for (int k = 0; k < 4; k++) i0[k] = i1[k] = _mm256_setzero_si256();
                for (int c = 0; c < 8; c++) {
                    const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 64 * c)), x80);
                    const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32)), x80);
                    const __m256i u0 = _mm256_abs_epi8(w0), u1 = _mm256_abs_epi8(w1);
                    for (int k = 0; k < 4; k++) {
                        const __m256i bk = _mm256_set1_epi32(a[k][c]);
                        i0[k] = _mm256_add_epi32(i0[k], lq_dot_u8s8(u0, _mm256_sign_epi8(bk, w0)));
                        i1[k] = _mm256_add_epi32(i1[k], lq_dot_u8s8(u1, _mm256_sign_epi8(bk, w1)));
                    }
                    __asm__("" : "+x"(i0[0]), "+x"(i0[1]), "+x"(i0[2]), "+x"(i0[3]),
                                 "+x"(i1[0]), "+x"(i1[1]), "+x"(i1[2]), "+x"(i1[3]));
                }
                for (int k = 0; k < 4; k++) {
                    const __m256 dak = _mm256_set1_ps(da[(t + k) * nb + b]);
                    f[t + k][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0[k]), _mm256_mul_ps(dv0, dak), f[t + k][0]);
                    f[t + k][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1[k]), _mm256_mul_ps(dv1, dak), f[t + k][1]);
                }
            }
            continue;
        }
        for (int t = 0; t < T; t += 2) {
            const int u = t + 1;
            const int32_t *a0 = (const int32_t *)(qa + t * K + b * LQ_QK), *a1 = (const int32_t *)(qa + u * K + b * LQ_QK);
            __m256i i00 = _mm256_setzero_si256(), i01 = i00, i10 = i00, i11 = i00;
            if (FMT == LQ_FMT8) {
                /* signed bytes: |w| against the activations given w's signs, a madd per
                 * maddubs (two pair sums can pass int16); the int32 sums in i.. */
                for (int c = 0; c < 8; c++) {
                    const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 64 * c)), x80);
                    const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32)), x80);
                    const __m256i u0 = _mm256_abs_epi8(w0), u1 = _mm256_abs_epi8(w1);
                    const __m256i b0 = _mm256_set1_epi32(a0[c]), b1 = _mm256_set1_epi32(a1[c]);
                    i00 = _mm256_add_epi32(i00, lq_dot_u8s8(u0, _mm256_sign_epi8(b0, w0)));
                    i01 = _mm256_add_epi32(i01, lq_dot_u8s8(u1, _mm256_sign_epi8(b0, w1)));
                    i10 = _mm256_add_epi32(i10, lq_dot_u8s8(u0, _mm256_sign_epi8(b1, w0)));
                    i11 = _mm256_add_epi32(i11, lq_dot_u8s8(u1, _mm256_sign_epi8(b1, w1)));
                    __asm__("" : "+x"(i00), "+x"(i01), "+x"(i10), "+x"(i11));
                }
                const __m256 da0 = _mm256_set1_ps(da[t * nb + b]), da1 = _mm256_set1_ps(da[u * nb + b]);
                const __m256 n00 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i00), _mm256_mul_ps(dv0, da0), f[t][0]);
                const __m256 n01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i01), _mm256_mul_ps(dv1, da0), f[t][1]);
                const __m256 n10 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i10), _mm256_mul_ps(dv0, da1), f[u][0]);
                const __m256 n11 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i11), _mm256_mul_ps(dv1, da1), f[u][1]);
                f[t][0] = n00; f[t][1] = n01; f[u][0] = n10; f[u][1] = n11;
                continue;
            }
            __m256i j00 = i00, j01 = i00, j10 = i00, j11 = i00;  /* (FMT5) int32 sums */
            for (int c = 0; c < 4; c++) {
                /* chunk c: rows' bytes 4c..4c+3, low nibbles with a[4c..], high with a[16 + 4c..] */
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * c));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32));
                __m256i lo0 = _mm256_and_si256(v0, m4), lo1 = _mm256_and_si256(v1, m4);
                __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4);
                __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4);
                if (FMT == LQ_FMT5) {  /* the fifth bits (as lq_kernel_avx2_fmt adds them) */
                    const __m256i h0 = _mm256_loadu_si256((const __m256i *)(blk + 256));
                    const __m256i h1 = _mm256_loadu_si256((const __m256i *)(blk + 256 + 32));
                    lo0 = _mm256_or_si256(lo0, _mm256_and_si256(_mm256_slli_epi16(h0, 4 - c), b16));
                    lo1 = _mm256_or_si256(lo1, _mm256_and_si256(_mm256_slli_epi16(h1, 4 - c), b16));
                    hi0 = _mm256_or_si256(hi0, _mm256_and_si256(_mm256_srli_epi16(h0, c), b16));
                    hi1 = _mm256_or_si256(hi1, _mm256_and_si256(_mm256_srli_epi16(h1, c), b16));
                }
                const __m256i b0 = _mm256_set1_epi32(a0[c]), b1 = _mm256_set1_epi32(a1[c]);
                i00 = _mm256_add_epi16(i00, _mm256_maddubs_epi16(lo0, b0));
                i01 = _mm256_add_epi16(i01, _mm256_maddubs_epi16(lo1, b0));
                i10 = _mm256_add_epi16(i10, _mm256_maddubs_epi16(lo0, b1));
                i11 = _mm256_add_epi16(i11, _mm256_maddubs_epi16(lo1, b1));
                const __m256i c0 = _mm256_set1_epi32(a0[4 + c]), c1 = _mm256_set1_epi32(a1[4 + c]);
                i00 = _mm256_add_epi16(i00, _mm256_maddubs_epi16(hi0, c0));
                i01 = _mm256_add_epi16(i01, _mm256_maddubs_epi16(hi1, c0));
                i10 = _mm256_add_epi16(i10, _mm256_maddubs_epi16(hi0, c1));
                i11 = _mm256_add_epi16(i11, _mm256_maddubs_epi16(hi1, c1));
                __asm__("" : "+x"(i00), "+x"(i01), "+x"(i10), "+x"(i11));
                if (FMT == LQ_FMT5 && (c & 1)) {  /* 4 pair sums of 5-bit values fill int16 */
                    j00 = _mm256_add_epi32(j00, _mm256_madd_epi16(i00, ones));
                    j01 = _mm256_add_epi32(j01, _mm256_madd_epi16(i01, ones));
                    j10 = _mm256_add_epi32(j10, _mm256_madd_epi16(i10, ones));
                    j11 = _mm256_add_epi32(j11, _mm256_madd_epi16(i11, ones));
                    i00 = i01 = i10 = i11 = _mm256_setzero_si256();
                }
            }
            if (FMT == LQ_FMT4) {
                j00 = _mm256_madd_epi16(i00, ones);
                j01 = _mm256_madd_epi16(i01, ones);
                j10 = _mm256_madd_epi16(i10, ones);
                j11 = _mm256_madd_epi16(i11, ones);
            }
            const __m256 da0 = _mm256_set1_ps(da[t * nb + b]), da1 = _mm256_set1_ps(da[u * nb + b]);
            const __m256 sa0 = _mm256_set1_ps(sa[t * nb + b]), sa1 = _mm256_set1_ps(sa[u * nb + b]);
            const __m256 x00 = _mm256_cvtepi32_ps(j00), x01 = _mm256_cvtepi32_ps(j01);
            const __m256 x10 = _mm256_cvtepi32_ps(j10), x11 = _mm256_cvtepi32_ps(j11);
            if (HAS_M) {
                const __m256 mv0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB + 32)));
                const __m256 mv1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB + 48)));
                const __m256 n00 = _mm256_fmadd_ps(mv0, sa0, _mm256_fmadd_ps(x00, _mm256_mul_ps(dv0, da0), f[t][0]));
                const __m256 n01 = _mm256_fmadd_ps(mv1, sa0, _mm256_fmadd_ps(x01, _mm256_mul_ps(dv1, da0), f[t][1]));
                const __m256 n10 = _mm256_fmadd_ps(mv0, sa1, _mm256_fmadd_ps(x10, _mm256_mul_ps(dv0, da1), f[u][0]));
                const __m256 n11 = _mm256_fmadd_ps(mv1, sa1, _mm256_fmadd_ps(x11, _mm256_mul_ps(dv1, da1), f[u][1]));
                f[t][0] = n00; f[t][1] = n01; f[u][0] = n10; f[u][1] = n11;
            } else {
                const __m256 n00 = _mm256_fmadd_ps(_mm256_add_ps(x00, sa0), _mm256_mul_ps(dv0, da0), f[t][0]);
                const __m256 n01 = _mm256_fmadd_ps(_mm256_add_ps(x01, sa0), _mm256_mul_ps(dv1, da0), f[t][1]);
                const __m256 n10 = _mm256_fmadd_ps(_mm256_add_ps(x10, sa1), _mm256_mul_ps(dv0, da1), f[u][0]);
                const __m256 n11 = _mm256_fmadd_ps(_mm256_add_ps(x11, sa1), _mm256_mul_ps(dv1, da1), f[u][1]);
                f[t][0] = n00; f[t][1] = n01; f[u][0] = n10; f[u][1] = n11;
            }
        }
    }
    for (int t = 0; t < T; t++) {
        lq_store_group8x2(y + t * ys, f[t][0], f[t][1], nv);
    }
}

/* the format's kernel (always inlined, so a constant T specializes it) */
static inline __attribute__((always_inline)) void lq_kernel_avx2_any(const lq_packed *P, int64_t g, const int8_t *qa,
                                                                     const float *da, const float *sa, int T, float *y,
                                                                     int64_t ys, int nv) {
    if (P->has_m) {
        if (P->fmt == LQ_FMT4) lq_kernel_avx2_fmt(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT4, 1);
        else lq_kernel_avx2_fmt(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT5, 1);
    } else if (P->fmt == LQ_FMT4) lq_kernel_avx2_fmt(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT4, 0);
    else if (P->fmt == LQ_FMT5) lq_kernel_avx2_fmt(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT5, 0);
    else lq_kernel_avx2_fmt(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT8, 0);
}

static void lq_kernel_avx2(const lq_packed *P, int64_t g, const int8_t *qa, const float *da, const float *sa, int T,
                           float *y, int64_t ys, int nv) {
    if (T % 2 == 0) {
        /* tokens in pairs (an odd count stays below: the one pair's kernel computing a token
         * twice, or a pass of the one-token loop after the pairs, measured 2-5% slower at 3,
         * 5 and 7 tokens) */
        if (P->fmt == LQ_FMT8) lq_kernel_avx2_pairs(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT8, 0);
        else if (P->fmt == LQ_FMT5 && P->has_m) lq_kernel_avx2_pairs(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT5, 1);
        else if (P->fmt == LQ_FMT5) lq_kernel_avx2_pairs(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT5, 0);
        else if (P->has_m) lq_kernel_avx2_pairs(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT4, 1);
        else lq_kernel_avx2_pairs(P, g, qa, da, sa, T, y, ys, nv, LQ_FMT4, 0);
        return;
    }
    /* a decode's one token: its accumulators in registers (a constant T) */
    if (T == 1) lq_kernel_avx2_any(P, g, qa, da, sa, 1, y, ys, nv);
    else lq_kernel_avx2_any(P, g, qa, da, sa, T, y, ys, nv);
}

/* ---- many tokens: a group's 4-bit blocks unpacked once ----------------------------------
 * A work item of many tokens of Q4_0 / Q4_1 unpacks the group's blocks once into bytes (U:
 * per block 4 chunks x {low part, high part} x 2 halves, 32 bytes each: 512 bytes) and runs
 * the tokens 4 at a time over them: each broadcast of 4 activation bytes feeds both halves'
 * maddubs and the inner loop is loads, maddubs and adds (the pair loop unpacks each block once
 * per token pair): 0.91-0.95 of the time from 12 tokens (Zen 3, -t 1, SmolLM2 and gemma-3
 * shapes). Q5_0 / Q5_1, whose sums must widen every 4 chunks, gained nothing (0.95-1.15) and
 * keep the pair loop. The integer sums (exact) and the float updates are
 * lq_kernel_avx2_pairs', so a token's outputs are the same bits on either path. */
static void lq_unpack_group_avx2(const lq_packed *P, int64_t g, uint8_t *U) {
    const int64_t nb = P->nb, bb = P->blk_bytes;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const uint8_t *blk = P->data + g * nb * bb;
    for (int64_t b = 0; b < nb; b++, blk += bb) {
        uint8_t *o = U + b * 512;
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32 * h));
                const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                _mm256_store_si256((__m256i *)(o + (2 * c) * 64 + 32 * h), lo);
                _mm256_store_si256((__m256i *)(o + (2 * c + 1) * 64 + 32 * h), hi);
            }
    }
}

/* keeps the int16 sums in registers in order (gcc otherwise hoists all broadcasts and spills) */
#define LQ_PIN_SUMS(d, NT)                                                                   \
    do {                                                                                     \
        if (NT == 4) __asm__("" : "+x"(d[0][0]), "+x"(d[0][1]), "+x"(d[1][0]), "+x"(d[1][1]), \
                                  "+x"(d[2][0]), "+x"(d[2][1]), "+x"(d[3][0]), "+x"(d[3][1])); \
        else if (NT == 2) __asm__("" : "+x"(d[0][0]), "+x"(d[0][1]), "+x"(d[1][0]), "+x"(d[1][1])); \
    } while (0)

/* NT (1..4) tokens over the unpacked group U; as lq_kernel_avx2_pairs (FMT4) */
static inline __attribute__((always_inline)) void
lq_kernel_avx2_unpacked(const lq_packed *P, int64_t g, const uint8_t *U, const int8_t *qa, const float *da,
                        const float *sa, const int NT, float *y, int64_t ys, int nv, const int HAS_M) {
    const int64_t nb = P->nb, K = P->cols, bb = P->blk_bytes, QB = P->qbytes;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[4][2];
    for (int t = 0; t < NT; t++) f[t][0] = f[t][1] = _mm256_setzero_ps();
    const uint8_t *blk = P->data + g * nb * bb;
    for (int64_t b = 0; b < nb; b++, blk += bb) {
        const uint8_t *o = U + b * 512;
        const int32_t *a[4];
        for (int t = 0; t < NT; t++) a[t] = (const int32_t *)(qa + t * K + b * LQ_QK);
        __m256i d[4][2];
        for (int t = 0; t < NT; t++) d[t][0] = d[t][1] = _mm256_setzero_si256();
        /* the low parts, then the high parts (8 x 2 x 15 x 127 fits int16) */
        for (int part = 0; part < 2; part++) {
#pragma GCC unroll 1
            for (int c = 0; c < 4; c++) {  /* low nibbles with a[4c..], high with a[16 + 4c..] */
                const __m256i w0 = _mm256_load_si256((const __m256i *)(o + (2 * c + part) * 64));
                const __m256i w1 = _mm256_load_si256((const __m256i *)(o + (2 * c + part) * 64 + 32));
                for (int t = 0; t < NT; t++) {
                    const __m256i av = _mm256_set1_epi32(a[t][c + 4 * part]);
                    d[t][0] = _mm256_add_epi16(d[t][0], _mm256_maddubs_epi16(w0, av));
                    d[t][1] = _mm256_add_epi16(d[t][1], _mm256_maddubs_epi16(w1, av));
                }
                LQ_PIN_SUMS(d, NT);
            }
        }
        const __m256 dv0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB)));
        const __m256 dv1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB + 16)));
        for (int t = 0; t < NT; t++) {
            const __m256 dat = _mm256_set1_ps(da[t * nb + b]), sat = _mm256_set1_ps(sa[t * nb + b]);
            const __m256 x0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(d[t][0], ones));
            const __m256 x1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(d[t][1], ones));
            if (HAS_M) {
                const __m256 mv0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB + 32)));
                const __m256 mv1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + QB + 48)));
                f[t][0] = _mm256_fmadd_ps(mv0, sat, _mm256_fmadd_ps(x0, _mm256_mul_ps(dv0, dat), f[t][0]));
                f[t][1] = _mm256_fmadd_ps(mv1, sat, _mm256_fmadd_ps(x1, _mm256_mul_ps(dv1, dat), f[t][1]));
            } else {
                f[t][0] = _mm256_fmadd_ps(_mm256_add_ps(x0, sat), _mm256_mul_ps(dv0, dat), f[t][0]);
                f[t][1] = _mm256_fmadd_ps(_mm256_add_ps(x1, sat), _mm256_mul_ps(dv1, dat), f[t][1]);
            }
        }
    }
    for (int t = 0; t < NT; t++) {
        lq_store_group8x2(y + t * ys, f[t][0], f[t][1], nv);
    }
}

static inline __attribute__((always_inline)) void
lq_unpacked_fmt(const lq_packed *P, int64_t g, const uint8_t *U, const int8_t *qa, const float *da, const float *sa,
                const int NT, float *y, int64_t ys, int nv) {
    if (P->has_m) lq_kernel_avx2_unpacked(P, g, U, qa, da, sa, NT, y, ys, nv, 1);
    else lq_kernel_avx2_unpacked(P, g, U, qa, da, sa, NT, y, ys, nv, 0);
}

/* Fewest tokens of a work item for which a 4-bit group is unpacked once (fewer: the pair and
 * one-token loops). lq_u_override_avx2 >= 0 (tests, benchmarks): that; 0: never. */
static int lq_u_override_avx2 = -1;
static inline int64_t lq_u_min_avx2(void) {
    return lq_u_override_avx2 < 0 ? 12 : lq_u_override_avx2 ? lq_u_override_avx2 : INT64_MAX;
}

/* tokens [0, n) of group g on the unpacked path; returns 0, or -1 (no buffer: the caller's
 * loops take them) */
static int lq_group_unpacked_avx2(const lq_packed *P, int64_t g, const int8_t *qa, const float *da, const float *sa,
                                  int64_t n, float *y, int64_t R, int nv) {
    uint8_t *U = lq_unpack_buffer((size_t)P->nb * 512);
    if (!U) return -1;
    lq_unpack_group_avx2(P, g, U);
    const int64_t K = P->cols, nb = P->nb;
    for (int64_t t0 = 0; t0 < n; t0 += 4) {
        const int NT = (int)(n - t0 < 4 ? n - t0 : 4);
        const int8_t *q = qa + t0 * K;
        const float *dd = da + t0 * nb, *ss = sa + t0 * nb;
        float *yo = y + t0 * R + g * LQ_G;
        switch (NT) {
        case 4: lq_unpacked_fmt(P, g, U, q, dd, ss, 4, yo, R, nv); break;
        case 3: lq_unpacked_fmt(P, g, U, q, dd, ss, 3, yo, R, nv); break;
        case 2: lq_unpacked_fmt(P, g, U, q, dd, ss, 2, yo, R, nv); break;
        default: lq_unpacked_fmt(P, g, U, q, dd, ss, 1, yo, R, nv); break;
        }
    }
    return 0;
}
#else
#define LQ_AVX2 0
#endif

/* tests and benchmarks: the fewest tokens for the unpacked 4-bit path (AVX2); 0: never;
 * -1: the built-in thresholds */
static inline void lq_u_set_min_tokens(int n) {
#if LQ_AVX2
    lq_u_override_avx2 = n < 0 ? -1 : n;
#else
    (void)n;
#endif
}

/* ---------------------------------------------------------------- float kernels */
#if defined(__AVX512F__)
/* RR rows x T tokens of a float weight: each output is one 16-lane fma chain over k, then
 * reduce_add (the same operations for any RR and T: results do not depend on the batch);
 * RR rows at once read each activation vector once for RR rows (a router's 512-token
 * prefill is load-bound otherwise) */
static inline __attribute__((always_inline)) void
lq_float_block(const lq_packed *P, const int RR, const int T, int64_t r, const float *x, float *y, int64_t t0,
               int64_t R) {
    const int64_t K = P->cols;
    __m512 acc[4][4];
    for (int i = 0; i < RR; i++)
        for (int t = 0; t < T; t++) acc[i][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        __m512 w[4], xv[4];
        for (int i = 0; i < RR; i++) {
            if (P->fmt == LQ_FMT_F32) w[i] = _mm512_maskz_loadu_ps(mk, (const float *)P->data + (r + i) * K + k);
            else {
                __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)P->data + (r + i) * K + k);
                if (P->fmt == LQ_FMT_F16) w[i] = _mm512_cvtph_ps(h);
                else w[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            }
        }
        for (int t = 0; t < T; t++) xv[t] = _mm512_maskz_loadu_ps(mk, x + (t0 + t) * K + k);
        for (int i = 0; i < RR; i++)
            for (int t = 0; t < T; t++) acc[i][t] = _mm512_fmadd_ps(w[i], xv[t], acc[i][t]);
    }
    for (int i = 0; i < RR; i++)
        for (int t = 0; t < T; t++) y[(t0 + t) * R + r + i] = _mm512_reduce_add_ps(acc[i][t]);
}
#endif

/* Rows [r0, r1) of y = x @ W.T for a float weight; y's row stride is ldy (P->rows in the
 * plain matmul; the row length of a wider output when a fused projection's parts land side
 * by side). */
static inline void lq_float_rows_ld(const lq_packed *P, int64_t r0, int64_t r1, const float *x, float *y,
                                    int64_t n, int64_t ldy) {
    const int64_t K = P->cols, R = ldy;
#if defined(__AVX512F__)
    for (int64_t t0 = 0; t0 < n; t0 += 4) {
        const int T = (int)(n - t0 < 4 ? n - t0 : 4);
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) {
            switch (T) {
            case 4: lq_float_block(P, 4, 4, r, x, y, t0, R); break;
            case 3: lq_float_block(P, 4, 3, r, x, y, t0, R); break;
            case 2: lq_float_block(P, 4, 2, r, x, y, t0, R); break;
            default: lq_float_block(P, 4, 1, r, x, y, t0, R); break;
            }
        }
        for (; r < r1; r++) {
            switch (T) {
            case 4: lq_float_block(P, 1, 4, r, x, y, t0, R); break;
            case 3: lq_float_block(P, 1, 3, r, x, y, t0, R); break;
            case 2: lq_float_block(P, 1, 2, r, x, y, t0, R); break;
            default: lq_float_block(P, 1, 1, r, x, y, t0, R); break;
            }
        }
    }
    (void)K; (void)R;
    return;
#endif
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t0 = 0; t0 < n; t0 += 4) {
            int T = (int)(n - t0 < 4 ? n - t0 : 4);
#if defined(__AVX512F__)
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int64_t k = 0; k < K; k += 16) {
                __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
                __m512 w;
                if (P->fmt == LQ_FMT_F32) w = _mm512_maskz_loadu_ps(mk, (const float *)P->data + r * K + k);
                else {
                    __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)P->data + r * K + k);
                    if (P->fmt == LQ_FMT_F16) w = _mm512_cvtph_ps(h);
                    else w = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                }
                for (int t = 0; t < T; t++)
                    acc[t] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(mk, x + (t0 + t) * K + k), acc[t]);
            }
            for (int t = 0; t < T; t++) y[(t0 + t) * R + r] = _mm512_reduce_add_ps(acc[t]);
#else
            for (int t = 0; t < T; t++) {
                float acc = 0.f;
                const float *xt = x + (t0 + t) * K;
                for (int64_t k = 0; k < K; k++) {
                    float w;
                    if (P->fmt == LQ_FMT_F32) w = ((const float *)P->data)[r * K + k];
                    else if (P->fmt == LQ_FMT_F16) w = simd_h2f(((const uint16_t *)P->data)[r * K + k]);
                    else w = simd_bf2f(((const uint16_t *)P->data)[r * K + k]);
                    acc += w * xt[k];
                }
                y[(t0 + t) * R + r] = acc;
            }
#endif
        }
    }
}

static inline void lq_float_rows(const lq_packed *P, int64_t r0, int64_t r1, const float *x, float *y, int64_t n) {
    lq_float_rows_ld(P, r0, r1, x, y, n, P->rows);
}

/* 2: AVX-512 VNNI, 1: AVX2, 0: portable C */
static inline int lq_simd_level(void) { return LQ_VNNI ? 2 : LQ_AVX2 ? 1 : 0; }

/* ---------------------------------------------------------------- matmul work items */
static __thread void *lq_scratch = NULL;
static __thread size_t lq_scratch_cap = 0;

static void *lq_get_scratch(size_t bytes) {
    if (bytes > lq_scratch_cap) {
        free(lq_scratch);
        lq_scratch = simd_alloc(bytes);
        lq_scratch_cap = lq_scratch ? bytes : 0;
    }
    return lq_scratch;
}

/* Buffers of the calling thread for n rows of quantized activations: qa int8 (n, K), da and
 * sa float (n, K / 32). Returns 0, or -1 on allocation failure. */
static int lq_act_buffers(int64_t n, int64_t K, int8_t **qa, float **da, float **sa) {
    const int64_t nb = K / LQ_QK;
    size_t qbytes = (size_t)(n * K), fbytes = (size_t)(n * nb) * sizeof(float);
    uint8_t *scr = (uint8_t *)lq_get_scratch(((qbytes + 63) & ~(size_t)63) + 2 * fbytes + 64);
    if (!scr) return -1;
    *qa = (int8_t *)scr;
    *da = (float *)(scr + ((qbytes + 63) & ~(size_t)63));
    *sa = *da + n * nb;
    return 0;
}

/* Tokens per kernel call. Q8_0 keeps 8 weight vectors live: more than 4 token accumulators
 * spill (2x slower per token at 5..8 tokens); its group of weights is re-read from L1 per
 * 4-token tile instead. */
static inline int64_t lq_tile_tokens(const lq_packed *P, int portable) {
    return LQ_VNNI && !portable && P->fmt == LQ_FMT8 ? 4 : LQ_TT;
}

/* One work item of a matmul: output row group g for n tokens, tt tokens per kernel call.
 * qa, da, sa and y point at the first token's row; y's row stride is R (P->rows in the plain
 * matmul). portable: the C kernel even where SIMD ones are built (tests compare the two). */
static void lq_group_rows_ld(const lq_packed *P, int64_t g, const int8_t *qa, const float *da, const float *sa,
                             int64_t n, int64_t tt, float *y, int64_t R, int portable) {
    const int64_t K = P->cols, nb = P->nb;
    const int nv = (int)(R - g * LQ_G < LQ_G ? R - g * LQ_G : LQ_G);
    int64_t t0 = 0;
    (void)portable;
#if LQ_AMX_BUILT
    if (!portable && lq_amx_on && n >= 16) /* whole 16-token tiles on AMX, the rest below */
        t0 = lq_group_amx(P, g, qa, da, sa, n, y + g * LQ_G, R, nv);
#endif
#if LQ_AVX2
    if (!portable && P->fmt == LQ_FMT4 && n - t0 >= lq_u_min_avx2() &&
        lq_group_unpacked_avx2(P, g, qa + t0 * K, da + t0 * nb, sa + t0 * nb, n - t0, y + t0 * R, R, nv) == 0)
        return;
#endif
    for (; t0 < n; t0 += tt) {
        const int T = (int)(n - t0 < tt ? n - t0 : tt);
        const int8_t *q = qa + t0 * K;
        const float *dd = da + t0 * nb, *ss = sa + t0 * nb;
        float *yo = y + t0 * R + g * LQ_G;
#if LQ_VNNI
        if (!portable) { lq_group_vnni(P, g, q, dd, ss, T, yo, R, nv); continue; }
#endif
#if LQ_AVX2
        if (!portable) { lq_kernel_avx2(P, g, q, dd, ss, T, yo, R, nv); continue; }
#endif
        lq_kernel_scalar(P, g, q, dd, ss, T, yo, R, nv);
    }
}

static void lq_group_rows(const lq_packed *P, int64_t g, const int8_t *qa, const float *da, const float *sa,
                          int64_t n, int64_t tt, float *y, int portable) {
    lq_group_rows_ld(P, g, qa, da, sa, n, tt, y, P->rows, portable);
}

/* Whether lq_group_pair can read groups of P0 and P1 side by side (same format and
 * columns). */
static inline int lq_pair_ok(const lq_packed *P0, const lq_packed *P1) {
    return P0->fmt == P1->fmt && P0->has_m == P1->has_m && P0->cols == P1->cols &&
           (P0->fmt == LQ_FMT4 || P0->fmt == LQ_FMT5 || P0->fmt == LQ_FMT8);
}

/* n tokens (row-major activations of row stride P0->cols, outputs of row stride ldy):
 * lq_group_rows_ld of group g0 of P0 (activations qa0 / da0 / sa0, outputs y0, rows0 valid
 * output rows) and of group g1 of P1 (lq_pair_ok), the two weight streams read side by side
 * (LQ_PAIR_T tokens a pass) where the AVX-512 kernels are built (lq_kernel_vnni_pair's
 * note), else one after the other. */
static void lq_group_pair(const lq_packed *P0, int64_t g0, const int8_t *qa0, const float *da0, const float *sa0,
                          float *y0, int64_t rows0, const lq_packed *P1, int64_t g1, const int8_t *qa1,
                          const float *da1, const float *sa1, float *y1, int64_t rows1, int64_t n, int64_t ldy) {
#if LQ_VNNI
    const int64_t nb = P0->nb, bb = P0->blk_bytes, K = P0->cols;
    for (int64_t t0 = 0; t0 < n; t0 += LQ_PAIR_T) {
        const int T = (int)(n - t0 < LQ_PAIR_T ? n - t0 : LQ_PAIR_T);
        const lq_stream st[2] = {
            {P0->data + g0 * nb * bb, qa0 + t0 * K, da0 + t0 * nb, sa0 + t0 * nb, y0 + t0 * ldy + g0 * LQ_G,
             (int)(rows0 - g0 * LQ_G < LQ_G ? rows0 - g0 * LQ_G : LQ_G)},
            {P1->data + g1 * nb * bb, qa1 + t0 * K, da1 + t0 * nb, sa1 + t0 * nb, y1 + t0 * ldy + g1 * LQ_G,
             (int)(rows1 - g1 * LQ_G < LQ_G ? rows1 - g1 * LQ_G : LQ_G)},
        };
#define LQ_PAIR_CASE(FMT, HM)                                                          \
        switch (T) {                                                                   \
        case 1: lq_kernel_vnni_pair(st, nb, bb, FMT, HM, 1, K, ldy); break;            \
        case 2: lq_kernel_vnni_pair(st, nb, bb, FMT, HM, 2, K, ldy); break;            \
        case 3: lq_kernel_vnni_pair(st, nb, bb, FMT, HM, 3, K, ldy); break;            \
        default: lq_kernel_vnni_pair(st, nb, bb, FMT, HM, 4, K, ldy); break;           \
        }
        if (P0->has_m) {
            if (P0->fmt == LQ_FMT4) { LQ_PAIR_CASE(4, 1) }
            else { LQ_PAIR_CASE(5, 1) }
        } else if (P0->fmt == LQ_FMT4) {
            LQ_PAIR_CASE(4, 0)
        } else if (P0->fmt == LQ_FMT5) {
            LQ_PAIR_CASE(5, 0)
        } else {
            LQ_PAIR_CASE(8, 0)
        }
#undef LQ_PAIR_CASE
    }
#else
    lq_group_rows_ld(P0, g0, qa0, da0, sa0, n, LQ_TT, y0, ldy, 0);
    lq_group_rows_ld(P1, g1, qa1, da1, sa1, n, LQ_TT, y1, ldy, 0);
#endif
}

#endif /* LLMCORE_SIMD_QUANTS_H */
