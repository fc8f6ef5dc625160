/* A bf16 P.V against the decode rows kernel's f32 P.V, in L1 (an exploration, not the
 * engine's code): 3 query rows (SmolLM2's GQA group) x 32 keys (a KV block) x 64 values of a
 * Q4_0 V read in place from its rows (3 kv heads a key).
 *
 *     gcc -O3 -march=native -Ipyx -Ibench/harness bench/harness/pv_bf16.c -o /tmp/pv_bf16 -lm && /tmp/pv_bf16
 *
 * Needs AVX-512 VBMI and BF16. The bf16 form: each key's V scale folded into the
 * probabilities, w = bf16(p x d) (32 keys a row and block at once, two vectors and one
 * vcvtne2ps2bf16); a key pair's nibble bytes of both blocks put side by side by one vpermt2b
 * so that unpacking them to words gives a dword (key j, key j + 1) a value; the words are
 * bf16(n - 8) by a vpermw from a 16-entry table (EXACT) or bf16(128 + n) by unpacking against
 * 0x43 bytes with one -136 sum(w) correction a row and block (OFFSET); 3 rows x 4 vectors of
 * vdpbf16ps a key pair. TSC ticks a key: the f32 P.V (attn_rows_pv_all), then each form with
 * the 32 keys' scales read from their rows and with the scales already apart (as a V tile
 * layout would store them). It prints each form's relative RMS difference from the f32 P.V.
 *
 * In the engine (session 30: this form in every Q4_0 P.V path, the scales by vpgatherdd) a
 * 32-sequence step's attention at one thread was no shorter than with the f32 P.V, and not
 * with the V rows read from a static buffer either: bench/RESULTS.md has the figures. */
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

static uint16_t d_apart[2][32] __attribute__((aligned(64)));

/* vpermt2b index: source byte t of key j's row (from its first nibble byte: block 0's 16,
 * block 1's scale, block 1's 16) or (+64) of key j + 1's. Lane k of the output: bytes
 * 2m / 2m + 1 = block 0's byte 4k + m of keys j / j + 1, bytes 8 + 2m / 9 + 2m = block 1's */
static uint8_t pair_idx[64] __attribute__((aligned(64)));

static inline __attribute__((always_inline)) void pv_bf16(float *o, const float *p, const uint8_t *v,
                                                           const float *alpha, const int exact, const int apart) {
    uint16_t dh[2][32] __attribute__((aligned(64)));
    const uint16_t(*dsrc)[32] = d_apart;
    if (!apart) {
        pv_scales_of_rows(v, LDV, dh);
        dsrc = (const uint16_t(*)[32])dh;
    }
    /* w[r][b]: 32 bf16 words in key order (dword i: keys 2i, 2i + 1) */
    __m512i w[3][2];
    __m512 wsum[3][2];
    for (int b = 0; b < 2; b++) {
        const __m512 d0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dsrc[b]));
        const __m512 d1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(dsrc[b] + 16)));
        for (int r = 0; r < 3; r++) {
            const __m512 w0 = _mm512_mul_ps(_mm512_loadu_ps(p + r * NK), d0);
            const __m512 w1 = _mm512_mul_ps(_mm512_loadu_ps(p + r * NK + 16), d1);
            w[r][b] = (__m512i)_mm512_cvtne2ps_pbh(w1, w0);
            if (!exact) {
                /* the bf16 values back in f32 (exact), summed */
                const __m512i lo = _mm512_slli_epi32(w[r][b], 16), hi = _mm512_and_si512(w[r][b], _mm512_set1_epi32((int)0xFFFF0000));
                wsum[r][b] = _mm512_add_ps(_mm512_castsi512_ps(lo), _mm512_castsi512_ps(hi));
            }
        }
    }
    const __m512i idx = _mm512_load_si512(pair_idx), m4 = _mm512_set1_epi8(0x0F);
    const __m512i fill = exact ? _mm512_setzero_si512() : _mm512_set1_epi8(0x43);
    /* bf16(n - 8), n = 0..15 (twice: vpermw reads 5 index bits) */
    static const uint16_t tab16[32] __attribute__((aligned(64))) = {
        0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
        0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
        0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
        0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};
    const __m512i tab = _mm512_load_si512(tab16);
    __m512 acc[3][4];
    for (int r = 0; r < 3; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int i = 0; i < 4; i++) acc[r][i] = _mm512_mul_ps(_mm512_loadu_ps(o + r * 64 + 16 * i), a);
    }
    const __mmask64 m34 = (1ULL << 34) - 1;
    for (int j = 0; j < NK; j += 2) {
        const uint8_t *k0 = v + (long)j * LDV + 2;
        const __m512i x0 = _mm512_maskz_loadu_epi8(m34, k0), x1 = _mm512_maskz_loadu_epi8(m34, k0 + LDV);
        const __m512i x = _mm512_permutex2var_epi8(x0, idx, x1);
        const __m512i L = _mm512_and_si512(x, m4), H = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        __m512i vv[4];  /* values 0-15 of block 0, 16-31 of block 0, 0-15 of block 1, 16-31 of block 1 */
        vv[0] = _mm512_unpacklo_epi8(L, fill);
        vv[1] = _mm512_unpacklo_epi8(H, fill);
        vv[2] = _mm512_unpackhi_epi8(L, fill);
        vv[3] = _mm512_unpackhi_epi8(H, fill);
        if (exact)
            for (int i = 0; i < 4; i++) vv[i] = _mm512_permutexvar_epi16(vv[i], tab);
        for (int r = 0; r < 3; r++) {
            const __m512i wb0 = _mm512_permutexvar_epi32(_mm512_set1_epi32(j / 2), w[r][0]);
            const __m512i wb1 = _mm512_permutexvar_epi32(_mm512_set1_epi32(j / 2), w[r][1]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)wb0, (__m512bh)vv[0]);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)wb0, (__m512bh)vv[1]);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], (__m512bh)wb1, (__m512bh)vv[2]);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], (__m512bh)wb1, (__m512bh)vv[3]);
        }
    }
    for (int r = 0; r < 3; r++) {
        if (!exact) {
            const __m512 c0 = _mm512_set1_ps(136.0f * _mm512_reduce_add_ps(wsum[r][0]));
            const __m512 c1 = _mm512_set1_ps(136.0f * _mm512_reduce_add_ps(wsum[r][1]));
            acc[r][0] = _mm512_sub_ps(acc[r][0], c0);
            acc[r][1] = _mm512_sub_ps(acc[r][1], c0);
            acc[r][2] = _mm512_sub_ps(acc[r][2], c1);
            acc[r][3] = _mm512_sub_ps(acc[r][3], c1);
        }
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(o + r * 64 + 16 * i, acc[r][i]);
    }
}

int main(void) {
    for (int k = 0; k < 4; k++)
        for (int m = 0; m < 4; m++) {
            pair_idx[16 * k + 2 * m] = 4 * k + m;
            pair_idx[16 * k + 2 * m + 1] = 64 + 4 * k + m;
            pair_idx[16 * k + 8 + 2 * m] = 18 + 4 * k + m;
            pair_idx[16 * k + 8 + 2 * m + 1] = 64 + 18 + 4 * k + m;
        }
    uint8_t *v = aligned_alloc(64, 64 * LDV + 64);
    float p[3 * NK], alpha[3] = {1, 1, 1}, o1[3 * 64], o2[3 * 64] = {0}, o3[3 * 64] = {0};
    pv_problem(v, LDV, 1, d_apart, p, NK, o1);
    pv_bf16(o2, p, v, alpha, 1, 0);
    pv_bf16(o3, p, v, alpha, 0, 0);
    printf("bf16 P.V: relative RMS difference from the f32 P.V: exact %.2e, offset %.2e\n", pv_rel_rms(o1, o2, 192),
           pv_rel_rms(o1, o3, 192));
    for (int rep = 0; rep < 3; rep++) {
        double t[5];
        for (int m = -1; m < 4; m++)  /* m: (exact, apart) = (1, 0), (1, 1), (0, 0), (0, 1) */
            PV_TICKS_PER_KEY(t[m + 1], 200000, NK, p, v, m < 0 ? o1 : o2,
                             if (m < 0) attn_rows_pv_all(3, ATTN_KV_Q4_0, oo, 64, pp, NK, vv, LDV, 0, NK, alpha, NULL);
                             else pv_bf16(oo, pp, vv, alpha, m < 2, m & 1));
        printf("ticks a key: f32 %.2f | bf16 exact: scales from the rows %.2f, apart %.2f | offset: rows %.2f, apart %.2f\n",
               t[0], t[1], t[2], t[3], t[4]);
    }
    printf("(check %g %g)\n", o1[5], o2[5]);
    return 0;
}
