/* Inner loops of the SSM scans (pyx/ssm.pyx). `omp simd` lets the compiler vectorise the
 * dot-product reduction (fixed lane order: results do not depend on the thread count). */
#ifndef LLMCORE_SIMD_SSM_H
#define LLMCORE_SIMD_SSM_H
#include <math.h>

/* s = s * dA + b * xdt; return s . c   (Mamba-2: scalar decay per head) */
static inline float ssm2_row(float *restrict s, const float *restrict b, const float *restrict c,
                             float dA, float xdt, int n) {
    float acc = 0.0f;
#pragma omp simd reduction(+:acc)
    for (int i = 0; i < n; i++) {
        float v = s[i] * dA + b[i] * xdt;
        s[i] = v;
        acc += v * c[i];
    }
    return acc;
}

/* s = s * exp(d * a) + b * xdt; return s . c   (Mamba-1: decay per state entry) */
static inline float ssm1_row(float *restrict s, const float *restrict a, const float *restrict b,
                             const float *restrict c, float d, float xdt, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        float v = s[i] * expf(d * a[i]) + b[i] * xdt;
        s[i] = v;
        acc += v * c[i];
    }
    return acc;
}
#endif
