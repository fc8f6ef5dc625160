/* K-quants (Q2_K..Q6_K) and MXFP4: exact dequantization and integer dot products.
 *
 * Weights stay in their GGUF block layout. A K-quant super-block (256 values) is
 * unpacked into one canonical form,
 *     value[e] = d * sc[g] * q[e] - dmin * mn[g],   g = e / 16,   q[e] unsigned (0..63)
 * so one integer kernel serves all five types:
 *     dot(w, a) = d*da * sum_g sc[g] * (q . a)_g  -  dmin*da * sum_g mn[g] * bsum_a[g]
 * with the activations quantized like llama.cpp's q8_K (int8, 256 per block, f32
 * scale, per-16 sums). MXFP4 (32 fp4 e2m1 values + e8m0 scale) is unpacked to
 * unsigned q = kvalue + 12 and dotted with q8_0 activations (32 per block, f16 scale):
 *     dot = dw*da * (sum q*a - 12 * sum a).
 * Integer sums are exact, so every SIMD path (AVX-512 VNNI, AVX2, plain C) gives the
 * same integers; float accumulation order is fixed per output (blocks in order).
 */
#ifndef LLMCORE_SIMD_KQUANTS_H
#define LLMCORE_SIMD_KQUANTS_H

#include "simd.h"

/* integer dot kernels: AVX-512 VNNI, else AVX2, else portable C */
#if !SIMD_AVX512_VNNI && defined(__AVX2__)
#define KQ_AVX2 1
#endif

#define KQ_QK 256
enum { KQ_Q2_K = 10, KQ_Q3_K = 11, KQ_Q4_K = 12, KQ_Q5_K = 13, KQ_Q6_K = 14, KQ_MXFP4 = 39 };

static inline const char *kq_simd_name(void) {
#if SIMD_AVX512_VNNI
    return "avx512vnni";
#elif defined(KQ_AVX2)
    return "avx2";
#else
    return "c";
#endif
}

/* bytes per block and values per block */
static inline int kq_type_size(int t) {
    switch (t) {
    case KQ_Q2_K: return 84;
    case KQ_Q3_K: return 110;
    case KQ_Q4_K: return 144;
    case KQ_Q5_K: return 176;
    case KQ_Q6_K: return 210;
    case KQ_MXFP4: return 17;
    default: return 0;
    }
}
static inline int kq_block_size(int t) { return t == KQ_MXFP4 ? 32 : (kq_type_size(t) ? KQ_QK : 0); }

/* ---------------------------------------------------------------------------------- */
/* canonical unpacked K-quant super-block                                              */
/* ---------------------------------------------------------------------------------- */
typedef struct {
    int16_t sc[16];     /* per-16 scale (signed for Q3_K/Q6_K) */
    int16_t mn[16];     /* per-16 "min", multiplies the activation block sums */
    uint8_t q[KQ_QK];   /* unsigned quant values */
    float d, dmin;
    int off;            /* signed offset used by exact dequantization (Q3_K 4, Q6_K 32) */
} kq_sb;

static inline void kq_scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#if defined(KQ_AVX2)
/* the q bytes of a Q4_K / Q5_K / Q6_K super-block, 32 at a time (the scalar loops' bytes:
 * a decode unpacks each super-block for one token, so these loops were its cost) */
static inline void kq_unpack_q_avx2(int t, const uint8_t *b, uint8_t *q) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    if (t == KQ_Q4_K) {
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
            _mm256_storeu_si256((__m256i *)(q + 64 * c), _mm256_and_si256(v, m4));
            _mm256_storeu_si256((__m256i *)(q + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        }
    } else if (t == KQ_Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * c));
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4);
            _mm256_storeu_si256((__m256i *)(q + 64 * c), _mm256_or_si256(_mm256_and_si256(v, m4), h0));
            _mm256_storeu_si256((__m256i *)(q + 64 * c + 32),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), h1));
        }
    } else { /* Q6_K */
        for (int c = 0; c < 2; c++) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * c));
            const __m256i a = _mm256_loadu_si256((const __m256i *)(b + 64 * c));
            const __m256i bb = _mm256_loadu_si256((const __m256i *)(b + 64 * c + 32));
            for (int k = 0; k < 4; k++) {
                const __m256i lo = k & 1 ? bb : a;
                const __m256i n = k < 2 ? _mm256_and_si256(lo, m4) : _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
                const __m256i hk = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m3), 4);
                _mm256_storeu_si256((__m256i *)(q + 128 * c + 32 * k), _mm256_or_si256(n, hk));
            }
        }
    }
}
#endif

static inline void kq_unpack_q4_k(const uint8_t *b, kq_sb *o) {
    o->d = simd_load_f16(b);
    o->dmin = simd_load_f16(b + 2);
    o->off = 0;
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kq_scale_min_k4(j, s, &sc, &m);
        o->sc[2 * j] = o->sc[2 * j + 1] = sc;
        o->mn[2 * j] = o->mn[2 * j + 1] = (int16_t)m;
    }
#if defined(KQ_AVX2)
    (void)qs;
    kq_unpack_q_avx2(KQ_Q4_K, b, o->q);
#else
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            uint8_t v = qs[c * 32 + l];
            o->q[c * 64 + l] = v & 0xF;
            o->q[c * 64 + 32 + l] = v >> 4;
        }
#endif
}

static inline void kq_unpack_q5_k(const uint8_t *b, kq_sb *o) {
    o->d = simd_load_f16(b);
    o->dmin = simd_load_f16(b + 2);
    o->off = 0;
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kq_scale_min_k4(j, s, &sc, &m);
        o->sc[2 * j] = o->sc[2 * j + 1] = sc;
        o->mn[2 * j] = o->mn[2 * j + 1] = (int16_t)m;
    }
#if defined(KQ_AVX2)
    (void)qs; (void)qh;
    kq_unpack_q_avx2(KQ_Q5_K, b, o->q);
    return;
#endif
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            uint8_t v = qs[c * 32 + l], h = qh[l];
            o->q[c * 64 + l] = (v & 0xF) | (((h >> (2 * c)) & 1) << 4);
            o->q[c * 64 + 32 + l] = (v >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
        }
}

static inline void kq_unpack_q6_k(const uint8_t *b, kq_sb *o) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *s = (const int8_t *)(b + 192);
    o->d = simd_load_f16(b + 208);
    o->dmin = o->d;
    o->off = 32;
    for (int g = 0; g < 16; g++) {
        o->sc[g] = s[g];
        o->mn[g] = (int16_t)(32 * s[g]);
    }
#if defined(KQ_AVX2)
    (void)ql; (void)qh;
    kq_unpack_q_avx2(KQ_Q6_K, b, o->q);
    return;
#endif
    for (int c = 0; c < 2; c++)
        for (int l = 0; l < 32; l++) {
            uint8_t h = qh[c * 32 + l];
            uint8_t a = ql[c * 64 + l], bb = ql[c * 64 + 32 + l];
            o->q[c * 128 + l] = (a & 0xF) | ((h & 3) << 4);
            o->q[c * 128 + 32 + l] = (bb & 0xF) | (((h >> 2) & 3) << 4);
            o->q[c * 128 + 64 + l] = (a >> 4) | (((h >> 4) & 3) << 4);
            o->q[c * 128 + 96 + l] = (bb >> 4) | (((h >> 6) & 3) << 4);
        }
}

static inline void kq_unpack_q3_k(const uint8_t *b, kq_sb *o) {
    const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
    o->d = simd_load_f16(b + 108);
    o->dmin = o->d;
    o->off = 4;
    for (int j = 0; j < 16; j++) {
        int lo = (s[j % 8] >> (4 * (j / 8))) & 0xF;
        int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        int sc = (lo | (hi << 4)) - 32;
        o->sc[j] = sc;
        o->mn[j] = (int16_t)(4 * sc);
    }
    for (int c = 0; c < 2; c++)
        for (int sh = 0; sh < 4; sh++)
            for (int l = 0; l < 32; l++) {
                int e = c * 128 + sh * 32 + l;
                int ql = (qs[c * 32 + l] >> (2 * sh)) & 3;
                int h = (hm[l] >> (c * 4 + sh)) & 1;
                o->q[e] = (uint8_t)(ql + 4 * h);
            }
}

static inline void kq_unpack_q2_k(const uint8_t *b, kq_sb *o) {
    const uint8_t *s = b, *qs = b + 16;
    o->d = simd_load_f16(b + 80);
    o->dmin = simd_load_f16(b + 82);
    o->off = 0;
    for (int g = 0; g < 16; g++) {
        o->sc[g] = s[g] & 0xF;
        o->mn[g] = s[g] >> 4;
    }
    for (int c = 0; c < 2; c++)
        for (int sh = 0; sh < 4; sh++)
            for (int l = 0; l < 32; l++)
                o->q[c * 128 + sh * 32 + l] = (qs[c * 32 + l] >> (2 * sh)) & 3;
}

static inline void kq_unpack(int t, const uint8_t *b, kq_sb *o) {
    switch (t) {
    case KQ_Q4_K: kq_unpack_q4_k(b, o); break;
    case KQ_Q6_K: kq_unpack_q6_k(b, o); break;
    case KQ_Q5_K: kq_unpack_q5_k(b, o); break;
    case KQ_Q3_K: kq_unpack_q3_k(b, o); break;
    case KQ_Q2_K: kq_unpack_q2_k(b, o); break;
    default: memset(o, 0, sizeof(*o));
    }
}

/* ---------------------------------------------------------------------------------- */
/* exact dequantization (same float ops, same order as gguf.quants; no FMA contraction) */
/* ---------------------------------------------------------------------------------- */
__attribute__((optimize("fp-contract=off")))
static void kq_dequant_sb(const kq_sb *w, float *out) {
    if (w->off) { /* Q3_K, Q6_K: (d*sc) * (q - off) */
        for (int g = 0; g < 16; g++) {
            float dl = w->d * (float)w->sc[g];
            for (int i = 0; i < 16; i++) out[g * 16 + i] = dl * (float)((int)w->q[g * 16 + i] - w->off);
        }
    } else { /* Q2_K, Q4_K, Q5_K: (d*sc) * q - (dmin*m) */
        for (int g = 0; g < 16; g++) {
            float dl = w->d * (float)w->sc[g];
            float ml = w->dmin * (float)w->mn[g];
            for (int i = 0; i < 16; i++) {
                out[g * 16 + i] = dl * (float)w->q[g * 16 + i] - ml;
            }
        }
    }
}

static const int8_t kq_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float kq_e8m0_half(uint8_t x) {
    uint32_t bits = x < 2 ? (0x00200000u << x) : ((uint32_t)(x - 1) << 23);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

__attribute__((optimize("fp-contract=off")))
static void kq_dequant_mxfp4_block(const uint8_t *b, float *out) {
    float d = kq_e8m0_half(b[0]);
    for (int l = 0; l < 16; l++) {
        out[l] = d * (float)kq_mxfp4_values[b[1 + l] & 0xF];
        out[16 + l] = d * (float)kq_mxfp4_values[b[1 + l] >> 4];
    }
}

/* dequantize nblocks consecutive blocks of type t */
static void kq_dequant_blocks(int t, const uint8_t *src, int64_t nblocks, float *dst) {
    int ts = kq_type_size(t);
    if (t == KQ_MXFP4) {
        for (int64_t i = 0; i < nblocks; i++) kq_dequant_mxfp4_block(src + i * ts, dst + i * 32);
        return;
    }
    kq_sb sb;
    for (int64_t i = 0; i < nblocks; i++) {
        kq_unpack(t, src + i * ts, &sb);
        kq_dequant_sb(&sb, dst + i * KQ_QK);
    }
}

/* ---------------------------------------------------------------------------------- */
/* activation quantization                                                             */
/* ---------------------------------------------------------------------------------- */
typedef struct {
    float d;
    int8_t qs[KQ_QK];
    int16_t bsums[16];
} kq_q8k;   /* llama.cpp block_q8_K, 292 bytes */

static inline int kq_nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* quantize_row_q8_K_ref: iscale = -127/max (signed value of largest magnitude, first one) */
static void kq_quantize_q8k(const float *x, int64_t k, kq_q8k *y) {
#if SIMD_AVX512_VNNI
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < k / KQ_QK; i++, x += KQ_QK) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++) m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(x + 16 * j), absm));
        const float amax = _mm512_reduce_max_ps(m);
        if (!(amax > 0)) {
            y[i].d = 0;
            memset(y[i].qs, 0, KQ_QK);
            memset(y[i].bsums, 0, sizeof(y[i].bsums));
            continue;
        }
        float mx = 0;
        for (int j = 0; j < 16; j++) {
            __mmask16 e = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_loadu_ps(x + 16 * j), absm), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (e) { mx = x[16 * j + __builtin_ctz(e)]; break; }
        }
        const float iscale = -127.f / mx;
        const __m512 is = _mm512_set1_ps(iscale), lim = _mm512_set1_ps(127.f);
        for (int j = 0; j < 16; j++) {
            __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(is, _mm512_loadu_ps(x + 16 * j)),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(v, lim));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * j), _mm512_cvtsepi32_epi8(q));
            y[i].bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        y[i].d = 1 / iscale;
    }
#elif defined(KQ_AVX2)
    /* the C loop's arithmetic in lanes (round to nearest even = kq_nearest_int's), ~6% of a
     * many-token K-quant matmul in the C form */
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), lim = _mm256_set1_ps(127.f);
    for (int64_t i = 0; i < k / KQ_QK; i++, x += KQ_QK) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 32; j++) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + 8 * j), absm));
        const float amax = simd_hmax_f32x8(m);
        if (amax == 0) {
            y[i].d = 0;
            memset(y[i].qs, 0, KQ_QK);
            memset(y[i].bsums, 0, sizeof(y[i].bsums));
            continue;
        }
        float mx = 0; /* the first value of largest magnitude, with its sign */
        for (int j = 0; j < 32; j++) {
            const int e = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * j), absm),
                                                           _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (e) { mx = x[8 * j + __builtin_ctz((unsigned)e)]; break; }
        }
        const float iscale = -127.f / mx;
        const __m256 is = _mm256_set1_ps(iscale);
        for (int j = 0; j < 32; j += 4) {
            __m256i q[4];
            for (int u = 0; u < 4; u++) {
                const __m256 v = _mm256_round_ps(_mm256_mul_ps(is, _mm256_loadu_ps(x + 8 * (j + u))),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q[u] = _mm256_cvtps_epi32(_mm256_min_ps(v, lim));
            }
            _mm256_storeu_si256((__m256i *)(y[i].qs + 8 * j), simd_pack_i8x32(q[0], q[1], q[2], q[3]));
            y[i].bsums[j / 2] = (int16_t)simd_hsum_i32x8(_mm256_add_epi32(q[0], q[1]));
            y[i].bsums[j / 2 + 1] = (int16_t)simd_hsum_i32x8(_mm256_add_epi32(q[2], q[3]));
        }
        y[i].d = 1 / iscale;
    }
#else
    for (int64_t i = 0; i < k / KQ_QK; i++, x += KQ_QK) {
        float mx = 0, amax = 0;
        for (int j = 0; j < KQ_QK; j++) {
            float ax = x[j] < 0 ? -x[j] : x[j];
            if (ax > amax) { amax = ax; mx = x[j]; }
        }
        if (amax == 0) {
            y[i].d = 0;
            memset(y[i].qs, 0, KQ_QK);
            memset(y[i].bsums, 0, sizeof(y[i].bsums));
            continue;
        }
        const float iscale = -127.f / mx;
        for (int j = 0; j < KQ_QK; j++) {
            int v = kq_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[g * 16 + l];
            y[i].bsums[g] = (int16_t)s;
        }
        y[i].d = 1 / iscale;
    }
#endif
}

/* q8_0 as llama.cpp's x86 path: d = amax/127, q = round_half_even(x * 127/amax)... the
 * x86 kernel multiplies by id = 1/d; the value used in dots is fp16(d). */
static void kq_quantize_q8_0(const float *x, int64_t k, int8_t *qs, float *d) {
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) {
            float ax = x[j] < 0 ? -x[j] : x[j];
            amax = ax > amax ? ax : amax;
        }
        const float dd = amax / 127.f;
        const float id = amax != 0 ? 127.f / amax : 0.f;
        for (int j = 0; j < 32; j++) qs[i * 32 + j] = (int8_t)kq_nearest_int(x[j] * id);
        d[i] = simd_f16_round(dd);
    }
}

/* ---------------------------------------------------------------------------------- */
/* dot products                                                                        */
/* ---------------------------------------------------------------------------------- */
/* integer parts of one super-block dot: isum = sum_g sc[g]*(q.a)_g, msum = sum_g mn[g]*bsum[g] */
static inline void kq_dot_sb_int(const kq_sb *w, const kq_q8k *a, int32_t *isum, int32_t *msum) {
#if defined(KQ_AVX2) || SIMD_AVX512_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int i = 0; i < 8; i++) {
        __m256i p = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(w->q + 32 * i)),
                                 _mm256_loadu_si256((const __m256i *)(a->qs + 32 * i))), ones);
        __m256i s = _mm256_setr_epi32(w->sc[2 * i], w->sc[2 * i], w->sc[2 * i], w->sc[2 * i],
                                      w->sc[2 * i + 1], w->sc[2 * i + 1], w->sc[2 * i + 1], w->sc[2 * i + 1]);
        acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p, s));
    }
    *isum = simd_hsum_i32x8(acc);
    *msum = simd_hsum_i32x8(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)w->mn),
                                         _mm256_loadu_si256((const __m256i *)a->bsums)));
#else
    int32_t is = 0, ms = 0;
    for (int g = 0; g < 16; g++) {
        int32_t s = 0;
        for (int l = 0; l < 16; l++) s += (int32_t)w->q[g * 16 + l] * a->qs[g * 16 + l];
        is += s * w->sc[g];
        ms += (int32_t)w->mn[g] * a->bsums[g];
    }
    *isum = is;
    *msum = ms;
#endif
}

/* a super-block's float contribution from its integer parts */
static inline float kq_sb_float_f(float ad, float d, float dmin, float is, float ms) {
#if defined(__FMA__)
    /* one fma, spelled out: the AVX2 kernels do the same lane by lane for 8 tokens at once,
     * and gcc's own contraction of the expression below need not match theirs */
    return fmaf(ad * d, is, -((ad * dmin) * ms));
#else
    return (ad * d) * is - (ad * dmin) * ms;
#endif
}
static inline float kq_sb_float_d(float ad, float d, float dmin, int32_t is, int32_t ms) {
    return kq_sb_float_f(ad, d, dmin, (float)is, (float)ms);
}
#if defined(KQ_AVX2)
/* the float contribution of a super-block from the 8-lane int32 vectors of its dot (is) and
 * mins (ms) parts: both reduced in one tree and converted in the vector unit (a scalar
 * cvtsi2ss merges into a register gcc picks, and that false dependency chained the
 * super-blocks; the same values, so the same bits) */
static inline float kq_sb_float_v(float ad, float d, float dmin, __m256i isv, __m256i msv) {
    const __m256i h = _mm256_hadd_epi32(isv, msv);          /* is01 is23 ms01 ms23 | is45 is67 ms45 ms67 */
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    r = _mm_hadd_epi32(r, r);                                 /* is, ms, is, ms */
    const __m128 f = _mm_cvtepi32_ps(r);
    return kq_sb_float_f(ad, d, dmin, _mm_cvtss_f32(f), _mm_cvtss_f32(_mm_shuffle_ps(f, f, 1)));
}
#endif
static inline float kq_sb_float(const kq_sb *w, const kq_q8k *a, int32_t is, int32_t ms) {
    return kq_sb_float_d(a->d, w->d, w->dmin, is, ms);
}

static inline float kq_dot_sb(const kq_sb *w, const kq_q8k *a) {
    int32_t is, ms;
    kq_dot_sb_int(w, a, &is, &ms);
    return kq_sb_float(w, a, is, ms);
}

/* MXFP4 row unpacked: q[k] = kvalue + 12 (0..24), dw[k/32] */
static inline void kq_unpack_mxfp4_row(const uint8_t *b, int64_t nblk, uint8_t *q, float *dw) {
    for (int64_t i = 0; i < nblk; i++, b += 17) {
        dw[i] = kq_e8m0_half(b[0]);
        for (int l = 0; l < 16; l++) {
            q[i * 32 + l] = (uint8_t)(kq_mxfp4_values[b[1 + l] & 0xF] + 12);
            q[i * 32 + 16 + l] = (uint8_t)(kq_mxfp4_values[b[1 + l] >> 4] + 12);
        }
    }
}

/* dot of an unpacked MXFP4 row with a q8_0 row (nblk blocks of 32) */
static inline float kq_dot_mxfp4(const uint8_t *q, const float *dw, const int8_t *a, const float *da, int64_t nblk) {
    int64_t i = 0;
    float tail = 0.f;
#if SIMD_AVX512_VNNI
    const __m512i twelve = _mm512_set1_epi8(12);
    __m512 acc = _mm512_setzero_ps();
    for (; i + 2 <= nblk; i += 2) {
        __m512i av = _mm512_loadu_si512((const void *)(a + i * 32));
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512((const void *)(q + i * 32)), av);
        __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), twelve, av);
        __m512 s = _mm512_insertf32x8(_mm512_set1_ps(dw[i] * da[i]), _mm256_set1_ps(dw[i + 1] * da[i + 1]), 1);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(p, c)), s, acc);
    }
    float vsum = _mm512_reduce_add_ps(acc);
#elif defined(KQ_AVX2)
    const __m256i twelve = _mm256_set1_epi8(12), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (; i < nblk; i++) {
        __m256i av = _mm256_loadu_si256((const __m256i *)(a + i * 32));
        __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(q + i * 32)), av),
                                     _mm256_maddubs_epi16(twelve, av));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), _mm256_set1_ps(dw[i] * da[i]), acc);
    }
    float vsum = simd_hsum_f32x8(acc);
#else
    float vsum = 0.f;
#endif
    for (; i < nblk; i++) {
        int32_t s = 0;
        for (int l = 0; l < 32; l++) s += ((int32_t)q[i * 32 + l] - 12) * a[i * 32 + l];
        tail += (dw[i] * da[i]) * (float)s;
    }
    return vsum + tail;
}

/* ---------------------------------------------------------------------------------- */
/* row-range matmul drivers: Y[t, r] = sum_k W[r, k] * X[t, k] for r in [r0, r1)        */
/* ---------------------------------------------------------------------------------- */
#define KQ_TOK_TILE 64

#if SIMD_AVX512_VNNI
/* One K-quant super-block held in registers: q[k] = unsigned values 64k..64k+63,
 * sc[k] = int16 scale per int16 lane of maddubs(q[k], a) (group of the lane's values),
 * mn = the 16 per-16 mins as int16. dot = d*da*sum(madd(maddubs(q,a),sc)) - dmin*da*(mn.bsums) */
typedef struct {
    __m512i q[4], sc[4];
    __m256i mn;
    float d, dmin;
} kq_reg;

static inline __m512i kq_sc_idx(int k) {
    return _mm512_add_epi16(_mm512_set1_epi16((short)(4 * k)),
        _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                         1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
}

/* sc16: the 16 per-16 scales as int16 */
static inline void kq_reg_scales(__m256i sc16, kq_reg *r) {
    const __m512i s = _mm512_castsi256_si512(sc16);
    for (int k = 0; k < 4; k++) r->sc[k] = _mm512_permutexvar_epi16(kq_sc_idx(k), s);
}

static inline void kq_prep_sb(const kq_sb *sb, kq_reg *r) {
    for (int k = 0; k < 4; k++) r->q[k] = _mm512_loadu_si512((const void *)(sb->q + 64 * k));
    kq_reg_scales(_mm256_loadu_si256((const __m256i *)sb->sc), r);
    r->mn = _mm256_loadu_si256((const __m256i *)sb->mn);
    r->d = sb->d;
    r->dmin = sb->dmin;
}

/* 8 uint8 (in the low 64 bits) -> 16 int16, each repeated twice */
static inline __m256i kq_dup8(uint64_t v) {
    __m128i x = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)v));
    return _mm256_set_m128i(_mm_unpackhi_epi16(x, x), _mm_unpacklo_epi16(x, x));
}

static inline void kq_prep_q4_k(const uint8_t *b, kq_reg *r, int five) {
    uint32_t u[4];
    memcpy(u, b + 4, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    const uint32_t ua = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = ua;
    u[0] &= m1;
    uint64_t scs = (uint64_t)u[0] | ((uint64_t)u[1] << 32), mns = (uint64_t)u[2] | ((uint64_t)u[3] << 32);
    kq_reg_scales(kq_dup8(scs), r);
    r->mn = kq_dup8(mns);
    r->d = simd_load_f16(b);
    r->dmin = simd_load_f16(b + 2);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (!five) {
        for (int c = 0; c < 4; c++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
            r->q[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, m4)),
                                         _mm256_and_si256(_mm256_srli_epi16(x, 4), m4), 1);
        }
    } else {
        const __m256i one = _mm256_set1_epi8(1);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        for (int c = 0; c < 4; c++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * c));
            __m256i hl = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4);
            __m256i hh = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4);
            r->q[c] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_or_si256(_mm256_and_si256(x, m4), hl)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4), hh), 1);
        }
    }
}

static inline void kq_prep_q6_k(const uint8_t *b, kq_reg *r) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int c = 0; c < 2; c++) {
        __m512i ql = _mm512_loadu_si512((const void *)(b + 64 * c));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * c));
        __m512i h0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(qh, m2)),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 1);
        __m512i h1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2)),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 1);
        r->q[2 * c] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(h0, 4));
        r->q[2 * c + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_slli_epi16(h1, 4));
    }
    __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    kq_reg_scales(sc, r);
    r->mn = _mm256_slli_epi16(sc, 5);
    r->d = r->dmin = simd_load_f16(b + 208);
}

static inline __attribute__((always_inline)) void kq_prep(int t, const uint8_t *b, kq_reg *r) {
    if (t == KQ_Q4_K) kq_prep_q4_k(b, r, 0);
    else if (t == KQ_Q5_K) kq_prep_q4_k(b, r, 1);
    else if (t == KQ_Q6_K) kq_prep_q6_k(b, r);
    else {
        kq_sb sb;
        kq_unpack(t, b, &sb);
        kq_prep_sb(&sb, r);
    }
}

static inline __attribute__((always_inline)) void
kq_rows_avx512(const int t, const uint8_t *W, int64_t row_stride, int64_t r0, int64_t r1,
               int64_t nb, const kq_q8k *A, int64_t n, float *Y, int64_t ldy) {
    const int ts = kq_type_size(t);
    kq_reg w;
    __m512 accf[KQ_TOK_TILE];
    __m256 accm[KQ_TOK_TILE];
    for (int64_t t0 = 0; t0 < n; t0 += KQ_TOK_TILE) {
        const int64_t nt = n - t0 < KQ_TOK_TILE ? n - t0 : KQ_TOK_TILE;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = W + r * row_stride;
            for (int64_t j = 0; j < nt; j++) {
                accf[j] = _mm512_setzero_ps();
                accm[j] = _mm256_setzero_ps();
            }
            for (int64_t b = 0; b < nb; b++) {
                kq_prep(t, wr + b * ts, &w);
                const kq_q8k *ab = A + t0 * nb + b;
                for (int64_t j = 0; j < nt; j++, ab += nb) {
                    const __m512i *aq = (const __m512i *)ab->qs;
                    __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(w.q[0], _mm512_loadu_si512(aq)), w.sc[0]);
                    p = _mm512_add_epi32(p, _mm512_madd_epi16(_mm512_maddubs_epi16(w.q[1], _mm512_loadu_si512(aq + 1)), w.sc[1]));
                    p = _mm512_add_epi32(p, _mm512_madd_epi16(_mm512_maddubs_epi16(w.q[2], _mm512_loadu_si512(aq + 2)), w.sc[2]));
                    p = _mm512_add_epi32(p, _mm512_madd_epi16(_mm512_maddubs_epi16(w.q[3], _mm512_loadu_si512(aq + 3)), w.sc[3]));
                    __m256i m = _mm256_madd_epi16(w.mn, _mm256_loadu_si256((const __m256i *)ab->bsums));
                    accf[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(ab->d * w.d), accf[j]);
                    accm[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(ab->d * w.dmin), accm[j]);
                }
            }
            for (int64_t j = 0; j < nt; j++)
                Y[(t0 + j) * ldy + r] = _mm512_reduce_add_ps(accf[j]) - simd_hsum_f32x8(accm[j]);
        }
    }
}
#endif

#if defined(KQ_AVX2)
/* a super-block's 8 scale vectors (int16 lanes 0-7: sc[2i], 8-15: sc[2i+1]), made once and
 * used for every token: madd by them replaces madd-by-ones + mullo (exact: pair sums of
 * maddubs are <= 63 * 127 * 2, times |sc| <= 128, in int32) */
/* chunk i's scale vector from the 16 int16 scales S: lanes 0-7 sc[2i], 8-15 sc[2i+1] */
static inline __m256i kq_sc16_chunk(__m256i S, int i) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(S, _mm256_set1_epi32(i)), pick);
}
static inline void kq_sc16_avx2(const kq_sb *w, __m256i *s) {
    const __m256i S = _mm256_loadu_si256((const __m256i *)w->sc);
    for (int i = 0; i < 8; i++) s[i] = kq_sc16_chunk(S, i);
}

/* the 8 int32 lanes whose sum is isum of an unpacked super-block with a q8_K block (two
 * chains, for the latency) */
static inline __m256i kq_isum_sb_avx2(const kq_sb *w, const __m256i *sc16, const kq_q8k *a) {
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
    for (int i = 0; i < 8; i += 2) {
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_maddubs_epi16(
            _mm256_loadu_si256((const __m256i *)(w->q + 32 * i)), _mm256_loadu_si256((const __m256i *)(a->qs + 32 * i))), sc16[i]));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_maddubs_epi16(
            _mm256_loadu_si256((const __m256i *)(w->q + 32 * i + 32)), _mm256_loadu_si256((const __m256i *)(a->qs + 32 * i + 32))), sc16[i + 1]));
    }
    return _mm256_add_epi32(acc0, acc1);
}

static inline float kq_dot_sb_avx2(const kq_sb *w, const __m256i *sc16, const kq_q8k *a) {
    return kq_sb_float_v(a->d, w->d, w->dmin, kq_isum_sb_avx2(w, sc16, a),
                         _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)w->mn),
                                           _mm256_loadu_si256((const __m256i *)a->bsums)));
}
#endif

/* A Q4_K / Q6_K super-block (GGUF bytes b) dotted with a q8_K block, straight from the
 * GGUF bytes: the scales decoded into vectors in registers (kq_unpack's struct, written by
 * scalar stores and read back as vectors, stalled each super-block on store forwarding: a
 * decode's Q4_K / Q6_K matvec ran at ~3 GB/s in cache), the quants unpacked as they are
 * used. The same integers as kq_dot_sb_avx2 (exact sums) through the same float formula,
 * so the same bits. */
#if defined(KQ_AVX2)
static inline float kq_dot_q4k_avx2(const uint8_t *b, const kq_q8k *a) {
    /* scales and mins, 6 bits each in 12 bytes (llama.cpp's unpacking of the k4 scales) */
    uint32_t u[4];
    memcpy(u, b + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const uint32_t m1 = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = m1;
    u[0] &= 0x3f3f3f3fu;
    const __m128i sm = _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]);  /* sc[0..7], mn[0..7] */
    const __m256i S = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));             /* sc as int16, twice */
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
        const __m256i plo = _mm256_maddubs_epi16(_mm256_and_si256(v, m4), _mm256_loadu_si256((const __m256i *)(a->qs + 64 * c)));
        const __m256i phi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                                 _mm256_loadu_si256((const __m256i *)(a->qs + 64 * c + 32)));
        /* int16 lanes of sub-block 2c's scale, then 2c + 1's */
        const __m256i s0 = _mm256_shuffle_epi8(S, _mm256_set1_epi16((short)((4 * c + 1) << 8 | (4 * c))));
        const __m256i s1 = _mm256_shuffle_epi8(S, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(plo, s0), _mm256_madd_epi16(phi, s1)));
    }
    /* mins: each of the 8 twice (the canonical 16 groups), against the 16 bsums */
    const __m128i mn8 = _mm_srli_si128(sm, 8);
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
    return kq_sb_float_v(a->d, simd_load_f16(b), simd_load_f16(b + 2), acc,
                         _mm256_madd_epi16(mn16, _mm256_loadu_si256((const __m256i *)a->bsums)));
}

static inline float kq_dot_q6k_avx2(const uint8_t *b, const kq_q8k *a) {
    const __m256i S = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));  /* 16 int16 scales */
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 2; c++) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * c));
        const __m256i A = _mm256_loadu_si256((const __m256i *)(b + 64 * c));
        const __m256i B = _mm256_loadu_si256((const __m256i *)(b + 64 * c + 32));
        for (int k = 0; k < 4; k++) {
            const int i = 4 * c + k;  /* 32-value chunk: groups 2i, 2i + 1 */
            const __m256i lo = k & 1 ? B : A;
            const __m256i n = k < 2 ? _mm256_and_si256(lo, m4) : _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
            const __m256i q = _mm256_or_si256(n, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m3), 4));
            const __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)(a->qs + 32 * i)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, kq_sc16_chunk(S, i)));
        }
    }
    const float d = simd_load_f16(b + 208);
    return kq_sb_float_v(a->d, d, d, acc, _mm256_madd_epi16(_mm256_slli_epi16(S, 5), _mm256_loadu_si256((const __m256i *)a->bsums)));
}
#endif

#if defined(KQ_AVX2)
/* acc[0..7] += the dots of 8 tokens (a, a + nb, ...) with an unpacked super-block: the
 * integer sums reduced for all 8 in one transposing tree, the float update in lanes, each
 * lane kq_sb_float_f's operations (so the same bits as kq_dot_sb_avx2, token by token) */
static inline void kq_dot_sb8_avx2(const kq_sb *w, const __m256i *sc16, const kq_q8k *a, int64_t nb, float *acc) {
    __m256i is[8], ms[8];
    const __m256i mn = _mm256_loadu_si256((const __m256i *)w->mn);
    for (int u = 0; u < 8; u++) {
        is[u] = kq_isum_sb_avx2(w, sc16, a + u * nb);
        ms[u] = _mm256_madd_epi16(mn, _mm256_loadu_si256((const __m256i *)a[u * nb].bsums));
    }
    const __m256 isf = _mm256_cvtepi32_ps(simd_hsum8x8_i32(is)), msf = _mm256_cvtepi32_ps(simd_hsum8x8_i32(ms));
    const __m256 ad = _mm256_setr_ps(a[0].d, a[nb].d, a[2 * nb].d, a[3 * nb].d, a[4 * nb].d, a[5 * nb].d,
                                     a[6 * nb].d, a[7 * nb].d);
    const __m256 p = _mm256_mul_ps(ad, _mm256_set1_ps(w->d)), q = _mm256_mul_ps(ad, _mm256_set1_ps(w->dmin));
    const __m256 neg = _mm256_xor_ps(_mm256_mul_ps(q, msf), _mm256_set1_ps(-0.0f));
    _mm256_storeu_ps(acc, _mm256_add_ps(_mm256_loadu_ps(acc), _mm256_fmadd_ps(p, isf, neg)));
}
#endif

/* W: row r at W + r*row_stride; A: n tokens x nb blocks of q8_K; Y row-major ldy */
static void kq_matmul_rows(int t, const uint8_t *W, int64_t row_stride, int64_t r0, int64_t r1,
                           int64_t nb, const kq_q8k *A, int64_t n, float *Y, int64_t ldy) {
#if SIMD_AVX512_VNNI
    switch (t) {
    case KQ_Q4_K: kq_rows_avx512(KQ_Q4_K, W, row_stride, r0, r1, nb, A, n, Y, ldy); return;
    case KQ_Q6_K: kq_rows_avx512(KQ_Q6_K, W, row_stride, r0, r1, nb, A, n, Y, ldy); return;
    case KQ_Q5_K: kq_rows_avx512(KQ_Q5_K, W, row_stride, r0, r1, nb, A, n, Y, ldy); return;
    default: kq_rows_avx512(t, W, row_stride, r0, r1, nb, A, n, Y, ldy); return;
    }
#else
    const int ts = kq_type_size(t);
    kq_sb sb;
    float acc[KQ_TOK_TILE];
    for (int64_t t0 = 0; t0 < n; t0 += KQ_TOK_TILE) {
        const int64_t nt = n - t0 < KQ_TOK_TILE ? n - t0 : KQ_TOK_TILE;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = W + r * row_stride;
            for (int64_t j = 0; j < nt; j++) acc[j] = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                const kq_q8k *ab = A + t0 * nb + b;
#if defined(KQ_AVX2)
                /* below 8 tokens Q4_K / Q6_K are read from the GGUF bytes, not unpacked first
                 * (Q4_K 2.6x at 1 token, 1.2x at 4; Q6_K 1.6x at 1); from 8 on the unpack
                 * shared by the tokens and the 8-lane update win (Q6_K 1.16x at 64) */
                if ((t == KQ_Q6_K || t == KQ_Q4_K) && nt < 8) {
                    const uint8_t *wb = wr + b * ts;
                    if (t == KQ_Q4_K)
                        for (int64_t j = 0; j < nt; j++) acc[j] += kq_dot_q4k_avx2(wb, ab + j * nb);
                    else
                        for (int64_t j = 0; j < nt; j++) acc[j] += kq_dot_q6k_avx2(wb, ab + j * nb);
                    continue;
                }
                kq_unpack(t, wr + b * ts, &sb);
                __m256i sc16[8];
                kq_sc16_avx2(&sb, sc16);
                int64_t j = 0;
                for (; j + 8 <= nt; j += 8) kq_dot_sb8_avx2(&sb, sc16, ab + j * nb, nb, acc + j);
                for (; j < nt; j++) acc[j] += kq_dot_sb_avx2(&sb, sc16, ab + j * nb);
#else
                kq_unpack(t, wr + b * ts, &sb);
                for (int64_t j = 0; j < nt; j++) acc[j] += kq_dot_sb(&sb, ab + j * nb);
#endif
            }
            for (int64_t j = 0; j < nt; j++) Y[(t0 + j) * ldy + r] = acc[j];
        }
    }
#endif
}

/* MXFP4: A is n x k int8, DA is n x (k/32) float; scratch holds k bytes + k/32 floats */
static void kq_matmul_rows_mxfp4(const uint8_t *W, int64_t row_stride, int64_t r0, int64_t r1,
                                 int64_t k, const int8_t *A, const float *DA, int64_t n,
                                 float *Y, int64_t ldy, uint8_t *qbuf, float *dwbuf) {
    const int64_t nblk = k / 32;
#if SIMD_AVX512_VNNI
    (void)qbuf;
    (void)dwbuf;
    /* kvalues + 12 in every 128-bit lane */
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                             12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i m4 = _mm512_set1_epi8(0x0F), twelve = _mm512_set1_epi8(12);
    const int64_t npair = nblk / 2;
    __m512 acc[KQ_TOK_TILE];
    float tail[KQ_TOK_TILE];
    for (int64_t t0 = 0; t0 < n; t0 += KQ_TOK_TILE) {
        const int64_t nt = n - t0 < KQ_TOK_TILE ? n - t0 : KQ_TOK_TILE;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = W + r * row_stride;
            for (int64_t j = 0; j < nt; j++) {
                acc[j] = _mm512_setzero_ps();
                tail[j] = 0.f;
            }
            for (int64_t pi = 0; pi < npair; pi++) {
                const uint8_t *b = wr + pi * 34;
                __m128i x0 = _mm_loadu_si128((const __m128i *)(b + 1));
                __m128i x1 = _mm_loadu_si128((const __m128i *)(b + 18));
                __m512i v = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set_m128i(_mm_srli_epi16(x0, 4), x0)),
                    _mm256_set_m128i(_mm_srli_epi16(x1, 4), x1), 1);
                const __m512i q = _mm512_shuffle_epi8(tbl, _mm512_and_si512(v, m4));
                const float dw0 = kq_e8m0_half(b[0]), dw1 = kq_e8m0_half(b[17]);
                const int8_t *ap = A + t0 * k + pi * 64;
                const float *dp = DA + t0 * nblk + 2 * pi;
                for (int64_t j = 0; j < nt; j++, ap += k, dp += nblk) {
                    const __m512i a = _mm512_loadu_si512((const void *)ap);
                    __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a),
                                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), twelve, a));
                    __m512 sv = _mm512_insertf32x8(_mm512_set1_ps(dw0 * dp[0]), _mm256_set1_ps(dw1 * dp[1]), 1);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sv, acc[j]);
                }
            }
            if (nblk & 1) {
                const uint8_t *b = wr + (nblk - 1) * 17;
                const float dw = kq_e8m0_half(b[0]);
                for (int64_t j = 0; j < nt; j++) {
                    const int8_t *a = A + (t0 + j) * k + (nblk - 1) * 32;
                    int32_t sum = 0;
                    for (int l = 0; l < 16; l++)
                        sum += kq_mxfp4_values[b[1 + l] & 0xF] * a[l] + kq_mxfp4_values[b[1 + l] >> 4] * a[16 + l];
                    tail[j] = (dw * DA[(t0 + j) * nblk + nblk - 1]) * (float)sum;
                }
            }
            for (int64_t j = 0; j < nt; j++) Y[(t0 + j) * ldy + r] = _mm512_reduce_add_ps(acc[j]) + tail[j];
        }
    }
#else
    for (int64_t r = r0; r < r1; r++) {
        kq_unpack_mxfp4_row(W + r * row_stride, nblk, qbuf, dwbuf);
        for (int64_t j = 0; j < n; j++)
            Y[j * ldy + r] = kq_dot_mxfp4(qbuf, dwbuf, A + j * k, DA + j * nblk, nblk);
    }
#endif
}

/* ---------------------------------------------------------------------------------- */
/* repacked layout (AVX-512 VNNI, AVX2): 16 rows interleaved per super-block            */
/* ---------------------------------------------------------------------------------- */
/* Rows are taken 16 at a time (the last group padded with zero rows). One tile holds one
 * super-block of 16 rows; a 64-byte chunk holds 4 bytes of each row, so one vpdpbusd
 * with a broadcast 4-value activation gives 16 rows' partial sums in 16 int32 lanes and
 * results are stored as 16 contiguous floats (no horizontal sums). A value index
 * v = 4*J + i (J = 0..63 dot group, i = 0..3):
 *   nibble chunk j (0..31): row r bytes i = q[4j+i] & 15 | (q[128+4j+i] & 15) << 4
 *   Q5_K high-bit chunk h (0..7): bit k of byte i = bit 4 of q[4(h+8k)+i]
 *   Q6_K high-bit chunk h (0..15): bits 2k..2k+1 of byte i = bits 4..5 of q[4(h+16k)+i]
 * Scales come in pairs (g, g + NG/2) so that each nibble chunk (J = j and j + 32) feeds
 * one pair: Q4_K/Q5_K per-32 groups (G, G+4), Q6_K per-16 groups (g, g+8).
 * Tile bytes:
 *   Q4_K  [0,32) d f16 x16 | [32,64) dmin f16 x16 | 4 x {32 sc pairs u8, 32 mn pairs u8}
 *         | [320, 2368) 32 nibble chunks                                = 2368 (148/row)
 *   Q5_K  Q4_K tile + [2368, 2880) 8 high-bit chunks                     = 2880 (180/row)
 *   Q6_K  [0,32) d f16 x16 | pad | [64,320) 8 x 32 sc pairs i8 | [320,2368) nibbles
 *         | [2368, 3392) 16 high-bit chunks                             = 3392 (212/row)
 * MXFP4 per 16-row group: nblk x 16 e8m0 bytes (padded to 64), then per block 4 chunks
 * (row r bytes 4c..4c+3 of its block: low nibble value 4c+i, high nibble 16+4c+i).
 * Every output lane sees the same operations in the same order whatever the number of
 * tokens, the token tile or the thread count, so results do not depend on batching. */
#define KQ_RP 16

/* How kq_rp_tile asks for the weights simd_pf_dist ahead: 1 (default) a slice of the tile
 * with each of its 32 chunks, into L2; 2 the same into L1; 0 the whole tile at its start, into
 * L2 (A/B). A tile is 37-53 lines: asked for at once they filled the core's miss buffers and
 * the kernel streamed no faster than with no prefetch at all (Xeon with AMX, one thread, one
 * token, two streams: Q6_K 13.0 GB/s whole, 15.5-16.1 sliced into L2, 16.6-17.2 into L1;
 * Q4_K 14.3, 17.6-19.4, 19.9-20.4; a plain read loop 17-20; a gemma-3-270m decode step 0.964x
 * the time sliced into L2, 0.962x into L1, 4 and 8 sequences 0.94x; the AVX2 kernel, which
 * asked for its tiles into L1 at once, on the same CPU: Q6_K 8.3 -> 10.8, Q4_K 11.6 -> 13.9). */
static int kq_pf_mode = 1;
static inline int kq_set_pf_mode(int mode) { const int old = kq_pf_mode; kq_pf_mode = mode; return old; }

/* the lines of bytes [j tb / 32, (j + 1) tb / 32) of the tile simd_pf_dist ahead (tb and
 * the tiles are whole lines, so each line is asked for once over the 32 chunks) */
static inline __attribute__((always_inline)) void kq_rp_pf_slice(const uint8_t *tile, int64_t tb, int j) {
    if (simd_pf_dist <= 0) return;
    const uint8_t *p = tile + simd_pf_dist;
    const int64_t a = (j * tb) >> 5, e = ((j + 1) * tb) >> 5;
    for (int64_t o = (a + 63) & ~(int64_t)63; o < e; o += 64) {
        if (kq_pf_mode == 2) __builtin_prefetch(p + o, 0, 3);
        else __builtin_prefetch(p + o, 0, 2);
    }
}

static inline int64_t kq_rp_tile_bytes(int t) {
    switch (t) {
    case KQ_Q4_K: return 2368;
    case KQ_Q5_K: return 2880;
    case KQ_Q6_K: return 3392;
    default: return 0;
    }
}

static inline int kq_rp_supported(int t) {
#if SIMD_AVX512_VNNI
    return t == KQ_Q4_K || t == KQ_Q5_K || t == KQ_Q6_K || t == KQ_MXFP4;
#elif defined(KQ_AVX2)
    return t == KQ_Q4_K || t == KQ_Q5_K || t == KQ_Q6_K;
#else
    (void)t;
    return 0;
#endif
}

/* a thread's buffer for one 16-row group's unpacked super-blocks (nb x 4096 bytes, 64-byte
 * aligned; the AVX2 and AMX kernels), or NULL when it cannot be had */
static __thread uint8_t *kq_unp_buf = NULL;
static __thread size_t kq_unp_cap = 0;
static inline uint8_t *kq_unpack_buffer(int64_t nb) {
    const size_t need = (size_t)nb * 4096;
    if (need > kq_unp_cap) {
        free(kq_unp_buf);
        kq_unp_buf = (uint8_t *)simd_alloc(need);
        kq_unp_cap = kq_unp_buf ? need : 0;
    }
    return kq_unp_buf;
}

/* bytes of one 16-row group (k values per row) */
static inline int64_t kq_rp_group_bytes(int t, int64_t k) {
    if (t == KQ_MXFP4) {
        int64_t nblk = k / 32;
        return ((nblk * 16 + 63) & ~(int64_t)63) + nblk * 256;
    }
    return (k / KQ_QK) * kq_rp_tile_bytes(t);
}

/* repack row groups [g0, g1) of W (rows x k, GGUF layout, rows at W + r*row_stride) */
static void kq_rp_pack(int t, const uint8_t *W, int64_t row_stride, int64_t rows, int64_t k,
                       int64_t g0, int64_t g1, uint8_t *out) {
    const int ts = kq_type_size(t);
    const int64_t gb = kq_rp_group_bytes(t, k);
    if (t == KQ_MXFP4) {
        const int64_t nblk = k / 32, qoff = (nblk * 16 + 63) & ~(int64_t)63;
        for (int64_t g = g0; g < g1; g++) {
            uint8_t *o = out + g * gb;
            memset(o, 0, gb);
            for (int r = 0; r < KQ_RP; r++) {
                const int64_t row = g * KQ_RP + r;
                if (row >= rows) break;
                const uint8_t *src = W + row * row_stride;
                for (int64_t i = 0; i < nblk; i++) {
                    const uint8_t *b = src + i * ts;
                    o[i * 16 + r] = b[0];
                    for (int c = 0; c < 4; c++) memcpy(o + qoff + i * 256 + c * 64 + r * 4, b + 1 + 4 * c, 4);
                }
            }
        }
        return;
    }
    const int64_t nb = k / KQ_QK, tb = kq_rp_tile_bytes(t);
    kq_sb sb;
    for (int64_t g = g0; g < g1; g++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + g * gb + b * tb;
            memset(o, 0, tb);
            for (int r = 0; r < KQ_RP; r++) {
                const int64_t row = g * KQ_RP + r;
                if (row >= rows) break;
                const uint8_t *blk = W + row * row_stride + b * ts;
                kq_unpack(t, blk, &sb);
                uint8_t *qs = o + 320;
                if (t == KQ_Q6_K) {
                    memcpy(o + 2 * r, blk + 208, 2);
                    for (int p = 0; p < 8; p++) {
                        o[64 + p * 32 + 2 * r] = (uint8_t)(int8_t)sb.sc[p];
                        o[64 + p * 32 + 2 * r + 1] = (uint8_t)(int8_t)sb.sc[p + 8];
                    }
                    for (int h = 0; h < 16; h++)
                        for (int i = 0; i < 4; i++) {
                            uint8_t v = 0;
                            for (int kk = 0; kk < 4; kk++) v |= (uint8_t)(((sb.q[4 * (h + 16 * kk) + i] >> 4) & 3) << (2 * kk));
                            o[2368 + h * 64 + r * 4 + i] = v;
                        }
                } else {
                    memcpy(o + 2 * r, blk, 2);        /* d */
                    memcpy(o + 32 + 2 * r, blk + 2, 2); /* dmin */
                    for (int G = 0; G < 4; G++) {
                        o[64 + G * 64 + 2 * r] = (uint8_t)sb.sc[2 * G];
                        o[64 + G * 64 + 2 * r + 1] = (uint8_t)sb.sc[2 * (G + 4)];
                        o[64 + G * 64 + 32 + 2 * r] = (uint8_t)sb.mn[2 * G];
                        o[64 + G * 64 + 32 + 2 * r + 1] = (uint8_t)sb.mn[2 * (G + 4)];
                    }
                    if (t == KQ_Q5_K)
                        for (int h = 0; h < 8; h++)
                            for (int i = 0; i < 4; i++) {
                                uint8_t v = 0;
                                for (int kk = 0; kk < 8; kk++) v |= (uint8_t)(((sb.q[4 * (h + 8 * kk) + i] >> 4) & 1) << kk);
                                o[2368 + h * 64 + r * 4 + i] = v;
                            }
                }
                for (int j = 0; j < 32; j++)
                    for (int i = 0; i < 4; i++)
                        qs[j * 64 + r * 4 + i] = (uint8_t)((sb.q[4 * j + i] & 15) | ((sb.q[128 + 4 * j + i] & 15) << 4));
            }
        }
    }
}

#if SIMD_AVX512_VNNI
/* nibble chunk j (0..31) of a super-block tile's quants qs (high bits qh for Q5_K / Q6_K):
 * wl its values 4j..4j+3 of the 16 rows, wh values 128+4j.. (chunks j and j+32) */
static inline __attribute__((always_inline)) void kq_rp_chunk(const int t, const uint8_t *qs, const uint8_t *qh,
                                                               int j, __m512i *wl, __m512i *wh) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i w = _mm512_loadu_si512((const void *)(qs + j * 64));
    __m512i lo = _mm512_and_si512(w, m4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
    if (t == KQ_Q5_K) {
        const __m512i h = _mm512_loadu_si512((const void *)(qh + (j & 7) * 64));
        const int kl = j >> 3; /* bit kl -> low part, bit kl+4 -> high part */
        const __m512i b4 = _mm512_set1_epi8(0x10);
        lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - kl)), b4));
        hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srl_epi16(h, _mm_cvtsi32_si128(kl)), b4));
    } else if (t == KQ_Q6_K) {
        const __m512i h = _mm512_loadu_si512((const void *)(qh + (j & 15) * 64));
        const __m512i b45 = _mm512_set1_epi8(0x30);
        /* j < 16: fields 0 (low part) and 2 (high part); else fields 1 and 3 */
        if (j < 16) {
            lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h, 4), b45));
            hi = _mm512_or_si512(hi, _mm512_and_si512(h, b45));
        } else {
            lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h, 2), b45));
            hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(h, 2), b45));
        }
    }
    *wl = lo;
    *wh = hi;
}

/* super-block b of one 16-row group (its tile) x NT tokens (A[u]: token u's q8_K row),
 * added to acc[u] */
static inline __attribute__((always_inline)) void
kq_rp_tile(const int t, const int NT, const uint8_t *tile, int64_t b, const kq_q8k *const *A, __m512 *acc) {
    const int64_t tb = kq_rp_tile_bytes(t);
    const int six = t == KQ_Q6_K;
    if (kq_pf_mode == 0) simd_prefetch_range_l2(tile, (int)tb);
    const uint8_t *qs = tile + 320, *qh = tile + 2368;
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
    __m512i isum[4];
    const kq_q8k *ab[4];
    for (int u = 0; u < NT; u++) {
        ab[u] = A[u] + b;
        isum[u] = _mm512_setzero_si512();
    }
    if (!six) { /* mins: acc -= dmin*da * sum_G mn(G,G+4) . bs32(G,G+4) */
        const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
        int32_t bp[4][4];
        for (int u = 0; u < NT; u++) {
            __m128i v = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab[u]->bsums),
                                       _mm_loadu_si128((const __m128i *)(ab[u]->bsums + 8)));
            _mm_storeu_si128((__m128i *)bp[u], _mm_unpacklo_epi16(v, _mm_srli_si128(v, 8)));
        }
        __m512i ms[4];
        for (int u = 0; u < NT; u++) ms[u] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 64 + 32)));
            for (int u = 0; u < NT; u++) ms[u] = _mm512_dpwssd_epi32(ms[u], mn, _mm512_set1_epi32(bp[u][p]));
        }
        for (int u = 0; u < NT; u++)
            acc[u] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms[u]), _mm512_mul_ps(dmv, _mm512_set1_ps(ab[u]->d)), acc[u]);
    } else { /* Q6_K offset 32: isum -= 32 * sum_g sc(g,g+8) . bsum(g,g+8) */
        int32_t bp[4][8];
        for (int u = 0; u < NT; u++) {
            __m128i lo = _mm_loadu_si128((const __m128i *)ab[u]->bsums);
            __m128i hi = _mm_loadu_si128((const __m128i *)(ab[u]->bsums + 8));
            _mm_storeu_si128((__m128i *)bp[u], _mm_unpacklo_epi16(lo, hi));
            _mm_storeu_si128((__m128i *)(bp[u] + 4), _mm_unpackhi_epi16(lo, hi));
        }
        for (int p = 0; p < 8; p++) {
            const __m512i sc = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 32)));
            for (int u = 0; u < NT; u++) isum[u] = _mm512_dpwssd_epi32(isum[u], sc, _mm512_set1_epi32(bp[u][p]));
        }
        for (int u = 0; u < NT; u++) isum[u] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(isum[u], 5));
    }
    const int np = six ? 8 : 4, cpp = 32 / np;
    for (int p = 0; p < np; p++) {
        const __m512i sc = six
            ? _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 32)))
            : _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 64)));
        const __m512i sc_lo = _mm512_srai_epi32(_mm512_slli_epi32(sc, 16), 16), sc_hi = _mm512_srai_epi32(sc, 16);
        __m512i lo[4], hi[4];
        for (int u = 0; u < NT; u++) lo[u] = hi[u] = _mm512_setzero_si512();
        for (int c = 0; c < cpp; c++) {
            const int j = p * cpp + c;
            __m512i wl, wh;
            if (kq_pf_mode) kq_rp_pf_slice(tile, tb, j);
            kq_rp_chunk(t, qs, qh, j, &wl, &wh);
            for (int u = 0; u < NT; u++) {
                int32_t a0, a1;
                memcpy(&a0, ab[u]->qs + 4 * j, 4);
                memcpy(&a1, ab[u]->qs + 128 + 4 * j, 4);
                lo[u] = _mm512_dpbusd_epi32(lo[u], wl, _mm512_set1_epi32(a0));
                hi[u] = _mm512_dpbusd_epi32(hi[u], wh, _mm512_set1_epi32(a1));
            }
        }
        for (int u = 0; u < NT; u++)
            isum[u] = _mm512_add_epi32(isum[u], _mm512_add_epi32(_mm512_mullo_epi32(lo[u], sc_lo),
                                                                 _mm512_mullo_epi32(hi[u], sc_hi)));
    }
    for (int u = 0; u < NT; u++)
        acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[u]), _mm512_mul_ps(dv, _mm512_set1_ps(ab[u]->d)), acc[u]);
}

/* one 16-row group x NT tokens (NT compile-time after inlining), K-quants */
static inline __attribute__((always_inline)) void
kq_rp_kernel(const int t, const int NT, const uint8_t *G, int64_t nb, const kq_q8k *const *A,
             float *const *Y, __mmask16 store_mask) {
    const int64_t tb = kq_rp_tile_bytes(t);
    __m512 acc[4];
    for (int u = 0; u < NT; u++) acc[u] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) kq_rp_tile(t, NT, G + b * tb, b, A, acc);
    for (int u = 0; u < NT; u++) _mm512_mask_storeu_ps(Y[u], store_mask, acc[u]);
}

/* NT tokens (1 to 4), two 16-row groups G[0] and G[1] (of one weight or of two of the same
 * type and columns) in lockstep, super-block by super-block, each with kq_rp_kernel's
 * operations in its order (the same bits): a core streams two weight regions faster than
 * one (lq_kernel_vnni_pair's note in simd_quants.h). A[s][u]: token u's q8_K row for group
 * s; Y[s][u]: its outputs. */
static inline __attribute__((always_inline)) void
kq_rp_kernel_pair(const int t, const int NT, const uint8_t *const *G, int64_t nb, const kq_q8k *const (*A)[4],
                  float *const (*Y)[4], const __mmask16 *store_mask) {
    const int64_t tb = kq_rp_tile_bytes(t);
    __m512 acc[2][4];
    for (int s = 0; s < 2; s++)
        for (int u = 0; u < NT; u++) acc[s][u] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++)
        for (int s = 0; s < 2; s++) kq_rp_tile(t, NT, G[s] + b * tb, b, A[s], acc[s]);
    for (int s = 0; s < 2; s++)
        for (int u = 0; u < NT; u++) _mm512_mask_storeu_ps(Y[s][u], store_mask[s], acc[s][u]);
}

/* MXFP4 group x NT tokens. A[u]: int8 row (k), DA[u]: nblk scales, AS[u]: nblk int sums */
static inline __attribute__((always_inline)) void
kq_rp_kernel_mxfp4(const int NT, const uint8_t *G, int64_t nblk, const int8_t *const *A,
                   const float *const *DA, const int32_t *const *AS, float *const *Y, __mmask16 store_mask) {
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                             12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
    const uint8_t *q = G + ((nblk * 16 + 63) & ~(int64_t)63);
    __m512 acc[4];
    for (int u = 0; u < NT; u++) acc[u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nblk; i++, q += 256) {
        simd_prefetch_range(q, 256);
        const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(G + i * 16)));
        const __mmask16 small = _mm512_cmplt_epi32_mask(e, two);
        const __m512 dw = _mm512_castsi512_ps(_mm512_mask_blend_epi32(small,
            _mm512_slli_epi32(_mm512_sub_epi32(e, one), 23),
            _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e)));
        __m512i p[4];
        for (int u = 0; u < NT; u++) p[u] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m512i w = _mm512_loadu_si512((const void *)(q + c * 64));
            const __m512i wl = _mm512_shuffle_epi8(tbl, _mm512_and_si512(w, m4));
            const __m512i wh = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(w, 4), m4));
            for (int u = 0; u < NT; u++) {
                int32_t a0, a1;
                memcpy(&a0, A[u] + i * 32 + 4 * c, 4);
                memcpy(&a1, A[u] + i * 32 + 16 + 4 * c, 4);
                p[u] = _mm512_dpbusd_epi32(p[u], wl, _mm512_set1_epi32(a0));
                p[u] = _mm512_dpbusd_epi32(p[u], wh, _mm512_set1_epi32(a1));
            }
        }
        for (int u = 0; u < NT; u++) {
            const __m512i s = _mm512_sub_epi32(p[u], _mm512_set1_epi32(12 * AS[u][i]));
            acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(DA[u][i])), acc[u]);
        }
    }
    for (int u = 0; u < NT; u++) _mm512_mask_storeu_ps(Y[u], store_mask, acc[u]);
}
#endif

#if defined(KQ_AVX2)
/* ------------------------------------------------- the repacked tiles on AVX2 (no vpdpbusd) */
/* A 64-byte chunk is two 8-row halves (32 bytes: 4 values of each of 8 rows). Per token,
 * maddubs(a half's unsigned values, 4 broadcast activation bytes) gives each row's two pair
 * sums as int16 lanes; these are summed in int16 over as many chunks as cannot overflow (a
 * lane adds 2 products of at most 63 * 128 a chunk: Q4_K 8 chunks = its 32-value sub-block,
 * Q5_K 4, Q6_K 2), then one madd with the row's scale in both of its lanes gives the int32
 * sum per row (8 rows in 8 lanes: no horizontal sums). Up to 4 tokens a call. From a few
 * tokens a group's tiles are unpacked once (kq_rp_unpack_group_avx2) and the kernel takes
 * the low and the high parts in turn with both halves at once, so each broadcast feeds two
 * maddubs and the inner loop is loads, maddubs and adds; for fewer tokens it unpacks a half
 * as it goes. The integer sums equal the VNNI kernel's (exact) and the float updates are its
 * own, operation for operation and in its order, so a token's outputs do not depend on the
 * path, the token count, the tile or the thread count (and equal an AVX-512 VNNI build's). */
static inline __m256i kq_dup_even16(__m256i s) {  /* int16 lanes (2r, 2r+1) <- lane 2r */
    return _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(s, 0xA0), 0xA0);
}
static inline __m256i kq_dup_odd16(__m256i s) {   /* int16 lanes (2r, 2r+1) <- lane 2r + 1 */
    return _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(s, 0xF5), 0xF5);
}

/* chunk j's half h (rows 8h .. 8h+7) of a tile: the low part's values (4j .. 4j+3 of each
 * row) and the high part's (128 + 4j ..), unsigned, Q5_K's / Q6_K's high bits merged */
static inline __attribute__((always_inline)) void kq_rp_half_avx2(const int t, const uint8_t *tile, int j, int h,
                                                                  __m256i *lo, __m256i *hi) {
    const uint8_t *qs = tile + 320, *qh = tile + 2368;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + j * 64 + 32 * h));
    __m256i wl = _mm256_and_si256(w, m4), wh = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
    if (t == KQ_Q5_K) {
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + (j & 7) * 64 + 32 * h));
        const int kl = j >> 3; /* bit kl -> low part, bit kl+4 -> high part */
        const __m256i b4 = _mm256_set1_epi8(0x10);
        wl = _mm256_or_si256(wl, _mm256_and_si256(_mm256_sll_epi16(hb, _mm_cvtsi32_si128(4 - kl)), b4));
        wh = _mm256_or_si256(wh, _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(kl)), b4));
    } else if (t == KQ_Q6_K) {
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + (j & 15) * 64 + 32 * h));
        const __m256i b45 = _mm256_set1_epi8(0x30);
        if (j < 16) {
            wl = _mm256_or_si256(wl, _mm256_and_si256(_mm256_slli_epi16(hb, 4), b45));
            wh = _mm256_or_si256(wh, _mm256_and_si256(hb, b45));
        } else {
            wl = _mm256_or_si256(wl, _mm256_and_si256(_mm256_slli_epi16(hb, 2), b45));
            wh = _mm256_or_si256(wh, _mm256_and_si256(_mm256_srli_epi16(hb, 2), b45));
        }
    }
    *lo = wl;
    *hi = wh;
}

/* a group's nb tiles unpacked once for a work item of many tokens (U: nb x 4096 bytes,
 * 64-aligned; tile b's chunk j half h at U + b*4096 + j*64 + 32h, its high part at
 * + (32 + j)*64): the kernel then reads the values as they are */
static void kq_rp_unpack_group_avx2(const int t, const uint8_t *G, int64_t nb, uint8_t *U) {
    const int64_t tb = kq_rp_tile_bytes(t);
    for (int64_t b = 0; b < nb; b++)
        for (int j = 0; j < 32; j++)
            for (int h = 0; h < 2; h++) {
                __m256i lo, hi;
                kq_rp_half_avx2(t, G + b * tb, j, h, &lo, &hi);
                _mm256_store_si256((__m256i *)(U + b * 4096 + j * 64 + 32 * h), lo);
                _mm256_store_si256((__m256i *)(U + b * 4096 + (32 + j) * 64 + 32 * h), hi);
            }
}

/* tokens a call (4 tokens x 2 int16 sums + 2 weight vectors + a broadcast: the 16 registers) */
#define KQ_RP_NT_AVX2 4

/* one 16-row group x NT (1..4) tokens, K-quants; rows >= nvalid are not stored. UNP 0: the
 * values unpacked from the tiles as used; 1: read from U, the group unpacked (same bits) */
static inline __attribute__((always_inline)) void
kq_rp_kernel_avx2(const int t, const int NT, const int UNP, const uint8_t *G, const uint8_t *U, int64_t nb,
                  const kq_q8k *const *A, float *const *Y, int nvalid) {
    const int64_t tb = kq_rp_tile_bytes(t);
    const int six = t == KQ_Q6_K;
    const int np = six ? 8 : 4, cpp = 32 / np;
    const int run = t == KQ_Q4_K ? 8 : t == KQ_Q5_K ? 4 : 2;  /* chunks summed in int16 */
    __m256 acc[KQ_RP_NT_AVX2][2];
    for (int u = 0; u < NT; u++) acc[u][0] = acc[u][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *tile = G + b * tb;
        if (!UNP && !kq_pf_mode) simd_prefetch_range(tile, (int)tb);
        const kq_q8k *ab[KQ_RP_NT_AVX2];
        __m256i isum[KQ_RP_NT_AVX2][2];
        for (int u = 0; u < NT; u++) ab[u] = A[u] + b;
        if (!six) { /* mins: acc -= dmin*da * sum_G mn(G,G+4) . bs32(G,G+4) */
            int32_t bp[KQ_RP_NT_AVX2][4];
            for (int u = 0; u < NT; u++) {
                __m128i v = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab[u]->bsums),
                                           _mm_loadu_si128((const __m128i *)(ab[u]->bsums + 8)));
                _mm_storeu_si128((__m128i *)bp[u], _mm_unpacklo_epi16(v, _mm_srli_si128(v, 8)));
            }
            for (int h = 0; h < 2; h++) {
                const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 32 + 16 * h)));
                __m256i mn[4];
                for (int p = 0; p < 4; p++)
                    mn[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(tile + 64 + p * 64 + 32 + 16 * h)));
                for (int u = 0; u < NT; u++) {
                    __m256i ms = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(bp[u][0]));
                    for (int p = 1; p < 4; p++) ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mn[p], _mm256_set1_epi32(bp[u][p])));
                    acc[u][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dmv, _mm256_set1_ps(ab[u]->d)),
                                                 acc[u][h]);
                    isum[u][h] = _mm256_setzero_si256();
                }
            }
        } else { /* Q6_K offset 32: isum = -32 * sum_g sc(g,g+8) . bsum(g,g+8) */
            int32_t bp[KQ_RP_NT_AVX2][8];
            for (int u = 0; u < NT; u++) {
                __m128i lo = _mm_loadu_si128((const __m128i *)ab[u]->bsums);
                __m128i hi = _mm_loadu_si128((const __m128i *)(ab[u]->bsums + 8));
                _mm_storeu_si128((__m128i *)bp[u], _mm_unpacklo_epi16(lo, hi));
                _mm_storeu_si128((__m128i *)(bp[u] + 4), _mm_unpackhi_epi16(lo, hi));
            }
            for (int h = 0; h < 2; h++)
                for (int u = 0; u < NT; u++) {
                    __m256i is = _mm256_setzero_si256();
                    for (int p = 0; p < 8; p++)
                        is = _mm256_add_epi32(is, _mm256_madd_epi16(
                            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(tile + 64 + p * 32 + 16 * h))),
                            _mm256_set1_epi32(bp[u][p])));
                    isum[u][h] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(is, 5));
                }
        }
        for (int p = 0; p < np; p++) {
            /* the scale pairs (low part's, high part's) of each half's 8 rows, each scale in
             * both int16 lanes of its row */
            __m256i sl[2], sh[2];
            for (int h = 0; h < 2; h++) {
                const __m128i s8 = _mm_loadu_si128((const __m128i *)(tile + 64 + (six ? p * 32 : p * 64) + 16 * h));
                const __m256i s2 = six ? _mm256_cvtepi8_epi16(s8) : _mm256_cvtepu8_epi16(s8);
                sl[h] = kq_dup_even16(s2);
                sh[h] = kq_dup_odd16(s2);
            }
            if (UNP) {
                /* the low and the high parts in turn, both halves at once: a broadcast feeds
                 * two maddubs (NT x 2 sums + 2 weight vectors in registers) */
                for (int c0 = 0; c0 < cpp; c0 += run)
                    for (int part = 0; part < 2; part++) {
                        __m256i d[KQ_RP_NT_AVX2][2];
                        for (int u = 0; u < NT; u++) d[u][0] = d[u][1] = _mm256_setzero_si256();
                        /* not unrolled: unrolled, gcc hoists the broadcasts of several chunks
                         * and spills the sums */
#pragma GCC unroll 1
                        for (int c = c0; c < c0 + run; c++) {
                            const int j = p * cpp + c;
                            const uint8_t *uw = U + b * 4096 + (32 * part + j) * 64;
                            const __m256i w0 = _mm256_load_si256((const __m256i *)uw);
                            const __m256i w1 = _mm256_load_si256((const __m256i *)(uw + 32));
                            for (int u = 0; u < NT; u++) {
                                int32_t a;
                                memcpy(&a, ab[u]->qs + 128 * part + 4 * j, 4);
                                const __m256i av = _mm256_set1_epi32(a);
                                d[u][0] = _mm256_add_epi16(d[u][0], _mm256_maddubs_epi16(w0, av));
                                d[u][1] = _mm256_add_epi16(d[u][1], _mm256_maddubs_epi16(w1, av));
                            }
                        }
                        for (int u = 0; u < NT; u++)
                            for (int h = 0; h < 2; h++)
                                isum[u][h] = _mm256_add_epi32(isum[u][h], _mm256_madd_epi16(d[u][h], part ? sh[h] : sl[h]));
                    }
                continue;
            }
            for (int h = 0; h < 2; h++) {
                for (int c0 = 0; c0 < cpp; c0 += run) {
                    __m256i lo[4], hi[4];
                    for (int u = 0; u < NT; u++) lo[u] = hi[u] = _mm256_setzero_si256();
                    for (int c = c0; c < c0 + run; c++) {
                        const int j = p * cpp + c;
                        __m256i wl, wh;
                        if (h == 0 && kq_pf_mode) kq_rp_pf_slice(tile, tb, j);
                        kq_rp_half_avx2(t, tile, j, h, &wl, &wh);
                        for (int u = 0; u < NT; u++) {
                            int32_t a0, a1;
                            memcpy(&a0, ab[u]->qs + 4 * j, 4);
                            memcpy(&a1, ab[u]->qs + 128 + 4 * j, 4);
                            lo[u] = _mm256_add_epi16(lo[u], _mm256_maddubs_epi16(wl, _mm256_set1_epi32(a0)));
                            hi[u] = _mm256_add_epi16(hi[u], _mm256_maddubs_epi16(wh, _mm256_set1_epi32(a1)));
                        }
                    }
                    for (int u = 0; u < NT; u++)
                        isum[u][h] = _mm256_add_epi32(isum[u][h], _mm256_add_epi32(_mm256_madd_epi16(lo[u], sl[h]),
                                                                                  _mm256_madd_epi16(hi[u], sh[h])));
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 16 * h)));
            for (int u = 0; u < NT; u++)
                acc[u][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[u][h]), _mm256_mul_ps(dv, _mm256_set1_ps(ab[u]->d)),
                                            acc[u][h]);
        }
    }
    if (nvalid >= KQ_RP) {
        for (int u = 0; u < NT; u++) {
            _mm256_storeu_ps(Y[u], acc[u][0]);
            _mm256_storeu_ps(Y[u] + 8, acc[u][1]);
        }
    } else {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nvalid), lane);
        const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nvalid - 8), lane);
        for (int u = 0; u < NT; u++) {
            _mm256_maskstore_ps(Y[u], m0, acc[u][0]);
            _mm256_maskstore_ps(Y[u] + 8, m1, acc[u][1]);
        }
    }
}

/* Fewest tokens of a group's work for which it is unpacked once: the unpacked kernel's
 * broadcasts feed both halves and it does no unpacking, which pays for the group's unpack
 * from 3 tokens (Zen 3, -t 1, gemma-3's shapes: Q4_K 0.89 of the time at 3, 0.77 at 6; Q6_K
 * 0.85, 0.71; Q5_K, whose high bits cost its unpack most, 0.99 at 3, 0.84 at 5).
 * kq_u_override_avx2 >= 0 (tests, benchmarks): that for every type, 0: never. */
static int kq_u_override_avx2 = -1;
static inline int kq_u_min_avx2(int t) {
    if (kq_u_override_avx2 >= 0) return kq_u_override_avx2 ? kq_u_override_avx2 : INT32_MAX;
    return t == KQ_Q5_K ? 5 : 3;
}
#endif

#if SIMD_AVX512_VNNI
/* ------------------------------------------ token tiles on unpacked super-blocks (VNNI) */
/* A call of many tokens unpacks each super-block tile of its 16-row group once, into the
 * VNNI chunks kq_rp_kernel builds in registers for every 4 tokens (chunk j < 32: the low
 * nibbles of nibble chunk j, chunk 32 + j: the high ones, with Q5_K's / Q6_K's high bits
 * merged: unsigned 0..31 / 0..63), and runs all its tokens over it: the inner loop is
 * loads and vpdpbusd only. Super-blocks are the outer loop (the unpacked one stays in L1),
 * the tokens' float sums wait in a buffer between super-blocks. The integer sums are exact
 * and the float updates are kq_rp_kernel's, in its order (per output: super-blocks in order,
 * the mins then the dots of each), so the outputs are the same bits: a token's result does
 * not depend on which of the two kernels its call took. */
/* Fewest tokens of a work item for this kernel (fewer: kq_rp_kernel, whose per-call unpack
 * is then cheaper than unpacking a tile and keeping the float sums in memory). Measured on
 * Zen 5 (-t 1, dense 8192 x 2048 and 256 experts): Q5_K (whose high bits cost kq_rp_kernel
 * most) wins from 6-8 tokens (0.58x the time at 32), Q6_K from 12 (0.88x), Q4_K about breaks
 * even from 12 to 32. kq_u_override >= 0 (tests, benchmarks): that threshold for all types,
 * 0: never. */
static int kq_u_override = -1;
static inline int kq_u_min(int t) {
    if (kq_u_override >= 0) return kq_u_override;
    return t == KQ_Q5_K ? 8 : t == KQ_Q6_K ? 12 : 32;
}
#define KQ_U_CHUNK 64       /* tokens whose float sums one pass keeps (64 x 64 bytes) */
#ifndef KQ_U_PF
#define KQ_U_PF 2           /* super-blocks the weights are prefetched ahead */
#endif
#define KQ_U_NT 6           /* tokens a kernel call (2 groups x 6 tokens: 12 accumulators) */

/* one super-block tile's 64 chunks (4096 bytes) */
static inline __attribute__((always_inline)) void kq_rp_unpack(const int t, const uint8_t *tile, uint8_t *U) {
    const uint8_t *qs = tile + 320, *qh = tile + 2368;
    for (int j = 0; j < 32; j++) {
        __m512i wl, wh;
        kq_rp_chunk(t, qs, qh, j, &wl, &wh);
        _mm512_store_si512((void *)(U + j * 64), wl);
        _mm512_store_si512((void *)(U + (32 + j) * 64), wh);
    }
}

/* super-block b of NG consecutive 16-row groups (tiles tile[g], unpacked at U + g * 4096) x
 * NT tokens: F[g][u] (16 floats) updated as kq_rp_kernel updates acc[u] for one super-block;
 * ab[u]: token u's q8_K block of this super-block. Each activation broadcast feeds NG groups;
 * the low and the high chunks of a scale pair take turns (NG * NT accumulators). */
static inline __attribute__((always_inline)) void
kq_u_kernel(const int t, const int NG, const int NT, const uint8_t *const *tile, const uint8_t *U,
            const kq_q8k *const *ab, float *const *F) {
    const int six = t == KQ_Q6_K;
    __m512i isum[2][KQ_U_NT];
    for (int g = 0; g < NG; g++)
        for (int u = 0; u < NT; u++) isum[g][u] = _mm512_setzero_si512();
    if (!six) {
        int32_t bp[KQ_U_NT][4];
        for (int u = 0; u < NT; u++) {
            __m128i v = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab[u]->bsums),
                                       _mm_loadu_si128((const __m128i *)(ab[u]->bsums + 8)));
            _mm_storeu_si128((__m128i *)bp[u], _mm_unpacklo_epi16(v, _mm_srli_si128(v, 8)));
        }
        for (int g = 0; g < NG; g++) {
            const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile[g] + 32)));
            __m512i mn[4];
            for (int p = 0; p < 4; p++)
                mn[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile[g] + 64 + p * 64 + 32)));
            for (int u = 0; u < NT; u++) {
                __m512i ms = _mm512_setzero_si512();
                for (int p = 0; p < 4; p++) ms = _mm512_dpwssd_epi32(ms, mn[p], _mm512_set1_epi32(bp[u][p]));
                _mm512_store_ps(F[g * KQ_U_NT + u], _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms),
                    _mm512_mul_ps(dmv, _mm512_set1_ps(ab[u]->d)), _mm512_load_ps(F[g * KQ_U_NT + u])));
            }
        }
    } else {
        int32_t bp[KQ_U_NT][8];
        for (int u = 0; u < NT; u++) {
            __m128i lo = _mm_loadu_si128((const __m128i *)ab[u]->bsums);
            __m128i hi = _mm_loadu_si128((const __m128i *)(ab[u]->bsums + 8));
            _mm_storeu_si128((__m128i *)bp[u], _mm_unpacklo_epi16(lo, hi));
            _mm_storeu_si128((__m128i *)(bp[u] + 4), _mm_unpackhi_epi16(lo, hi));
        }
        for (int g = 0; g < NG; g++) {
            for (int p = 0; p < 8; p++) {
                const __m512i sc = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tile[g] + 64 + p * 32)));
                for (int u = 0; u < NT; u++) isum[g][u] = _mm512_dpwssd_epi32(isum[g][u], sc, _mm512_set1_epi32(bp[u][p]));
            }
            for (int u = 0; u < NT; u++)
                isum[g][u] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(isum[g][u], 5));
        }
    }
    const int np = six ? 8 : 4, cpp = 32 / np;
    for (int p = 0; p < np; p++) {
        for (int half = 0; half < 2; half++) {
            __m512i sc[2], d[2][KQ_U_NT];
            for (int g = 0; g < NG; g++) {
                const __m512i s2 = six
                    ? _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tile[g] + 64 + p * 32)))
                    : _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile[g] + 64 + p * 64)));
                sc[g] = half ? _mm512_srai_epi32(s2, 16) : _mm512_srai_epi32(_mm512_slli_epi32(s2, 16), 16);
                for (int u = 0; u < NT; u++) d[g][u] = _mm512_setzero_si512();
            }
            for (int c = 0; c < cpp; c++) {
                const int j = p * cpp + c;
                __m512i w[2];
                for (int g = 0; g < NG; g++) w[g] = _mm512_load_si512((const void *)(U + g * 4096 + (32 * half + j) * 64));
                for (int u = 0; u < NT; u++) {
                    int32_t a;
                    memcpy(&a, ab[u]->qs + 128 * half + 4 * j, 4);
                    const __m512i av = _mm512_set1_epi32(a);
                    for (int g = 0; g < NG; g++) d[g][u] = _mm512_dpbusd_epi32(d[g][u], w[g], av);
                }
            }
            for (int g = 0; g < NG; g++)
                for (int u = 0; u < NT; u++)
                    isum[g][u] = _mm512_add_epi32(isum[g][u], _mm512_mullo_epi32(d[g][u], sc[g]));
        }
    }
    for (int g = 0; g < NG; g++) {
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile[g]));
        for (int u = 0; u < NT; u++)
            _mm512_store_ps(F[g * KQ_U_NT + u], _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g][u]),
                _mm512_mul_ps(dv, _mm512_set1_ps(ab[u]->d)), _mm512_load_ps(F[g * KQ_U_NT + u])));
    }
}

/* kq_rp_group's work for NG (1 or 2) consecutive groups G (group bytes gb) x n tokens: A at
 * the first token's q8_K row (nb blocks a row), outputs at Y (row stride ldy) for the 16 * NG
 * rows, masks m[g] */
static inline __attribute__((always_inline)) void
kq_u_groups(const int t, const int NG, const uint8_t *G, int64_t gb, int64_t nb, const kq_q8k *A, int64_t n,
            float *Y, int64_t ldy, const __mmask16 *m) {
    const int64_t tb = kq_rp_tile_bytes(t);
    __attribute__((aligned(64))) uint8_t U[2 * 4096];
    __attribute__((aligned(64))) float F[2][KQ_U_CHUNK][16];
    const kq_q8k *ab[KQ_U_NT];
    const uint8_t *tile[2];
    float *f[2 * KQ_U_NT];
    for (int64_t j0 = 0; j0 < n; j0 += KQ_U_CHUNK) {
        const int64_t mt = n - j0 < KQ_U_CHUNK ? n - j0 : KQ_U_CHUNK;
        for (int g = 0; g < NG; g++) memset(F[g], 0, (size_t)mt * sizeof F[0][0]);
        for (int64_t b = 0; b < nb; b++) {
            for (int g = 0; g < NG; g++) {
                tile[g] = G + g * gb + b * tb;
                kq_rp_unpack(t, tile[g], U + g * 4096);
            }
            /* super-block b + KQ_U_PF of each group (past the last: the next work item's,
             * which follow in memory) streams in while these tokens run, its lines spread
             * over the token tiles' calls */
            const int64_t bp = b + KQ_U_PF;
            const char *pf[2];
            for (int g = 0; g < NG; g++)
                pf[g] = (const char *)G + (bp < nb ? g * gb + bp * tb : (NG + g) * gb + (bp - nb) * tb);
            const int64_t ncalls = (mt + KQ_U_NT - 1) / KQ_U_NT, per = (tb + 64 * ncalls - 1) / (64 * ncalls);
            int64_t pfo = 0;
            for (int64_t j = 0; j < mt;) {
                for (int64_t q = 0; q < per && pfo < tb; q++, pfo += 64)
                    for (int g = 0; g < NG; g++) _mm_prefetch(pf[g] + pfo, _MM_HINT_T0);
                /* the item's tokens in near-equal tiles of at most KQ_U_NT (8: 4 + 4, not
                 * 6 + 2: a 2-token tile has too few accumulator chains for the vpdpbusd
                 * latency) */
                const int64_t left = mt - j, tiles = (left + KQ_U_NT - 1) / KQ_U_NT;
                const int64_t nt = (left + tiles - 1) / tiles;
                for (int u = 0; u < nt; u++) {
                    ab[u] = A + (j0 + j + u) * nb + b;
                    for (int g = 0; g < NG; g++) f[g * KQ_U_NT + u] = F[g][j + u];
                }
                switch (nt) {
                case 6: kq_u_kernel(t, NG, 6, tile, U, ab, f); break;
                case 5: kq_u_kernel(t, NG, 5, tile, U, ab, f); break;
                case 4: kq_u_kernel(t, NG, 4, tile, U, ab, f); break;
                case 3: kq_u_kernel(t, NG, 3, tile, U, ab, f); break;
                case 2: kq_u_kernel(t, NG, 2, tile, U, ab, f); break;
                default: kq_u_kernel(t, NG, 1, tile, U, ab, f); break;
                }
                j += nt;
            }
        }
        for (int g = 0; g < NG; g++)
            for (int64_t j = 0; j < mt; j++)
                _mm512_mask_storeu_ps(Y + (j0 + j) * ldy + g * KQ_RP, m[g], _mm512_load_ps(F[g][j]));
    }
}

static void kq_u_groups_any(int t, int ng, const uint8_t *G, int64_t gb, int64_t nb, const kq_q8k *A, int64_t n,
                            float *Y, int64_t ldy, const __mmask16 *m) {
#define KQ_U_CASE(T)                                                             \
    if (ng == 2) kq_u_groups(T, 2, G, gb, nb, A, n, Y, ldy, m);                  \
    else kq_u_groups(T, 1, G, gb, nb, A, n, Y, ldy, m);
    if (t == KQ_Q4_K) { KQ_U_CASE(KQ_Q4_K) }
    else if (t == KQ_Q5_K) { KQ_U_CASE(KQ_Q5_K) }
    else { KQ_U_CASE(KQ_Q6_K) }
#undef KQ_U_CASE
}
#endif

/* Activations of one matmul call: K-quants use q8k (n x nb), MXFP4 uses aq/ad/as. */
typedef struct {
    const kq_q8k *q8k;  /* n + KQ_AMX_PAD rows (the AMX kernel reads whole 16-token tiles) */
    const int8_t *aq;
    const float *ad;
    const int32_t *as;
    int no_amx;         /* 1: VNNI kernel only (tests compare the two) */
} kq_act;

/* ---------------------------------------------------------------- AMX (int8 tiles) */
/* Builds for a CPU with AMX-INT8 (-march=native there) run token tiles of Q4_K / Q5_K / Q6_K
 * on AMX tiles. A group's super-blocks are unpacked to VNNI chunks (chunk J: values
 * 4J..4J+3 of each of the 16 rows, the VNNI kernel's wl/wh) once per work item, by its
 * first tile block by block; per sub-block (32 values for Q4_K/Q5_K, 16 for Q6_K, one scale each) one TDPBSUD gives the
 * 16 tokens x 16 rows integer dots (A: 16 activation rows of the sub-block, stride one q8_K
 * row; B: its chunks). The integer sums (dot x scale, the mins, Q6_K's offset) are exact, so
 * they equal the VNNI kernel's, and the float updates are the VNNI kernel's operation for
 * operation: outputs are bit-identical, a token's result never depends on which path its
 * tile took. A tile with fewer than 16 tokens reads the rows after them too (the activation
 * buffer has KQ_AMX_PAD spare rows) and stores only its own. Linux grants the tile state per
 * process (arch_prctl ARCH_REQ_XCOMP_PERM): kq_amx_init asks at module import; the VNNI
 * kernel serves when it is refused, the CPU lacks AMX or LLMCORE_NO_AMX=1. */
#define KQ_AMX_PAD 16
#if SIMD_AVX512_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define KQ_AMX_BUILT 1
#include <stdlib.h>

static int kq_amx_on = 0;
/* Fewest tokens of a tile worth the AMX kernel (below: the VNNI kernel, 4 tokens a call),
 * and of a work item: a group's weights are unpacked for the tile unit once per work item,
 * (the first tile unpacks as it goes, the tile unit working meanwhile), which pays off over
 * one tile for Q5_K (whose VNNI kernel merges the high bits per 4-token call), over a
 * nearly full one for Q4_K (an MoE expert's ~16 tokens: 1.2x) and a few for Q6_K (16
 * sub-blocks a super-block). Measured on a Xeon with AMX (-t 1). kq_amx_min_tokens > 0
 * overrides both (tests). */
static int kq_amx_min_tokens = 0;
static int kq_amx_min_call = 0;
static inline int kq_amx_tile_min(int t) { return kq_amx_min_tokens ? kq_amx_min_tokens : t == KQ_Q5_K ? 10 : 12; }
static inline int kq_amx_call_min(int t) {
    return kq_amx_min_call ? kq_amx_min_call : t == KQ_Q5_K ? 10 : t == KQ_Q4_K ? 14 : 32;
}

static int kq_amx_init(int enable) {
    kq_amx_on = enable && simd_amx_grant(25); /* AMX-INT8 */
    return kq_amx_on;
}

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kq_tilecfg;

/* tiles 0/3: C (16 tokens x 16 int32), 1/4: A (16 tokens x sbv int8), 2/5: B (sbv/4 x 64) */
static inline void kq_amx_config(int sbv) {
    kq_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 2; i++) {
        cfg.rows[3 * i] = 16; cfg.colsb[3 * i] = 64;
        cfg.rows[3 * i + 1] = 16; cfg.colsb[3 * i + 1] = (uint16_t)sbv;
        cfg.rows[3 * i + 2] = (uint8_t)(sbv / 4); cfg.colsb[3 * i + 2] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* one super-block tile's 64 VNNI chunks (4096 bytes): kq_rp_unpack, the tile prefetched first */
static inline __attribute__((always_inline)) void kq_amx_unpack(const int t, const uint8_t *tile, uint8_t *U) {
    simd_prefetch_range(tile, (int)kq_rp_tile_bytes(t));
    kq_rp_unpack(t, tile, U);
}

/* the integer dots of super-block b's sub-blocks for 16 tokens (A at the first token's
 * q8_K row, row stride as bytes) -> cb[s] (16 tokens x 16 rows) */
static inline __attribute__((always_inline)) void
kq_amx_dots(const int nsb, const int sbv, const uint8_t *ub, const int8_t *qa, int64_t as, int32_t (*cb)[256]) {
    for (int s = 0; s < nsb; s += 2) {
        _tile_zero(0);
        _tile_loadd(1, qa + s * sbv, as);
        _tile_loadd(2, ub + s * sbv * 16, 64);
        _tile_dpbsud(0, 1, 2);
        _tile_zero(3);
        _tile_loadd(4, qa + (s + 1) * sbv, as);
        _tile_loadd(5, ub + (s + 1) * sbv * 16, 64);
        _tile_dpbsud(3, 4, 5);
        _tile_stored(0, cb[s], 64);
        _tile_stored(3, cb[s + 1], 64);
    }
}

/* one 16-row group (packed tiles G, unpacked chunks U) x 16 tokens from A (q8_K rows, row
 * stride nb); stores the first ntok tokens' outputs at Y (row stride ldy). Software
 * pipelined: the tile unit computes super-block b+1's dots while the vector units turn
 * super-block b's into the float sums. */
static inline __attribute__((always_inline)) void
kq_amx_kernel(const int t, const uint8_t *G, uint8_t *U, int64_t nb, const kq_q8k *A, int ntok,
              float *Y, int64_t ldy, __mmask16 store_mask, const int unpack) {
    const int six = t == KQ_Q6_K;
    const int nsb = six ? 16 : 8, sbv = six ? 16 : 32;
    const int64_t tb = kq_rp_tile_bytes(t), as = nb * (int64_t)sizeof(kq_q8k);
    __attribute__((aligned(64))) int32_t cbuf[2][16][256];
    __m512 f[16];
    for (int u = 0; u < 16; u++) f[u] = _mm512_setzero_ps();
    if (unpack) kq_amx_unpack(t, G, U);
    kq_amx_dots(nsb, sbv, U, A[0].qs, as, cbuf[0]);
    for (int64_t b = 0; b < nb; b++) {
        if (b + 1 < nb) {
            if (unpack) kq_amx_unpack(t, G + (b + 1) * tb, U + (b + 1) * 4096);
            kq_amx_dots(nsb, sbv, U + (b + 1) * 4096, A[b + 1].qs, as, cbuf[(b + 1) & 1]);
        }
        int32_t (*cb)[256] = cbuf[b & 1];
        const uint8_t *tile = G + b * tb;
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
        __m512i sc[16];
        if (!six) {
            const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
            __m512i mn[4];
            for (int p = 0; p < 4; p++) {
                const __m512i pr = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 64)));
                sc[p] = _mm512_srai_epi32(_mm512_slli_epi32(pr, 16), 16);
                sc[p + 4] = _mm512_srai_epi32(pr, 16);
                mn[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 64 + 32)));
            }
            for (int u = 0; u < 16; u++) {
                const kq_q8k *ab = (const kq_q8k *)((const uint8_t *)A + u * as) + b;
                int32_t bp[4];
                __m128i v = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab->bsums),
                                           _mm_loadu_si128((const __m128i *)(ab->bsums + 8)));
                _mm_storeu_si128((__m128i *)bp, _mm_unpacklo_epi16(v, _mm_srli_si128(v, 8)));
                __m512i ms = _mm512_setzero_si512();
                for (int p = 0; p < 4; p++) ms = _mm512_dpwssd_epi32(ms, mn[p], _mm512_set1_epi32(bp[p]));
                const __m512 da = _mm512_set1_ps(ab->d);
                f[u] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmv, da), f[u]);
                __m512i is = _mm512_setzero_si512();
                for (int s = 0; s < 8; s++)
                    is = _mm512_add_epi32(is, _mm512_mullo_epi32(_mm512_load_si512((const void *)(cb[s] + 16 * u)), sc[s]));
                f[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, da), f[u]);
            }
        } else {
            __m512i scp[8];
            for (int p = 0; p < 8; p++) {
                scp[p] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 32)));
                sc[p] = _mm512_srai_epi32(_mm512_slli_epi32(scp[p], 16), 16);
                sc[p + 8] = _mm512_srai_epi32(scp[p], 16);
            }
            for (int u = 0; u < 16; u++) {
                const kq_q8k *ab = (const kq_q8k *)((const uint8_t *)A + u * as) + b;
                int32_t bp[8];
                __m128i lo = _mm_loadu_si128((const __m128i *)ab->bsums);
                __m128i hi = _mm_loadu_si128((const __m128i *)(ab->bsums + 8));
                _mm_storeu_si128((__m128i *)bp, _mm_unpacklo_epi16(lo, hi));
                _mm_storeu_si128((__m128i *)(bp + 4), _mm_unpackhi_epi16(lo, hi));
                __m512i is = _mm512_setzero_si512();
                for (int p = 0; p < 8; p++) is = _mm512_dpwssd_epi32(is, scp[p], _mm512_set1_epi32(bp[p]));
                is = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(is, 5));
                for (int s = 0; s < 16; s++)
                    is = _mm512_add_epi32(is, _mm512_mullo_epi32(_mm512_load_si512((const void *)(cb[s] + 16 * u)), sc[s]));
                f[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, _mm512_set1_ps(ab->d)), f[u]);
            }
        }
    }
    for (int u = 0; u < ntok; u++) _mm512_mask_storeu_ps(Y + u * ldy, store_mask, f[u]);
}

/* Group g for tokens [0, n) of A (the group's Y at Y): the tiles of at least
 * kq_amx_min_tokens tokens on AMX. Returns the tokens done (0 when the unpack buffer cannot
 * be had); the rest are the caller's. */
static int64_t kq_amx_group(const int t, const uint8_t *G, int64_t nb, const kq_q8k *A, int64_t n,
                            float *Y, int64_t ldy, __mmask16 store_mask) {
    const int min_tile = kq_amx_tile_min(t);
    if (n < kq_amx_call_min(t) || n < min_tile) return 0;
    uint8_t *ub = kq_unpack_buffer(nb);
    if (!ub) return 0;
    kq_amx_config(t == KQ_Q6_K ? 16 : 32);
    int64_t j = 0;
    while (j < n && n - j >= min_tile) {
        const int nt = n - j >= 16 ? 16 : (int)(n - j);
        const kq_q8k *a = (const kq_q8k *)((const uint8_t *)A + j * nb * (int64_t)sizeof(kq_q8k));
        const int first = j == 0; /* the first tile unpacks the group as it goes */
        if (t == KQ_Q4_K) kq_amx_kernel(KQ_Q4_K, G, ub, nb, a, nt, Y + j * ldy, ldy, store_mask, first);
        else if (t == KQ_Q5_K) kq_amx_kernel(KQ_Q5_K, G, ub, nb, a, nt, Y + j * ldy, ldy, store_mask, first);
        else kq_amx_kernel(KQ_Q6_K, G, ub, nb, a, nt, Y + j * ldy, ldy, store_mask, first);
        j += nt;
    }
    _tile_release();
    return j;
}
#else
#define KQ_AMX_BUILT 0
static int kq_amx_on = 0;
static int kq_amx_min_tokens = 0;
static int kq_amx_min_call = 0;
static int kq_amx_init(int enable) { (void)enable; return 0; }
#endif

static inline void kq_u_set_min_tokens(int n) {
#if SIMD_AVX512_VNNI
    kq_u_override = n < 0 ? -1 : n;
#elif defined(KQ_AVX2)
    kq_u_override_avx2 = n < 0 ? -1 : n;
#else
    (void)n;
#endif
}

/* the threshold in use for type t (0: never; builds without the kernel: 0) */
static inline int kq_u_min_tokens_for(int t) {
#if SIMD_AVX512_VNNI
    return t == KQ_MXFP4 ? 0 : kq_u_min(t);
#elif defined(KQ_AVX2)
    return !kq_rp_supported(t) || kq_u_min_avx2(t) == INT32_MAX ? 0 : kq_u_min_avx2(t);
#else
    (void)t;
    return 0;
#endif
}

static inline void kq_amx_set_min_tokens(int tile, int call) {
    kq_amx_min_tokens = tile < 0 ? 0 : tile;
    kq_amx_min_call = call < 0 ? 0 : call;
}

/* Y[tok, g*16 + lane] for tokens tok0 + [0, n) of the activations, one 16-row group.
 * ldy: Y row stride; rows: valid rows of the weight (for the last group's mask). */
static void kq_rp_group(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g,
                        const kq_act *act, int64_t tok0, int64_t n, float *Y, int64_t ldy) {
#if SIMD_AVX512_VNNI
    const uint8_t *G = P + g * kq_rp_group_bytes(t, k);
    const int64_t nvalid = rows - g * KQ_RP;
    const __mmask16 m = nvalid >= KQ_RP ? (__mmask16)0xFFFF : (__mmask16)((1u << nvalid) - 1);
    float *y[4];
    if (t == KQ_MXFP4) {
        const int64_t nblk = k / 32;
        const int8_t *a[4];
        const float *d[4];
        const int32_t *s[4];
        for (int64_t j = 0; j < n;) {
            const int64_t nt = n - j >= 4 ? 4 : n - j;
            for (int u = 0; u < nt; u++) {
                const int64_t tok = tok0 + j + u;
                a[u] = act->aq + tok * k;
                d[u] = act->ad + tok * nblk;
                s[u] = act->as + tok * nblk;
                y[u] = Y + (j + u) * ldy + g * KQ_RP;
            }
            switch (nt) {
            case 4: kq_rp_kernel_mxfp4(4, G, nblk, a, d, s, y, m); break;
            case 3: kq_rp_kernel_mxfp4(3, G, nblk, a, d, s, y, m); break;
            case 2: kq_rp_kernel_mxfp4(2, G, nblk, a, d, s, y, m); break;
            default: kq_rp_kernel_mxfp4(1, G, nblk, a, d, s, y, m); break;
            }
            j += nt;
        }
        return;
    }
    const int64_t nb = k / KQ_QK;
    const kq_q8k *a[4];
    int64_t j = 0;
#if KQ_AMX_BUILT
    if (kq_amx_on && !act->no_amx)
        j = kq_amx_group(t, G, nb, act->q8k + tok0 * nb, n, Y + g * KQ_RP, ldy, m);
#endif
    if (kq_u_min(t) > 0 && n - j >= kq_u_min(t)) {
        kq_u_groups_any(t, 1, G, kq_rp_group_bytes(t, k), nb, act->q8k + (tok0 + j) * nb, n - j,
                        Y + j * ldy + g * KQ_RP, ldy, &m);
        return;
    }
    for (; j < n;) {
        const int64_t nt = n - j >= 4 ? 4 : n - j;
        for (int u = 0; u < nt; u++) {
            a[u] = act->q8k + (tok0 + j + u) * nb;
            y[u] = Y + (j + u) * ldy + g * KQ_RP;
        }
#define KQ_RP_CASE(T)                                                                       \
        switch (nt) {                                                                       \
        case 4: kq_rp_kernel(T, 4, G, nb, a, y, m); break;                                  \
        case 3: kq_rp_kernel(T, 3, G, nb, a, y, m); break;                                  \
        case 2: kq_rp_kernel(T, 2, G, nb, a, y, m); break;                                  \
        default: kq_rp_kernel(T, 1, G, nb, a, y, m); break;                                 \
        }
        if (t == KQ_Q4_K) { KQ_RP_CASE(KQ_Q4_K) }
        else if (t == KQ_Q5_K) { KQ_RP_CASE(KQ_Q5_K) }
        else { KQ_RP_CASE(KQ_Q6_K) }
#undef KQ_RP_CASE
        j += nt;
    }
#elif defined(KQ_AVX2)
    const uint8_t *G = P + g * kq_rp_group_bytes(t, k);
    const int nvalid = rows - g * KQ_RP < KQ_RP ? (int)(rows - g * KQ_RP) : KQ_RP;
    const int64_t nb = k / KQ_QK;
    const kq_q8k *a[KQ_RP_NT_AVX2];
    float *y[KQ_RP_NT_AVX2];
    /* many tokens: the group unpacked once, not once per 4 tokens */
    const uint8_t *U = n >= kq_u_min_avx2(t) ? kq_unpack_buffer(nb) : NULL;
    if (U) kq_rp_unpack_group_avx2(t, G, nb, (uint8_t *)U);
    for (int64_t j = 0; j < n;) {
        const int64_t nt = n - j >= KQ_RP_NT_AVX2 ? KQ_RP_NT_AVX2 : n - j;
        for (int u = 0; u < nt; u++) {
            a[u] = act->q8k + (tok0 + j + u) * nb;
            y[u] = Y + (j + u) * ldy + g * KQ_RP;
        }
#define KQ_RP_CASE(T)                                                                       \
        if (U) {                                                                            \
            switch (nt) {                                                                   \
            case 4: kq_rp_kernel_avx2(T, 4, 1, G, U, nb, a, y, nvalid); break;              \
            case 3: kq_rp_kernel_avx2(T, 3, 1, G, U, nb, a, y, nvalid); break;              \
            case 2: kq_rp_kernel_avx2(T, 2, 1, G, U, nb, a, y, nvalid); break;              \
            default: kq_rp_kernel_avx2(T, 1, 1, G, U, nb, a, y, nvalid); break;             \
            }                                                                               \
        } else {                                                                            \
            switch (nt) {                                                                   \
            case 4: kq_rp_kernel_avx2(T, 4, 0, G, U, nb, a, y, nvalid); break;              \
            case 3: kq_rp_kernel_avx2(T, 3, 0, G, U, nb, a, y, nvalid); break;              \
            case 2: kq_rp_kernel_avx2(T, 2, 0, G, U, nb, a, y, nvalid); break;              \
            default: kq_rp_kernel_avx2(T, 1, 0, G, U, nb, a, y, nvalid); break;             \
            }                                                                               \
        }
        if (t == KQ_Q4_K) { KQ_RP_CASE(KQ_Q4_K) }
        else if (t == KQ_Q5_K) { KQ_RP_CASE(KQ_Q5_K) }
        else { KQ_RP_CASE(KQ_Q6_K) }
#undef KQ_RP_CASE
        j += nt;
    }
#else
    (void)t; (void)P; (void)k; (void)rows; (void)g; (void)act; (void)tok0; (void)n; (void)Y; (void)ldy;
#endif
}

/* Tokens tok0 + [0, n) of the activations: kq_rp_group of group g0 of weight P0 (act0,
 * outputs Y0) and of group g1 of P1 (act1, outputs Y1), both of type t with k columns
 * (rows0 / rows1 valid rows; ldy the outputs' row stride), read side by side, 4 tokens a
 * pass (kq_rp_kernel_pair), where the AVX-512 kernels take that many tokens a group, else
 * one after the other. */
static void kq_rp_group_pair(int t, int64_t k, const uint8_t *P0, int64_t rows0, int64_t g0, const kq_act *act0,
                             float *Y0, const uint8_t *P1, int64_t rows1, int64_t g1, const kq_act *act1, float *Y1,
                             int64_t tok0, int64_t n, int64_t ldy) {
#if SIMD_AVX512_VNNI
    /* (under 8 tokens kq_rp_group's AMX tiles take none: they start at 10) */
    if ((t == KQ_Q4_K || t == KQ_Q5_K || t == KQ_Q6_K) && !(kq_u_min(t) > 0 && n >= kq_u_min(t)) && n < 8) {
        const int64_t gb = kq_rp_group_bytes(t, k), nb = k / KQ_QK;
        const uint8_t *G[2] = {P0 + g0 * gb, P1 + g1 * gb};
        __mmask16 m[2];
        for (int s = 0; s < 2; s++) {
            const int64_t nvalid = (s ? rows1 - g1 * KQ_RP : rows0 - g0 * KQ_RP);
            m[s] = nvalid >= KQ_RP ? (__mmask16)0xFFFF : (__mmask16)((1u << nvalid) - 1);
        }
        for (int64_t j = 0; j < n; j += 4) {
            const int nt = (int)(n - j < 4 ? n - j : 4);
            const kq_q8k *A[2][4];
            float *Y[2][4];
            for (int u = 0; u < nt; u++) {
                A[0][u] = act0->q8k + (tok0 + j + u) * nb;
                A[1][u] = act1->q8k + (tok0 + j + u) * nb;
                Y[0][u] = Y0 + (j + u) * ldy + g0 * KQ_RP;
                Y[1][u] = Y1 + (j + u) * ldy + g1 * KQ_RP;
            }
#define KQ_PAIR_CASE(T)                                                                     \
            switch (nt) {                                                                   \
            case 1: kq_rp_kernel_pair(T, 1, G, nb, A, Y, m); break;                         \
            case 2: kq_rp_kernel_pair(T, 2, G, nb, A, Y, m); break;                         \
            case 3: kq_rp_kernel_pair(T, 3, G, nb, A, Y, m); break;                         \
            default: kq_rp_kernel_pair(T, 4, G, nb, A, Y, m); break;                        \
            }
            if (t == KQ_Q4_K) { KQ_PAIR_CASE(KQ_Q4_K) }
            else if (t == KQ_Q5_K) { KQ_PAIR_CASE(KQ_Q5_K) }
            else { KQ_PAIR_CASE(KQ_Q6_K) }
#undef KQ_PAIR_CASE
        }
        return;
    }
#endif
    kq_rp_group(t, P0, k, rows0, g0, act0, tok0, n, Y0, ldy);
    kq_rp_group(t, P1, k, rows1, g1, act1, tok0, n, Y1, ldy);
}

/* kq_rp_group for groups g0 .. g0 + ngr - 1 (ngr 1 or 2) of one call: the unpacked-tile
 * kernel takes both groups at once (each activation broadcast feeds both). */
static void kq_rp_groups(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g0, int ngr,
                         const kq_act *act, int64_t tok0, int64_t n, float *Y, int64_t ldy) {
#if SIMD_AVX512_VNNI
    if (t != KQ_MXFP4 && kq_u_min(t) > 0 && n >= kq_u_min(t) && !(KQ_AMX_BUILT && kq_amx_on && !act->no_amx)) {
        const int64_t gb = kq_rp_group_bytes(t, k);
        __mmask16 m[2];
        for (int g = 0; g < ngr; g++) {
            const int64_t nvalid = rows - (g0 + g) * KQ_RP;
            m[g] = nvalid >= KQ_RP ? (__mmask16)0xFFFF : (__mmask16)((1u << nvalid) - 1);
        }
        kq_u_groups_any(t, ngr, P + g0 * gb, gb, k / KQ_QK, act->q8k + tok0 * k / KQ_QK, n, Y + g0 * KQ_RP, ldy, m);
        return;
    }
#endif
    for (int g = 0; g < ngr; g++) kq_rp_group(t, P, k, rows, g0 + g, act, tok0, n, Y, ldy);
}

/* ---------------------------------------------------------------- AMX-BF16 (prefill) */
/* Matmuls of ab_min_tokens tokens or more of Q4_K / Q5_K / Q6_K on a CPU with AMX-BF16: each
 * work item dequantizes one or two row groups to bf16 B tiles (simd_amx_bf16.h) and runs
 * every token tile on them with f32 sums over the whole row. */
#include "simd_amx_bf16.h"
#if AB_BUILT && SIMD_AVX512_VNNI
/* a group's nb super-blocks (tiles at G) as bf16 B tiles, 8 steps a super-block at wb: the
 * unpacked chunks (U: 4096 bytes of scratch) times d * sc, less dmin * mn (Q4_K / Q5_K), or
 * d * sc * (q - 32) (Q6_K) */
static inline __attribute__((always_inline)) void kq_ab_dequant_t(const int t, const uint8_t *G, int64_t nb,
                                                                    uint8_t *U, uint16_t *wb) {
    const int64_t tb = kq_rp_tile_bytes(t);
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *tile = G + b * tb;
        kq_rp_unpack(t, tile, U);
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
        __m512 S[16], O[16];
        if (t != KQ_Q6_K) { /* sub-blocks of 32: scale and min pairs (p, p + 4) */
            const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
            for (int p = 0; p < 4; p++) {
                const __m512i sc = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 64)));
                const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 64 + 32)));
                S[p] = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_and_si512(sc, lo16)));
                S[p + 4] = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 16)));
                O[p] = _mm512_mul_ps(dmv, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_and_si512(mn, lo16))));
                O[p + 4] = _mm512_mul_ps(dmv, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_srli_epi32(mn, 16))));
            }
            for (int J = 0; J < 64; J++)
                ab_chunk_to_step(_mm512_load_si512((const void *)(U + 64 * J)), J & 7, S[J >> 3], O[J >> 3],
                                 wb + (b * 8 + (J >> 3)) * 512);
        } else { /* sub-blocks of 16: signed scale pairs (p, p + 8) */
            const __m512 m32 = _mm512_set1_ps(-32.f);
            for (int p = 0; p < 8; p++) {
                const __m512i sc = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tile + 64 + p * 32)));
                S[p] = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sc, 16), 16)));
                S[p + 8] = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_srai_epi32(sc, 16)));
                O[p] = _mm512_mul_ps(S[p], m32);
                O[p + 8] = _mm512_mul_ps(S[p + 8], m32);
            }
            for (int J = 0; J < 64; J++)
                ab_chunk_to_step(_mm512_load_si512((const void *)(U + 64 * J)), J & 7, S[J >> 2], O[J >> 2],
                                 wb + (b * 8 + (J >> 3)) * 512);
        }
    }
}

static inline int kq_ab_ok(int t, int64_t k, int64_t n) {
    return (t == KQ_Q4_K || t == KQ_Q5_K || t == KQ_Q6_K) && k > 0 && ab_use(n);
}

/* groups g0 .. g0 + ng - 1 (ng 1 or 2) of a repacked weight P (rows x k) x the n tokens of
 * the activation tiles xb: Y (row stride ldy) at the groups' columns. Returns 0 when the
 * weight buffer cannot be had. */
static int kq_ab_groups(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g0, int ng, const uint16_t *xb,
                        int64_t n, float *Y, int64_t ldy) {
    const int64_t nb = k / KQ_QK, ns = k / 32, gb = kq_rp_group_bytes(t, k);
    uint16_t *wb = ab_weight_buffer((size_t)ns * 2048 + 4096);
    if (!wb) return 0;
    uint8_t *U = (uint8_t *)(wb + ns * 1024);
    for (int j = 0; j < ng; j++) {
        const uint8_t *G = P + (g0 + j) * gb;
        if (t == KQ_Q4_K) kq_ab_dequant_t(KQ_Q4_K, G, nb, U, wb + j * ns * 512);
        else if (t == KQ_Q5_K) kq_ab_dequant_t(KQ_Q5_K, G, nb, U, wb + j * ns * 512);
        else kq_ab_dequant_t(KQ_Q6_K, G, nb, U, wb + j * ns * 512);
    }
    const int nv0 = (int)(rows - g0 * KQ_RP < KQ_RP ? rows - g0 * KQ_RP : KQ_RP);
    const int nv1 = ng > 1 ? (int)(rows - (g0 + 1) * KQ_RP < KQ_RP ? rows - (g0 + 1) * KQ_RP : KQ_RP) : 0;
    ab_config();
    ab_gemm(xb, n, ns, wb, nv0, Y + g0 * KQ_RP, ng > 1 ? wb + ns * 512 : NULL, nv1, Y + (g0 + 1) * KQ_RP, ldy);
    _tile_release();
    return 1;
}
#else
static inline int kq_ab_ok(int t, int64_t k, int64_t n) { (void)t; (void)k; (void)n; return 0; }
static int kq_ab_groups(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g0, int ng, const uint16_t *xb,
                        int64_t n, float *Y, int64_t ldy) {
    (void)t; (void)P; (void)k; (void)rows; (void)g0; (void)ng; (void)xb; (void)n; (void)Y; (void)ldy;
    return 0;
}
#endif

/* q8_0 activations for MXFP4 plus the per-block sums of the int8 values */
static void kq_quantize_q8_0_sums(const float *x, int64_t k, int8_t *qs, float *d, int32_t *s) {
    kq_quantize_q8_0(x, k, qs, d);
    for (int64_t i = 0; i < k / 32; i++) {
        int32_t t = 0;
        for (int j = 0; j < 32; j++) t += qs[i * 32 + j];
        s[i] = t;
    }
}

#endif /* LLMCORE_SIMD_KQUANTS_H */
