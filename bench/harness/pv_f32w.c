/* An f32 P.V with the V scales folded into the probabilities against the decode rows
 * kernel's f32 P.V, in L1 (an exploration, not the engine's code): 3 query rows (SmolLM2's
 * GQA group) x 32 keys (a KV block) x 64 values of a Q4_0 V read in place from its rows
 * (3 kv heads a key).
 *
 *     gcc -O3 -march=native -Ipyx -Ibench/harness bench/harness/pv_f32w.c -o /tmp/pv_f32w -lm && /tmp/pv_f32w
 *
 * The form: w = p x d (32 keys a row and block at once), the nibbles as floats by
 * zero-extend / and / shift / convert (no permute and no multiply a key), o += w x n by
 * fmas whose w is a broadcast memory operand, one -8 sum(w) correction a row and block
 * (sums within float rounding of the engine's: relative RMS 2e-7). TSC ticks a key: the
 * engine's form, then this one with the 32 keys' scales copied from their rows and with
 * the scales already apart (as a V tile layout would store them). Session 31: 6.05-6.08
 * against 6.25-6.37 (rows) and 4.82-4.99 (apart): 0.80x only with a V layout that keeps the
 * scales apart, and session 30's bf16 form (0.63x in L1 with the scales apart) gave a
 * 32-sequence step's attention nothing in place: bench/RESULTS.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

#include "simd_attention.h"
#include "pv_harness.h"

#define NK 32
#define KVH 3
static const long LDV = KVH * 36;
static uint16_t d_apart[2][32] __attribute__((aligned(64)));

static inline __attribute__((always_inline)) void pv_f32w(float *o, const float *p, const uint8_t *v,
                                                          const float *alpha, const int apart) {
    uint16_t dh[2][32] __attribute__((aligned(64)));
    const uint16_t(*dsrc)[32] = d_apart;
    if (!apart) {
        pv_scales_of_rows(v, LDV, dh);
        dsrc = (const uint16_t(*)[32])dh;
    }
    float w[3][2][NK] __attribute__((aligned(64)));
    float corr[3][2];
    for (int b = 0; b < 2; b++) {
        const __m512 d0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dsrc[b]));
        const __m512 d1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(dsrc[b] + 16)));
        for (int r = 0; r < 3; r++) {
            const __m512 w0 = _mm512_mul_ps(_mm512_loadu_ps(p + r * NK), d0);
            const __m512 w1 = _mm512_mul_ps(_mm512_loadu_ps(p + r * NK + 16), d1);
            _mm512_store_ps(w[r][b], w0);
            _mm512_store_ps(w[r][b] + 16, w1);
            corr[r][b] = 8.0f * _mm512_reduce_add_ps(_mm512_add_ps(w0, w1));
        }
    }
    const __m512i m4 = _mm512_set1_epi32(0x0F);
    __m512 acc[3][4];
    for (int r = 0; r < 3; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int i = 0; i < 4; i++) acc[r][i] = _mm512_mul_ps(_mm512_loadu_ps(o + r * 64 + 16 * i), a);
    }
    for (int j = 0; j < NK; j++) {
        const uint8_t *k = v + (long)j * LDV + 2;
        const __m512i x0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)k));
        const __m512i x1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(k + 18)));
        const __m512 f0 = _mm512_cvtepi32_ps(_mm512_and_si512(x0, m4));
        const __m512 f1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(x0, 4));
        const __m512 f2 = _mm512_cvtepi32_ps(_mm512_and_si512(x1, m4));
        const __m512 f3 = _mm512_cvtepi32_ps(_mm512_srli_epi32(x1, 4));
        for (int r = 0; r < 3; r++) {
            const __m512 wa = _mm512_set1_ps(w[r][0][j]), wb = _mm512_set1_ps(w[r][1][j]);
            acc[r][0] = _mm512_fmadd_ps(wa, f0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(wa, f1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(wb, f2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(wb, f3, acc[r][3]);
        }
    }
    for (int r = 0; r < 3; r++) {
        const __m512 c0 = _mm512_set1_ps(corr[r][0]), c1 = _mm512_set1_ps(corr[r][1]);
        _mm512_storeu_ps(o + r * 64, _mm512_sub_ps(acc[r][0], c0));
        _mm512_storeu_ps(o + r * 64 + 16, _mm512_sub_ps(acc[r][1], c0));
        _mm512_storeu_ps(o + r * 64 + 32, _mm512_sub_ps(acc[r][2], c1));
        _mm512_storeu_ps(o + r * 64 + 48, _mm512_sub_ps(acc[r][3], c1));
    }
}

int main(void) {
    uint8_t *v = aligned_alloc(64, 64 * LDV + 64);
    float p[3 * NK], alpha[3] = {1, 1, 1}, o1[3 * 64], o2[3 * 64] = {0};
    pv_problem(v, LDV, 1, d_apart, p, NK, o1);
    pv_f32w(o2, p, v, alpha, 0);
    printf("f32w P.V: relative RMS difference from the f32 P.V: %.2e\n", pv_rel_rms(o1, o2, 192));
    for (int rep = 0; rep < 3; rep++) {
        double t[3];
        for (int m = -1; m < 2; m++)
            PV_TICKS_PER_KEY(t[m + 1], 200000, NK, p, v, m < 0 ? o1 : o2,
                             if (m < 0) attn_rows_pv_all(3, ATTN_KV_Q4_0, oo, 64, pp, NK, vv, LDV, 0, NK, alpha, NULL);
                             else pv_f32w(oo, pp, vv, alpha, m));
        printf("ticks a key: f32 (engine) %.2f | f32w: scales from the rows %.2f, apart %.2f\n", t[0], t[1], t[2]);
    }
    printf("(check %g %g)\n", o1[5], o2[5]);
    return 0;
}
