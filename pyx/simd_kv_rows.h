/* KV row codecs for pyx/kv_rows.pxd: ggml Q8_0 / Q4_0 rows (blocks of 32), byte-identical to
 * ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref and their dequantization. f16 rows use
 * the conversions of simd.h. */
#ifndef LLMCORE_SIMD_KV_ROWS_H
#define LLMCORE_SIMD_KV_ROWS_H

#include "simd.h"

/* No FMA contraction here: ggml's reference computes x*id + 8.5f as two roundings. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__AVX512F__)
/* a block's 32 values in two vectors; 0 when one is NaN or infinite (the scalar loop then) */
static inline int kv_block_finite(const float *x, __m512 *x0, __m512 *x1, __m512 *a0, __m512 *a1) {
    const __m512 big = _mm512_set1_ps(3.4028235e38f);
    *x0 = _mm512_loadu_ps(x);
    *x1 = _mm512_loadu_ps(x + 16);
    *a0 = _mm512_abs_ps(*x0);
    *a1 = _mm512_abs_ps(*x1);
    return (_mm512_cmp_ps_mask(*a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(*a1, big, _CMP_NLE_UQ)) == 0;
}
#endif

/* The AVX-512 forms below give the scalar loops' bytes: max and abs are exact, the products
 * and sums are single roundings as in the loops (no contraction here), cvtt truncates as the
 * casts do, and roundf (half away from zero) is trunc plus the sign where |v - trunc(v)| >=
 * 0.5 (an exact difference for |v| < 2^23). */
static void kv_quantize_q8_0(const float *x, uint8_t *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 32, y += 34) {
#if defined(__AVX512F__)
        __m512 x0, x1, a0, a1;
        if (kv_block_finite(x, &x0, &x1, &a0, &a1)) {
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            uint16_t hd = simd_f2h(d);
            memcpy(y, &hd, 2);
            const __m512 iv = _mm512_set1_ps(id), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
            __m512i q[2];
            for (int h = 0; h < 2; h++) {
                const __m512 v = _mm512_mul_ps(h ? x1 : x0, iv);
                const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), half, _CMP_GE_OQ);
                const __m512 r = _mm512_mask_add_ps(t, up, t, _mm512_or_ps(one, _mm512_and_ps(v, _mm512_set1_ps(-0.0f))));
                q[h] = _mm512_cvttps_epi32(r);
            }
            _mm_storeu_si128((__m128i *)(y + 2), _mm512_cvtepi32_epi8(q[0]));
            _mm_storeu_si128((__m128i *)(y + 18), _mm512_cvtepi32_epi8(q[1]));
            continue;
        }
#endif
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) { float a = fabsf(x[j]); amax = a > amax ? a : amax; }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t hd = simd_f2h(d);
        memcpy(y, &hd, 2);
        for (int j = 0; j < 32; j++) {
            volatile float v = x[j] * id;
            ((int8_t *)y)[2 + j] = (int8_t)roundf(v);
        }
    }
}

static void kv_quantize_q4_0(const float *x, uint8_t *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 32, y += 18) {
#if defined(__AVX512F__)
        __m512 x0, x1, a0, a1;
        if (kv_block_finite(x, &x0, &x1, &a0, &a1)) {
            /* the value of the first largest |x| (the loop's strict compare keeps the first;
             * an all-zero block keeps max = +0) */
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            const __m512 am = _mm512_set1_ps(amax);
            const uint32_t at = (uint32_t)_mm512_cmp_ps_mask(a0, am, _CMP_EQ_OQ) |
                                ((uint32_t)_mm512_cmp_ps_mask(a1, am, _CMP_EQ_OQ) << 16);
            const float max = amax > 0.0f ? x[__builtin_ctz(at)] : 0.0f;
            const float d = max / -8.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            uint16_t hd = simd_f2h(d);
            memcpy(y, &hd, 2);
            const __m512 iv = _mm512_set1_ps(id), bias = _mm512_set1_ps(8.5f);
            const __m512i lim = _mm512_set1_epi32(15);
            const __m512i q0 = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(x0, iv), bias)), lim);
            const __m512i q1 = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(x1, iv), bias)), lim);
            _mm_storeu_si128((__m128i *)(y + 2), _mm512_cvtepi32_epi8(_mm512_or_si512(q0, _mm512_slli_epi32(q1, 4))));
            continue;
        }
#endif
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float a = fabsf(x[j]);
            if (amax < a) { amax = a; max = x[j]; }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t hd = simd_f2h(d);
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

/* Dequantize: d * (float)q, one rounding per value, so the vector forms give the scalar
 * loop's bits (attention reads a quantized cache through these, block after block). */
static inline void kv_dequant_q8_0(const uint8_t *x, float *y, int n) {
#if defined(__AVX512F__)
    for (int b = 0; b < n / 32; b++, x += 34, y += 32) {
        const __m512 d = _mm512_set1_ps(simd_load_f16(x));
        const __m128i q0 = _mm_loadu_si128((const __m128i *)(x + 2));
        const __m128i q1 = _mm_loadu_si128((const __m128i *)(x + 18));
        _mm512_storeu_ps(y, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0))));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1))));
    }
    return;
#elif defined(__AVX2__)
    for (int b = 0; b < n / 32; b++, x += 34, y += 32) {
        const __m256 d = _mm256_set1_ps(simd_load_f16(x));
        for (int k = 0; k < 32; k += 8) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(x + 2 + k));
            _mm256_storeu_ps(y + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
    }
    return;
#endif
    for (int b = 0; b < n / 32; b++, x += 34, y += 32) {
        const float d = simd_load_f16(x);
        const int8_t *q = (const int8_t *)(x + 2);
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
    }
}

#if defined(__AVX512F__)
/* the 32 values d * (n - 8) of the Q4_0 block at x: nibble n -> its value by a permute (it
 * reads the low 4 bits of each index) of a table already times d (the products are exact,
 * so the bits of d * (float)(n - 8)) */
/* kv_q4_0_block with the block's scale given as a float (the same bits) */
static inline __attribute__((always_inline)) void kv_q4_0_block_d(const uint8_t *x, float d, __m512 *lo, __m512 *hi) {
    const __m512 lut = _mm512_mul_ps(_mm512_set1_ps(d),
                                     _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x + 2)));
    *lo = _mm512_permutexvar_ps(q, lut);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), lut);
}

static inline void kv_q4_0_block(const uint8_t *x, __m512 *lo, __m512 *hi) {
    const __m512 lut = _mm512_mul_ps(_mm512_set1_ps(simd_load_f16(x)),
                                     _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x + 2)));
    *lo = _mm512_permutexvar_ps(q, lut);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), lut);
}
#endif

static inline void kv_dequant_q4_0(const uint8_t *x, float *y, int n) {
#if defined(__AVX512F__)
    for (int b = 0; b < n / 32; b++, x += 18, y += 32) {
        __m512 lo, hi;
        kv_q4_0_block(x, &lo, &hi);
        _mm512_storeu_ps(y, lo);
        _mm512_storeu_ps(y + 16, hi);
    }
    return;
#elif defined(__AVX2__)
    const __m256i lo4 = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
    for (int b = 0; b < n / 32; b++, x += 18, y += 32) {
        const __m256 d = _mm256_set1_ps(simd_load_f16(x));
        for (int k = 0; k < 16; k += 8) {
            const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x + 2 + k)));
            const __m256i a = _mm256_sub_epi32(_mm256_and_si256(q, lo4), eight);
            const __m256i c = _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight);
            _mm256_storeu_ps(y + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(a)));
            _mm256_storeu_ps(y + 16 + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(c)));
        }
    }
    return;
#endif
    for (int b = 0; b < n / 32; b++, x += 18, y += 32) {
        const float d = simd_load_f16(x);
        const uint8_t *q = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)(q[j] & 0x0f) - 8);
            y[j + 16] = d * (float)((int)(q[j] >> 4) - 8);
        }
    }
}

/* ---- Q4_0 K in 16-key tiles ----------------------------------------------------------------
 * A Q4_0 K pool may store each 16 slots x one kv head of a block as a tile, in the layout the
 * int8 scores kernel wants its keys in (simd_attention.h, attn_rows_scores_q8): key u's 32-value
 * blocks b = 0..nb-1 (nb = head_dim / 32) as
 *     scales   tile[32 b + 2 u .. + 2)              the block's f16 scale
 *     packed   tile[32 nb + 512 p + 64 d + 4 u .. + 4) for pairs of blocks p = (2p, 2p + 1):
 *              dword d (0..7) of the key's 32 packed bytes (block 2p's 16, then 2p + 1's);
 *              a last block without a pair (nb odd) keeps d = 0..3 (256 bytes)
 * so that 16 keys' dword d is one 64-byte vector (keys in lanes) and their scales one 32-byte
 * vector. A tile is 16 rows' bytes (16 x 18 nb); the slot's row is its bytes rearranged. */
static inline void kv_tile_put_q4_0(const uint8_t *row, uint8_t *tile, int u, int nb) {
    for (int b = 0; b < nb; b++) memcpy(tile + 32 * b + 2 * u, row + 18 * b, 2);
    uint8_t *pk = tile + 32 * nb;
    for (int p = 0; 2 * p < nb; p++, pk += 512) {
        const int nd = 2 * p + 1 < nb ? 8 : 4;
        for (int d = 0; d < nd; d++) memcpy(pk + 64 * d + 4 * u, row + 18 * (2 * p + d / 4) + 2 + 4 * (d % 4), 4);
    }
}

static inline void kv_tile_get_q4_0(const uint8_t *tile, int u, uint8_t *row, int nb) {
    for (int b = 0; b < nb; b++) memcpy(row + 18 * b, tile + 32 * b + 2 * u, 2);
    const uint8_t *pk = tile + 32 * nb;
    for (int p = 0; 2 * p < nb; p++, pk += 512) {
        const int nd = 2 * p + 1 < nb ? 8 : 4;
        for (int d = 0; d < nd; d++) memcpy(row + 18 * (2 * p + d / 4) + 2 + 4 * (d % 4), pk + 64 * d + 4 * u, 4);
    }
}

/* whether a K pool of this format can be tiled (head_dim <= 1024: the codecs' row buffers) */
static inline int kv_tiles_ok(int is_q4_0, int block_size, int head_dim) {
    return is_q4_0 && block_size % 16 == 0 && head_dim % 32 == 0 && head_dim <= 1024;
}

/* slot t (of a block of rows) of kv head h in a tiled block: its tile and lane */
static inline uint8_t *kv_tile_of(uint8_t *block, int t, int h, int KVH, int row_bytes, int *u) {
    *u = t & 15;
    return block + ((long)(t >> 4) * KVH + h) * 16L * row_bytes;
}

/* the values of slot t, kv head h of a tiled Q4_0 block: y (32 nb,) */
static inline void kv_tile_load_q4_0(const uint8_t *block, int t, int h, int KVH, int nb, float *y) {
    uint8_t row[18 * 32];  /* (head_dim <= 1024) */
    int u;
    const uint8_t *tile = kv_tile_of((uint8_t *)block, t, h, KVH, 18 * nb, &u);
    kv_tile_get_q4_0(tile, u, row, nb);
    kv_dequant_q4_0(row, y, 32 * nb);
}

/* slot t, kv head h of a tiled Q4_0 block = x (32 nb,), quantized */
static inline void kv_tile_store_q4_0(const float *x, uint8_t *block, int t, int h, int KVH, int nb) {
    uint8_t row[18 * 32];
    int u;
    uint8_t *tile = kv_tile_of(block, t, h, KVH, 18 * nb, &u);  /* (sets u: before the call that reads it) */
    kv_quantize_q4_0(x, row, 32 * nb);
    kv_tile_put_q4_0(row, tile, u, nb);
}

/* slots [j0, j1) of kv head h of a tiled Q4_0 block as f32 rows, y + j * ld (the prefill
 * tiles' conversion of a block; kv_tile_load_q4_0's values) */
static inline void kv_tile_load_rows_q4_0(const uint8_t *block, int j0, int j1, int h, int KVH, int nb, float *y,
                                          long ld) {
#if defined(__AVX512F__)
    const __m512 lut0 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    for (int j = j0; j < j1; j++) {
        int u;
        const uint8_t *tile = kv_tile_of((uint8_t *)block, j, h, KVH, 18 * nb, &u);
        float *yj = y + (long)j * ld;
        for (int b = 0; b < nb; b++) {
            const uint8_t *pk = tile + 32 * nb + 512 * (b >> 1) + 256 * (b & 1) + 4 * u;
            uint32_t w0, w1, w2, w3;
            memcpy(&w0, pk, 4); memcpy(&w1, pk + 64, 4); memcpy(&w2, pk + 128, 4); memcpy(&w3, pk + 192, 4);
            const __m128i x = _mm_setr_epi32((int)w0, (int)w1, (int)w2, (int)w3);
            const __m512 lut = _mm512_mul_ps(_mm512_set1_ps(simd_load_f16(tile + 32 * b + 2 * u)), lut0);
            const __m512i q = _mm512_cvtepu8_epi32(x);
            _mm512_storeu_ps(yj + 32 * b, _mm512_permutexvar_ps(q, lut));
            _mm512_storeu_ps(yj + 32 * b + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), lut));
        }
    }
#else
    for (int j = j0; j < j1; j++) kv_tile_load_q4_0(block, j, h, KVH, nb, y + (long)j * ld);
#endif
}

#endif /* LLMCORE_SIMD_KV_ROWS_H */
