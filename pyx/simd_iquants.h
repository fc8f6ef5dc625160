/* i-quants with the non-linear 4-bit table: IQ4_NL and IQ4_XS.
 *
 * Both store 4-bit indices into kvalues_iq4nl (16 int8 values from -127 to 113):
 *   IQ4_NL  block of 32 (18 bytes): f16 d | 16 bytes of indices (value j: low nibble of
 *           qs[j], value 16 + j: high nibble); value = d * kvalue[index].
 *   IQ4_XS  super-block of 256 (136 bytes): f16 d | u16 scales_h | 4 bytes scales_l | 128
 *           bytes of indices, 8 sub-blocks of 32 laid out like IQ4_NL blocks; sub-block ib
 *           has the 6-bit scale ls = (scales_l nibble ib) | (2 bits of scales_h) << 4 and
 *           value = (d * (ls - 32)) * kvalue[index].
 * Activations are quantized like llama.cpp before the dot: q8_0 (32 int8 + f16 scale) for
 * IQ4_NL, q8_K (256 int8 + f32 scale) for IQ4_XS.
 *
 * GGUF-layout kernels (AVX2, portable C; any build) sum in the float order of ggml's x86
 * vec_dot_iq4_nl_q8_0 / vec_dot_iq4_xs_q8_K (its AVX2 code, which AVX-512 builds of ggml
 * also run), so with fused multiply-adds their outputs are bit-identical to llama.cpp's where
 * it runs them: expert matmuls (mul_mat_id) of both types, IQ4_XS matmuls of up to 7 tokens,
 * one-token IQ4_NL matmuls (llama.cpp's batched paths are other kernels with other orders:
 * llamafile's tinyBLAS for IQ4_NL from 2 tokens, one chain over the blocks; another for IQ4_XS
 * from 8). Its results therefore depend on the batch size; these kernels' never do.
 * Per output, 8 float lanes: lane l holds the integer dot of values 4l..4l+3 of each
 * 32-block (l < 4: low nibbles of qs[4l..4l+3], l >= 4: high nibbles of qs[4(l-4)..]), and
 *   IQ4_NL: even blocks and odd blocks feed two fma chains, acc = fma(d_w * d_a, lane, acc);
 *           the result is hsum8(acc_even + acc_odd) (ggml's hsum_float_8 order), then an odd
 *           last block is added as fma(d_w * d_a, its integer dot, sum).
 *   IQ4_XS: per super-block the lane's integer sum over sub-blocks of ls * dot, then one
 *           chain acc = fma(d_w * d_a, that, acc); the result is hsum8(acc).
 *
 * Repacked layout (AVX-512 VNNI): rows in groups of 16, the last one padded with zero rows;
 * a 64-byte chunk holds 4 index bytes of each of the 16 rows, so vpdpbusd with 4 broadcast
 * activations adds 16 rows' partial dots to 16 int32 lanes. Indices are looked up (vpermb /
 * vpshufb) as unsigned kvalue + 128; the offset comes back through the activations' block
 * sums, and the accumulator starts from the bits of the float 1.5 * 2^23, so that
 *     dpbusd chain from bits(1.5 * 2^23) - 128 * sum(a)  read as a float  - 1.5 * 2^23
 * is a 32-block's exact integer dot as a float (|dot| < 2^22), with no conversion.
 *   IQ4_NL group-block (288 bytes): 4 chunks (chunk c: row r bytes qs[4c..4c+3]) | 16 f16 d
 *   IQ4_XS group-super-block (2208 bytes): 16 f16 d | 8 x 16 int8 ls - 32 | 8 sub-blocks x
 *           4 chunks (sub-block ib, chunk c: row r bytes qs[16 ib + 4c .. +3])
 * The repacked kernels sum whole 32-blocks, one chain per output (twice the speed of the
 * 8-lane order when compute-bound, prefill):
 *   IQ4_NL: acc = fma(d_w * d_a, dot, acc) over the blocks;
 *   IQ4_XS: per super-block s = sum over sub-blocks of ls * dot, fused multiply-adds of
 *           integers (exact while |s| < 2^24: each ls * dot is below 2^24, and a sum over
 *           the 8 sub-blocks past it needs most products near 127 * 127 with one sign), then
 *           acc = fma(d_w * d_a, s, acc).
 * The integers are the GGUF-layout kernels'; the float sums differ in order only (relative
 * differences ~1e-7). Every output sees the same operations in the same order whatever the
 * number of tokens, the token tile or the thread count.
 */
#ifndef LLMCORE_SIMD_IQUANTS_H
#define LLMCORE_SIMD_IQUANTS_H

#include "simd.h"

#if !SIMD_AVX512_VNNI && defined(__AVX2__) && defined(__FMA__)
#define IQ_AVX2 1
#endif

/* the float fma of the lane chains: fused where the hardware has it (as in ggml's AVX2 code) */
#if defined(__FMA__)
#define IQ_FMA(a, b, c) fmaf((a), (b), (c))
#else
#define IQ_FMA(a, b, c) ((a) * (b) + (c))
#endif

enum { IQ_IQ4_NL = 20, IQ_IQ4_XS = 23 };
#define IQ_RP 16 /* rows per repacked group */

static const int8_t iq_kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static inline const char *iq_simd_name(void) {
#if SIMD_AVX512_VNNI
    return "avx512vnni";
#elif defined(IQ_AVX2)
    return "avx2";
#else
    return "c";
#endif
}

static inline int iq_type_size(int t) { return t == IQ_IQ4_NL ? 18 : t == IQ_IQ4_XS ? 136 : 0; }
static inline int iq_block_size(int t) { return t == IQ_IQ4_NL ? 32 : t == IQ_IQ4_XS ? 256 : 0; }

/* scale of sub-block ib of an IQ4_XS super-block, minus 32 */
static inline int iq_xs_scale(const uint8_t *b, int ib) {
    const int lo = (b[4 + ib / 2] >> (4 * (ib & 1))) & 0xF;
    const int hi = (simd_rd16(b + 2) >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

/* ---------------------------------------------------------------------------------- */
/* exact dequantization (the float ops of gguf.quants, in its order; no FMA contraction) */
/* ---------------------------------------------------------------------------------- */
__attribute__((optimize("fp-contract=off")))
static void iq_dequant_blocks(int t, const uint8_t *src, int64_t nblocks, float *dst) {
    if (t == IQ_IQ4_NL) {
        for (int64_t i = 0; i < nblocks; i++, src += 18, dst += 32) {
            const float d = simd_load_f16(src);
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)iq_kvalues[src[2 + j] & 0xF];
                dst[16 + j] = d * (float)iq_kvalues[src[2 + j] >> 4];
            }
        }
        return;
    }
    for (int64_t i = 0; i < nblocks; i++, src += 136, dst += 256) {
        const float d = simd_load_f16(src);
        const uint8_t *qs = src + 8;
        for (int ib = 0; ib < 8; ib++) {
            const float dl = d * (float)iq_xs_scale(src, ib);
            for (int j = 0; j < 16; j++) {
                dst[32 * ib + j] = dl * (float)iq_kvalues[qs[16 * ib + j] & 0xF];
                dst[32 * ib + 16 + j] = dl * (float)iq_kvalues[qs[16 * ib + j] >> 4];
            }
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* activation quantization (llama.cpp's x86 quantize_row_q8_0, quantize_row_q8_K_ref)   */
/* ---------------------------------------------------------------------------------- */
/* round half to even, |f| < 2^22. Callers are built with fp-contract off: fused into
 * x * id + 1.5 * 2^23 the product would not be rounded first, and an exact x * id a hair
 * from k + 0.5 rounds the other way than in ggml (one int8 off in a block). */
static inline int iq_nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* q8_0: d = amax / 127 (used as f16), q = round(x * (127 / amax)) */
__attribute__((optimize("fp-contract=off")))
static void iq_quantize_q8_0(const float *x, int64_t k, int8_t *qs, float *d) {
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
#if defined(__AVX512F__)
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const __m512 id = _mm512_set1_ps(amax != 0 ? 127.f / amax : 0.f);
        /* the product rounded to float, then to the nearest integer (ties to even) */
        _mm_storeu_si128((__m128i *)(qs + 32 * i), _mm512_cvtsepi32_epi8(_mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        _mm_storeu_si128((__m128i *)(qs + 32 * i + 16), _mm512_cvtsepi32_epi8(_mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
#else
        float amax = 0;
        for (int j = 0; j < 32; j++) {
            const float ax = fabsf(x[j]);
            amax = ax > amax ? ax : amax;
        }
        const float id = amax != 0 ? 127.f / amax : 0.f;
        for (int j = 0; j < 32; j++) qs[i * 32 + j] = (int8_t)iq_nearest_int(x[j] * id);
#endif
        d[i] = simd_f16_round(amax / 127.f);
    }
}

/* q8_K: iscale = -127 / (the first value of largest magnitude), q = min(127, round(iscale * x)) */
__attribute__((optimize("fp-contract=off")))
static void iq_quantize_q8_k(const float *x, int64_t k, int8_t *qs, float *d) {
    for (int64_t i = 0; i < k / 256; i++, x += 256, qs += 256) {
        float mx = 0, amax = 0;
#if defined(__AVX512F__)
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * j)));
        amax = _mm512_reduce_max_ps(m);
        for (int j = 0; j < 16 && amax > 0; j++) { /* the first value of that magnitude sets the sign */
            const __mmask16 e = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * j)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (e) { mx = x[16 * j + __builtin_ctz(e)]; break; }
        }
#else
        for (int j = 0; j < 256; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; mx = x[j]; }
        }
#endif
        if (!(amax > 0)) {
            d[i] = 0;
            memset(qs, 0, 256);
            continue;
        }
        const float iscale = -127.f / mx;
#if defined(__AVX512F__)
        const __m512 is = _mm512_set1_ps(iscale), lim = _mm512_set1_ps(127.f);
        for (int j = 0; j < 16; j++) {
            const __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(is, _mm512_loadu_ps(x + 16 * j)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i *)(qs + 16 * j), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(v, lim))));
        }
#else
        for (int j = 0; j < 256; j++) {
            const int v = iq_nearest_int(iscale * x[j]);
            qs[j] = (int8_t)(v < 127 ? v : 127);
        }
#endif
        d[i] = 1 / iscale;
    }
}

#define IQ_MAGIC_BITS 0x4B400000 /* 1.5 * 2^23: its float holds M + x exactly for |x| < 2^22 */
#define IQ_MAGIC 12582912.0f

/* One row of activations: qs (k int8), d (k / block size), and for the repacked kernels
 * bias (k / 32 int32): bits(1.5 * 2^23) - 128 * the sum of each 32-block's values. */
static void iq_quantize_row(int t, const float *x, int64_t k, int8_t *qs, float *d, int32_t *bias) {
    if (t == IQ_IQ4_NL) iq_quantize_q8_0(x, k, qs, d);
    else iq_quantize_q8_k(x, k, qs, d);
    if (!bias) return;
    for (int64_t i = 0; i < k / 32; i++) {
#if defined(__AVX512F__)
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * i))),
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * i + 16)))));
#else
        int32_t sum = 0;
        for (int j = 0; j < 32; j++) sum += qs[32 * i + j];
#endif
        bias[i] = IQ_MAGIC_BITS - 128 * sum;
    }
}

/* ---------------------------------------------------------------------------------- */
/* GGUF-layout dot products (one row, one token): AVX2 or portable C, ggml's order       */
/* ---------------------------------------------------------------------------------- */
/* ggml's hsum_float_8 on 8 lanes: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)) */
static inline float iq_hsum8(const float *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* integer lane sums of one 32-block: 16 index bytes q, 32 activations a */
static inline void iq_lanes32(const uint8_t *q, const int8_t *a, int32_t *lane) {
    for (int c = 0; c < 4; c++) {
        int32_t lo = 0, hi = 0;
        for (int i = 0; i < 4; i++) {
            lo += iq_kvalues[q[4 * c + i] & 0xF] * a[4 * c + i];
            hi += iq_kvalues[q[4 * c + i] >> 4] * a[16 + 4 * c + i];
        }
        lane[c] = lo;
        lane[4 + c] = hi;
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* 8 int32 lanes of one 32-block (16 index bytes at q, activations at a), each lane's two
 * int16 pair sums (ggml's mul_add_epi8: |w| * sign(a, w), at most 2 * 127 * 127) times the
 * int16 scale s */
static inline __m256i iq_lanes32_avx2(const uint8_t *q, const int8_t *a, __m256i s) {
    const __m128i tbl = _mm_loadu_si128((const __m128i *)iq_kvalues), m4 = _mm_set1_epi8(0x0F);
    const __m128i bits = _mm_loadu_si128((const __m128i *)q);
    const __m256i w = _mm256_set_m128i(_mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)),
                                       _mm_shuffle_epi8(tbl, _mm_and_si128(bits, m4)));
    const __m256i av = _mm256_loadu_si256((const __m256i *)a);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(av, w)), s);
}
#endif

/* IQ4_NL row (nb blocks) . q8_0 row */
static float iq_dot_nl(const uint8_t *w, const int8_t *a, const float *da, int64_t nb) {
    int64_t ib = 0;
    float sum;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    for (; ib + 1 < nb; ib += 2) {
        const __m256i one = _mm256_set1_epi16(1);
        const __m256i p1 = iq_lanes32_avx2(w + ib * 18 + 2, a + ib * 32, one);
        const __m256i p2 = iq_lanes32_avx2(w + (ib + 1) * 18 + 2, a + (ib + 1) * 32, one);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(da[ib] * simd_load_f16(w + ib * 18)), _mm256_cvtepi32_ps(p1), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_set1_ps(da[ib + 1] * simd_load_f16(w + (ib + 1) * 18)), _mm256_cvtepi32_ps(p2), acc2);
    }
    sum = simd_hsum_f32x8(_mm256_add_ps(acc1, acc2));
#else
    float acc1[8] = {0}, acc2[8] = {0}, t[8];
    int32_t l1[8], l2[8];
    for (; ib + 1 < nb; ib += 2) {
        iq_lanes32(w + ib * 18 + 2, a + ib * 32, l1);
        iq_lanes32(w + (ib + 1) * 18 + 2, a + (ib + 1) * 32, l2);
        const float s1 = da[ib] * simd_load_f16(w + ib * 18), s2 = da[ib + 1] * simd_load_f16(w + (ib + 1) * 18);
        for (int l = 0; l < 8; l++) {
            acc1[l] = IQ_FMA(s1, (float)l1[l], acc1[l]);
            acc2[l] = IQ_FMA(s2, (float)l2[l], acc2[l]);
        }
    }
    for (int l = 0; l < 8; l++) t[l] = acc1[l] + acc2[l];
    sum = iq_hsum8(t);
#endif
    if (ib < nb) {
        int32_t l1[8], s = 0;
        iq_lanes32(w + ib * 18 + 2, a + ib * 32, l1);
        for (int l = 0; l < 8; l++) s += l1[l];
        sum = IQ_FMA(da[ib] * simd_load_f16(w + ib * 18), (float)s, sum);
    }
    return sum;
}

/* IQ4_XS row (nsb super-blocks) . q8_K row */
static float iq_dot_xs(const uint8_t *w, const int8_t *a, const float *da, int64_t nsb) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++, w += 136, a += 256) {
        __m256i isum = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++)
            isum = _mm256_add_epi32(isum, iq_lanes32_avx2(w + 8 + 16 * ib, a + 32 * ib,
                                                          _mm256_set1_epi16((int16_t)iq_xs_scale(w, ib))));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(simd_load_f16(w) * da[b]), _mm256_cvtepi32_ps(isum), acc);
    }
    return simd_hsum_f32x8(acc);
#else
    float acc[8] = {0};
    for (int64_t b = 0; b < nsb; b++, w += 136, a += 256) {
        int32_t isum[8] = {0}, lane[8];
        for (int ib = 0; ib < 8; ib++) {
            const int32_t ls = iq_xs_scale(w, ib);
            iq_lanes32(w + 8 + 16 * ib, a + 32 * ib, lane);
            for (int l = 0; l < 8; l++) isum[l] += ls * lane[l];
        }
        const float s = simd_load_f16(w) * da[b];
        for (int l = 0; l < 8; l++) acc[l] = IQ_FMA(s, (float)isum[l], acc[l]);
    }
    return iq_hsum8(acc);
#endif
}

/* Y[j * ldy + r] for rows [r0, r1) of W (row r at W + r * row_stride, k values) and n
 * tokens of activations (qs n x k, d n x k / block size) */
#define IQ_TOK_TILE 16 /* tokens whose activations stay in L1 while the rows pass over them */

static void iq_matmul_rows(int t, const uint8_t *W, int64_t row_stride, int64_t r0, int64_t r1, int64_t k,
                           const int8_t *qs, const float *d, int64_t n, float *Y, int64_t ldy) {
    const int64_t nb = k / iq_block_size(t);
    for (int64_t j0 = 0; j0 < n; j0 += IQ_TOK_TILE) {
        const int64_t j1 = j0 + IQ_TOK_TILE < n ? j0 + IQ_TOK_TILE : n;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = W + r * row_stride;
            for (int64_t j = j0; j < j1; j++)
                Y[j * ldy + r] = t == IQ_IQ4_NL ? iq_dot_nl(wr, qs + j * k, d + j * nb, nb)
                                                : iq_dot_xs(wr, qs + j * k, d + j * nb, nb);
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* repacked layout (AVX-512 VNNI)                                                       */
/* ---------------------------------------------------------------------------------- */
static inline int iq_rp_supported(int t) {
#if SIMD_AVX512_VNNI
    return t == IQ_IQ4_NL || t == IQ_IQ4_XS;
#else
    (void)t;
    return 0;
#endif
}

/* bytes of one 16-row group of rows of k values */
static inline int64_t iq_rp_group_bytes(int t, int64_t k) {
    return t == IQ_IQ4_NL ? (k / 32) * 288 : (k / 256) * 2208;
}

/* repack row groups [g0, g1) of W (rows x k, GGUF layout, row r at W + r * row_stride) */
static void iq_rp_pack(int t, const uint8_t *W, int64_t row_stride, int64_t rows, int64_t k,
                       int64_t g0, int64_t g1, uint8_t *out) {
    const int64_t gb = iq_rp_group_bytes(t, k);
    const int ts = iq_type_size(t);
    const int64_t nb = k / iq_block_size(t);
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *o = out + g * gb;
        memset(o, 0, gb);
        for (int r = 0; r < IQ_RP; r++) {
            const int64_t row = g * IQ_RP + r;
            if (row >= rows) break;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *src = W + row * row_stride + b * ts;
                if (t == IQ_IQ4_NL) {
                    uint8_t *tile = o + b * 288;
                    for (int c = 0; c < 4; c++) memcpy(tile + 64 * c + 4 * r, src + 2 + 4 * c, 4);
                    memcpy(tile + 256 + 2 * r, src, 2);
                } else {
                    uint8_t *tile = o + b * 2208;
                    memcpy(tile + 2 * r, src, 2);
                    for (int ib = 0; ib < 8; ib++) {
                        tile[32 + 16 * ib + r] = (uint8_t)(int8_t)iq_xs_scale(src, ib);
                        for (int c = 0; c < 4; c++)
                            memcpy(tile + 160 + 256 * ib + 64 * c + 4 * r, src + 8 + 16 * ib + 4 * c, 4);
                    }
                }
            }
        }
    }
}

/* Activations of one matmul call, token 0; per token: qs k, d k / block size, bias k / 32 */
typedef struct {
    const int8_t *qs;
    const float *d;
    const int32_t *bias;
} iq_act;

#if SIMD_AVX512_VNNI
/* kvalue + 128 in every 16 bytes: a vpshufb table (per 128-bit lane) and, with AVX-512
 * VBMI, a vpermb table (64 entries: bits 4-5 of an index do not matter) */
static inline __m512i iq_table_u8(void) {
    return _mm512_broadcast_i32x4(_mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118,
                                                (char)129, (char)141, (char)153, (char)166,
                                                (char)181, (char)197, (char)217, (char)241));
}

/* the 8 vectors of one 32-block: 4 chunks at q -> w[c] low nibbles (values 4c..4c+3 of
 * each row), w[4 + c] high nibbles (values 16 + 4c..) */
static inline __attribute__((always_inline)) void iq_rp_decode(const uint8_t *q, __m512i tbl, __m512i *w) {
#if defined(__AVX512VBMI__) /* vpermb reads 6 index bits: no masking */
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
        w[c] = _mm512_permutexvar_epi8(v, tbl);
        w[4 + c] = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), tbl);
    }
#else
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
        w[c] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(v, m4));
        w[4 + c] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
#endif
}

/* 16 rows' exact dot with one 32-block of activations (a32: its 8 int32 words, bias: its
 * bias) as floats; two dpbusd chains so that several tokens keep the unit busy */
static inline __attribute__((always_inline)) __m512 iq_rp_block_dot(const __m512i *w, const int32_t *a32,
                                                                    int32_t bias) {
    __m512i p = _mm512_set1_epi32(bias), q = _mm512_setzero_si512();
    for (int l = 0; l < 4; l++) {
        p = _mm512_dpbusd_epi32(p, w[l], _mm512_set1_epi32(a32[l]));
        q = _mm512_dpbusd_epi32(q, w[4 + l], _mm512_set1_epi32(a32[4 + l]));
    }
    return _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(p, q)), _mm512_set1_ps(IQ_MAGIC));
}

#define IQ_NT 6 /* tokens per kernel call: 6 accumulators (+ 6 lane sums for IQ4_XS) in registers */

/* one 16-row group (nb blocks / super-blocks at G) x NT tokens (NT compile-time) */
static inline __attribute__((always_inline)) void
iq_rp_kernel(const int t, const int NT, const uint8_t *G, int64_t nb, const int32_t *const *a32,
             const float *const *da, const int32_t *const *bias, float *const *y, __mmask16 store_mask) {
    const __m512i tbl = iq_table_u8();
    __m512 acc[IQ_NT];
    __m512i w[8];
    for (int u = 0; u < NT; u++) acc[u] = _mm512_setzero_ps();
    if (t == IQ_IQ4_NL) {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *tile = G + b * 288;
            iq_rp_decode(tile, tbl, w);
            const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 256)));
            for (int u = 0; u < NT; u++)
                acc[u] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(da[u][b])),
                                         iq_rp_block_dot(w, a32[u] + 8 * b, bias[u][b]), acc[u]);
        }
    } else {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *tile = G + b * 2208;
            __m512 s[IQ_NT];
            for (int u = 0; u < NT; u++) s[u] = _mm512_setzero_ps();
            for (int ib = 0; ib < 8; ib++) {
                iq_rp_decode(tile + 160 + 256 * ib, tbl, w);
                const __m512 ls = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(tile + 32 + 16 * ib))));
                for (int u = 0; u < NT; u++)
                    s[u] = _mm512_fmadd_ps(iq_rp_block_dot(w, a32[u] + 8 * (8 * b + ib), bias[u][8 * b + ib]), ls, s[u]);
            }
            const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
            for (int u = 0; u < NT; u++) acc[u] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(da[u][b])), s[u], acc[u]);
        }
    }
    for (int u = 0; u < NT; u++) _mm512_mask_storeu_ps(y[u], store_mask, acc[u]);
}
#endif

/* Y[tok, g * 16 + lane] for tokens tok0 + [0, n) of the activations, one 16-row group g.
 * ldy: Y row stride; rows: valid rows of the weight (the last group's mask). */
static void iq_rp_group(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g, const iq_act *act,
                        int64_t tok0, int64_t n, float *Y, int64_t ldy) {
#if SIMD_AVX512_VNNI
    const uint8_t *G = P + g * iq_rp_group_bytes(t, k);
    const int64_t nvalid = rows - g * IQ_RP;
    const __mmask16 m = simd_mask16((int)(nvalid < IQ_RP ? nvalid : IQ_RP));
    const int64_t nb = k / iq_block_size(t);
    const int32_t *a[IQ_NT], *c[IQ_NT];
    const float *d[IQ_NT];
    float *y[IQ_NT];
    for (int64_t j = 0; j < n;) {
        const int nt = n - j >= IQ_NT ? IQ_NT : (int)(n - j);
        for (int u = 0; u < nt; u++) {
            const int64_t tok = tok0 + j + u;
            a[u] = (const int32_t *)(act->qs + tok * k);
            d[u] = act->d + tok * nb;
            c[u] = act->bias + tok * (k / 32);
            y[u] = Y + (j + u) * ldy + g * IQ_RP;
        }
#define IQ_RP_CASES(T)                                                   \
        switch (nt) {                                                    \
        case 1: iq_rp_kernel(T, 1, G, nb, a, d, c, y, m); break;         \
        case 2: iq_rp_kernel(T, 2, G, nb, a, d, c, y, m); break;         \
        case 3: iq_rp_kernel(T, 3, G, nb, a, d, c, y, m); break;         \
        case 4: iq_rp_kernel(T, 4, G, nb, a, d, c, y, m); break;         \
        case 5: iq_rp_kernel(T, 5, G, nb, a, d, c, y, m); break;         \
        default: iq_rp_kernel(T, IQ_NT, G, nb, a, d, c, y, m); break;    \
        }
        if (t == IQ_IQ4_NL) { IQ_RP_CASES(IQ_IQ4_NL) }
        else { IQ_RP_CASES(IQ_IQ4_XS) }
#undef IQ_RP_CASES
        j += nt;
    }
#else
    (void)t; (void)P; (void)k; (void)rows; (void)g; (void)act; (void)tok0; (void)n; (void)Y; (void)ldy;
#endif
}

#endif /* LLMCORE_SIMD_IQUANTS_H */
