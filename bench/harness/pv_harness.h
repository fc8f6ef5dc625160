/* What the P.V harnesses (pv_int8.c, pv_i16.c) share: a Q4_0 V read in place and the
 * difference of two outputs. Included after simd_attention.h (-Ipyx). */
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

/* |a - b| / |a| over n values (root mean squares) */
static double pv_rel_rms(const float *a, const float *b, int n) {
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return sqrt(e / s);
}

#endif
