/* What the P.V harnesses (pv_int8.c, pv_i16.c, pv_bf16.c, pv_f32w.c) share: a Q4_0 V read
 * in place, the problem three of them time and the difference of two outputs. Included
 * after simd_attention.h (-Ipyx). */
#ifndef PV_HARNESS_H
#define PV_HARNESS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* n_keys rows ldv bytes apart of random nibbles, each row's first n_blocks Q4_0 blocks given
 * an f16 scale in [0.01, 0.02) (negative half the time when signed_scales) */
static void pv_fill_q4_0_rows(uint8_t *v, int n_keys, long ldv, int n_blocks, int signed_scales) {
    for (long i = 0; i < n_keys * ldv; i++) v[i] = rand() & 255;
    for (int j = 0; j < n_keys; j++)
        for (int b = 0; b < n_blocks; b++) {
            const float d = signed_scales ? (rand() & 1 ? -1 : 1) * (0.01f + 0.01f * (rand() % 100) / 100.f)
                                          : 0.01f + 0.01f * (rand() % 100) / 100.f;
            const uint16_t h = _cvtss_sh(d, 0);
            memcpy(v + j * ldv + 18 * b, &h, 2);
        }
}

/* the f16 scales of 32 keys' first two Q4_0 blocks (rows ldv bytes apart) as d[block][key]:
 * the "scales from the rows" forms read them so, the "scales apart" ones find them so */
static inline __attribute__((always_inline)) void pv_scales_of_rows(const uint8_t *v, long ldv, uint16_t d[2][32]) {
    for (int j = 0; j < 32; j++) {
        memcpy(&d[0][j], v + j * ldv, 2);
        memcpy(&d[1][j], v + j * ldv + 18, 2);
    }
}

/* The problem the scale-folding harnesses (pv_int8.c, pv_bf16.c, pv_f32w.c) time: 64 keys of a
 * Q4_0 V (rows ldv bytes apart, two blocks a key), the first 32 keys' scales apart in d,
 * 3 rows x nk probabilities p in [0, 1), and into ref (3 x 64) the engine's f32 P.V of them
 * from zero outputs, the harness's reference */
static void pv_problem(uint8_t *v, long ldv, int signed_scales, uint16_t d[2][32], float *p, int nk, float *ref) {
    const float alpha[3] = {1, 1, 1};
    srand(1);
    pv_fill_q4_0_rows(v, 64, ldv, 2, signed_scales);
    pv_scales_of_rows(v, ldv, d);
    for (int i = 0; i < 3 * nk; i++) p[i] = (rand() % 1000) / 1000.f;
    memset(ref, 0, 3 * 64 * sizeof(float));
    attn_rows_pv_all(3, ATTN_KV_Q4_0, ref, 64, p, nk, v, ldv, 0, nk, alpha, NULL);
}

/* |a - b| / |a| over n values (root mean squares) */
static double pv_rel_rms(const float *a, const float *b, int n) {
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return sqrt(e / s);
}

/* (ticks) = TSC ticks a key of the statement after n_keys, run iters times: p, v, o pinned in
 * registers as pp, vv, oo each time (the statement uses those) so that gcc neither hoists
 * the work out of the loop nor drops it */
#define PV_TICKS_PER_KEY(ticks, iters, n_keys, p, v, o, ...)                   \
    do {                                                                       \
        const unsigned long long t0_ = __rdtsc();                              \
        for (int it_ = 0; it_ < (iters); it_++) {                              \
            float *pp = (p), *oo = (o);                                        \
            uint8_t *vv = (v);                                                 \
            __asm__ volatile("" : "+r"(pp), "+r"(vv), "+r"(oo)::"memory");     \
            __VA_ARGS__;                                                       \
            __asm__ volatile("" ::: "memory");                                 \
        }                                                                      \
        (ticks) = (__rdtsc() - t0_) / (double)(iters) / (n_keys);              \
    } while (0)

#endif
