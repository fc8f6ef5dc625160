/* An int16 P.V against the decode rows kernel's f32 P.V, in L1 (an exploration, not the
 * engine's code): 3 query rows (SmolLM2's GQA group) x 32 keys (a KV block) x 64 values of a
 * Q4_0 V read in place from its rows (3 kv heads a key).
 *
 *     gcc -O3 -march=native -Ipyx bench/harness/pv_i16.c -o /tmp/pv_i16 -lm && /tmp/pv_i16
 *
 * Needs AVX-512 VBMI and VNNI. The int16 form: per row and V block, w = p x d (signed)
 * quantized to s16 against the row's largest |w| in the block (an attention sink's block
 * keeps its small weights: 15 bits, not 8), 2 keys' nibbles as words by one zero-masked
 * vpermb, 3 rows x 2 halves of vpdpwssd against the nibbles (0..15), the -8 offset as
 * 8 x sum(w) a row, one convert and fma a row vector at the block's end. It prints the
 * relative RMS difference from the f32 P.V per row (row 0 holds a sink: p = 1 on key 0,
 * <= 0.05 elsewhere) and TSC ticks a key: f32, int16, and int16's dot products alone
 * (w quantized once). bench/RESULTS.md (session 28) has the figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
#include "simd_attention.h"
#include "pv_harness.h"
#define NK 32
static const long LDV = 3 * 36;

static inline __attribute__((always_inline)) void pv_i16(float *o, const float *p, int ldS, const uint8_t *v, long ldv,
                                                          const float *alpha, int mode) {
    static const uint8_t idxb[64] __attribute__((aligned(64))) = {
        0, 0, 16, 0, 1, 0, 17, 0, 2, 0, 18, 0, 3, 0, 19, 0, 4, 0, 20, 0, 5, 0, 21, 0, 6, 0, 22, 0, 7, 0, 23, 0,
        8, 0, 24, 0, 9, 0, 25, 0, 10, 0, 26, 0, 11, 0, 27, 0, 12, 0, 28, 0, 13, 0, 29, 0, 14, 0, 30, 0, 15, 0, 31, 0};
    const __m512i idx = _mm512_load_si512(idxb), m4 = _mm512_set1_epi16(0x0F);
    for (int b = 0; b < 2; b++) {
        const uint8_t *vb = v + 18 * b;
        uint16_t dh[NK] __attribute__((aligned(64)));
        for (int j = 0; j < NK; j++) memcpy(&dh[j], vb + j * ldv, 2);
        const __m512 d0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dh));
        const __m512 d1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(dh + 16)));
        static int32_t wq[3][NK / 2] __attribute__((aligned(64)));
        static float s[3];
        static int32_t wsum[3];
        for (int r = 0; r < 3 && mode == 0; r++) {
            const __m512 w0 = _mm512_mul_ps(_mm512_loadu_ps(p + r * ldS), d0);
            const __m512 w1 = _mm512_mul_ps(_mm512_loadu_ps(p + r * ldS + 16), d1);
            const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(w0), _mm512_abs_ps(w1)));
            const float inv = mx > 0.0f ? 32767.0f / mx : 0.0f;
            s[r] = mx * (1.0f / 32767.0f);
            const __m512 iv = _mm512_set1_ps(inv);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(w0, iv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(w1, iv));
            wsum[r] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            _mm256_store_si256((__m256i *)wq[r], _mm512_cvtepi32_epi16(q0));
            _mm256_store_si256((__m256i *)(wq[r] + 8), _mm512_cvtepi32_epi16(q1));
        }
        __m512i acc[3][2];
        for (int r = 0; r < 3; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        for (int i = 0; i < NK / 2; i++) {
            const uint8_t *k0 = vb + (long)(2 * i) * ldv + 2;
            __m256i x2 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)k0));
            x2 = _mm256_inserti128_si256(x2, _mm_loadu_si128((const __m128i *)(k0 + ldv)), 1);
            const __m512i x = _mm512_maskz_permutexvar_epi8(0x5555555555555555ULL, idx, _mm512_castsi256_si512(x2));
            const __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_srli_epi16(x, 4);
            for (int r = 0; r < 3; r++) {
                const __m512i wb = _mm512_set1_epi32(wq[r][i]);
                acc[r][0] = _mm512_dpwssd_epi32(acc[r][0], lo, wb);
                acc[r][1] = _mm512_dpwssd_epi32(acc[r][1], hi, wb);
            }
        }
        for (int r = 0; r < 3; r++) {
            const __m512 a = _mm512_set1_ps(alpha[r]), sv = _mm512_set1_ps(s[r]);
            const __m512i c8 = _mm512_set1_epi32(8 * wsum[r]);
            for (int h = 0; h < 2; h++) {
                float *op = o + r * 64 + 32 * b + 16 * h;
                _mm512_storeu_ps(op, _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][h], c8)),
                                                     _mm512_mul_ps(_mm512_loadu_ps(op), a)));
            }
        }
    }
}

int main(void) {
    uint8_t *v = aligned_alloc(64, 64 * LDV + 64);
    srand(1);
    pv_fill_q4_0_rows(v, 64, LDV, 6, 1);
    float p[3 * NK], alpha[3] = {0.5f, 1, 1}, o1[192], o2[192];
    for (int i = 0; i < 192; i++) o1[i] = o2[i] = (rand() % 100) / 100.f;
    for (int i = 0; i < 3 * NK; i++) p[i] = (rand() % 1000) / 1000.f;
    p[0] = 1.0f; for (int i = 1; i < NK; i++) p[i] = 0.001f * (rand() % 50);  /* row 0: a sink */
    attn_rows_pv_all(3, ATTN_KV_Q4_0, o1, 64, p, NK, v, LDV, 0, NK, alpha, NULL);
    pv_i16(o2, p, NK, v, LDV, alpha, 0);
    for (int r = 0; r < 3; r++)
        printf("row %d: relative RMS difference %.2e\n", r, pv_rel_rms(o1 + r * 64, o2 + r * 64, 64));
    for (int i = 0; i < 192; i++) o1[i] = o2[i] = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t[3];
        for (int m = 0; m < 3; m++)
            PV_TICKS_PER_KEY(t[m], 200000, NK, p, v, m ? o2 : o1,
                             if (!m) attn_rows_pv_all(3, ATTN_KV_Q4_0, oo, 64, pp, NK, vv, LDV, 0, NK, alpha, NULL);
                             else pv_i16(oo, pp, NK, vv, LDV, alpha, m - 1));
        printf("ticks a key: f32 %.2f | int16 %.2f, dots only %.2f\n", t[0], t[1], t[2]);
    }
    return 0;
}
