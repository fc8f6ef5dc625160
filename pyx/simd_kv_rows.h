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
static void kv_quantize_q8_0(const float *x, uint8_t *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 32, y += 34) {
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

static inline void kv_dequant_q8_0(const uint8_t *x, float *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 34, y += 32) {
        const float d = simd_load_f16(x);
        const int8_t *q = (const int8_t *)(x + 2);
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
    }
}

static inline void kv_dequant_q4_0(const uint8_t *x, float *y, int n) {
    for (int b = 0; b < n / 32; b++, x += 18, y += 32) {
        const float d = simd_load_f16(x);
        const uint8_t *q = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)(q[j] & 0x0f) - 8);
            y[j + 16] = d * (float)((int)(q[j] >> 4) - 8);
        }
    }
}

#endif /* LLMCORE_SIMD_KV_ROWS_H */
