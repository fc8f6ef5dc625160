/* An int8 P.V against the decode rows kernel's f32 P.V, in L1 (an exploration, not the
 * engine's code): 3 query rows (SmolLM2's GQA group) x 32 keys (a KV block) x 64 values of a
 * Q4_0 V read in place from its rows (3 kv heads a key).
 *
 *     gcc -O3 -march=native -Ipyx bench/harness/pv_int8.c -o /tmp/pv_int8 -lm && /tmp/pv_int8
 *
 * Needs AVX-512 VBMI and VNNI. The int8 form: w = p x d (the key's V block scale) quantized
 * to u8 with the block's largest d / 255 as the scale (p <= 1 after the running max), each 4
 * keys' nibble bytes interleaved a dword a dimension by one vpermb, 3 rows x 2 blocks x 2
 * halves of vpdpbusd, one convert and fma a row vector at the block's end. Three timings, TSC
 * ticks a key: the f32 P.V (attn_rows_pv_all); the int8 form reading the 32 keys' scales from
 * their rows; the same with the scales where two vector loads read them (as a V tile layout
 * would store them); and its vpdpbusd part alone (w quantized once). It prints the int8
 * form's relative RMS difference from the f32 P.V. bench/RESULTS.md (session 27) has the
 * figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

#include "simd_attention.h"
#include "pv_harness.h"

#define NK 32
#define KVH 3
static const long LDV = KVH * 36; /* bytes a key: 3 kv heads x 2 Q4_0 blocks */

enum { SCALES_FROM_ROWS = 0, SCALES_APART = 1, DOTS_ONLY = 2 };
static uint8_t wq[3][2][32] __attribute__((aligned(64)));
static float sc[3][2];
static uint16_t d_apart[2][32] __attribute__((aligned(64)));

static inline __attribute__((always_inline)) void pv_int8(float *o, const float *p, const uint8_t *v,
                                                           const float *alpha, int mode) {
    if (mode != DOTS_ONLY) {
        uint16_t dh[2][32] __attribute__((aligned(64)));
        const uint16_t(*dsrc)[32] = d_apart;
        if (mode == SCALES_FROM_ROWS) {
            pv_scales_of_rows(v, LDV, dh);
            dsrc = (const uint16_t(*)[32])dh;
        }
        __m512 d[2][2];
        for (int b = 0; b < 2; b++) {
            d[b][0] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dsrc[b]));
            d[b][1] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(dsrc[b] + 16)));
            const float dm = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(d[b][0]), _mm512_abs_ps(d[b][1])));
            const float s = dm > 0 ? dm / 255.f : 1.f;
            for (int r = 0; r < 3; r++) sc[r][b] = s;
            d[b][0] = _mm512_mul_ps(d[b][0], _mm512_set1_ps(1.f / s));
            d[b][1] = _mm512_mul_ps(d[b][1], _mm512_set1_ps(1.f / s));
        }
        for (int r = 0; r < 3; r++)
            for (int b = 0; b < 2; b++) {
                const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p + r * NK), d[b][0]));
                const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p + r * NK + 16), d[b][1]));
                _mm_store_si128((__m128i *)wq[r][b], _mm512_cvtusepi32_epi8(q0));
                _mm_store_si128((__m128i *)(wq[r][b] + 16), _mm512_cvtusepi32_epi8(q1));
            }
    }
    static const uint8_t idxb[64] __attribute__((aligned(64))) = {
        0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53,
        6, 22, 38, 54, 7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59,
        12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
    const __m512i idx = _mm512_load_si512(idxb), m4 = _mm512_set1_epi8(0x0F), e8 = _mm512_set1_epi8(8);
    __m512i acc[3][4];
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_si512();
    for (int g = 0; g < NK / 4; g++)
        for (int b = 0; b < 2; b++) {
            const uint8_t *k0 = v + (long)(4 * g) * LDV + 18 * b + 2;
            __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)k0));
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(k0 + LDV)), 1);
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(k0 + 2 * LDV)), 2);
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(k0 + 3 * LDV)), 3);
            x = _mm512_permutexvar_epi8(idx, x);
            const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(x, m4), e8);
            const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(x, 4), m4), e8);
            for (int r = 0; r < 3; r++) {
                int32_t wd;
                memcpy(&wd, &wq[r][b][4 * g], 4);
                const __m512i wb = _mm512_set1_epi32(wd);
                acc[r][2 * b] = _mm512_dpbusd_epi32(acc[r][2 * b], wb, lo);
                acc[r][2 * b + 1] = _mm512_dpbusd_epi32(acc[r][2 * b + 1], wb, hi);
            }
        }
    for (int r = 0; r < 3; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int i = 0; i < 4; i++) {
            __m512 ov = _mm512_mul_ps(_mm512_loadu_ps(o + r * 64 + 16 * i), a);
            ov = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][i]), _mm512_set1_ps(sc[r][i / 2]), ov);
            _mm512_storeu_ps(o + r * 64 + 16 * i, ov);
        }
    }
}

int main(void) {
    uint8_t *v = aligned_alloc(64, 64 * LDV + 64);
    float p[3 * NK], alpha[3] = {1, 1, 1}, o1[3 * 64], o2[3 * 64] = {0};
    pv_problem(v, LDV, 0, d_apart, p, NK, o1);
    pv_int8(o2, p, v, alpha, SCALES_FROM_ROWS);
    printf("int8 P.V: relative RMS difference from the f32 P.V %.2e\n", pv_rel_rms(o1, o2, 192));
    for (int rep = 0; rep < 3; rep++) {
        double t[4];
        for (int m = -1; m < 3; m++)
            PV_TICKS_PER_KEY(t[m + 1], 200000, NK, p, v, m < 0 ? o1 : o2,
                             if (m < 0) attn_rows_pv_all(3, ATTN_KV_Q4_0, oo, 64, pp, NK, vv, LDV, 0, NK, alpha, NULL);
                             else pv_int8(oo, pp, vv, alpha, m));
        printf("ticks a key: f32 %.2f | int8, scales from the rows %.2f, scales apart %.2f, dots only %.2f\n",
               t[0], t[1], t[2], t[3]);
    }
    printf("(check %g %g)\n", o1[5], o2[5]);
    return 0;
}
