"""The AVX2 and plain-C K-quant kernels (not the ones built here on an AVX-512 machine) agree
with a double-precision reference of the integer kernel, and a token's result does not depend
on how many tokens its call had (the AVX2 path reads Q4_K / Q6_K straight from the GGUF bytes
at few tokens and unpacks super-blocks first at many)."""
from __future__ import annotations

import subprocess

import pytest

from c_harness import build_c_harness

HARNESS = r"""
#include "simd_kquants.h"
#include <stdio.h>
#include <stdlib.h>
static uint32_t rs = 2463534242u;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 17; rs ^= rs << 5; return rs; }
static float frnd(void) { return (float)((rnd() >> 8) / 16777216.0) * 2.0f - 1.0f; }
static void put_f16(uint8_t *p, float x) { _Float16 h = (_Float16)x; memcpy(p, &h, 2); }
int main(void) {
    const int types[3] = {KQ_Q4_K, KQ_Q5_K, KQ_Q6_K};
    enum { R = 13, K = 768, N = 70 };
    const int64_t nb = K / KQ_QK;
    int bad = 0;
    printf("kernels %s\n", kq_simd_name());
    for (int ti = 0; ti < 3; ti++) {
        const int t = types[ti], ts = kq_type_size(t);
        uint8_t *W = malloc((size_t)R * nb * ts);
        for (int64_t i = 0; i < (int64_t)R * nb * ts; i++) W[i] = (uint8_t)rnd();
        for (int64_t b = 0; b < (int64_t)R * nb; b++) {  /* finite scales */
            uint8_t *blk = W + b * ts;
            if (t == KQ_Q6_K) put_f16(blk + 208, 0.01f * frnd());
            else { put_f16(blk, 0.01f * frnd()); put_f16(blk + 2, 0.01f * frnd()); }
        }
        float *x = malloc(sizeof(float) * N * K), *wf = malloc(sizeof(float) * R * K);
        for (int64_t i = 0; i < (int64_t)N * K; i++) x[i] = frnd();
        kq_q8k *A = malloc(sizeof(kq_q8k) * N * nb);
        for (int j = 0; j < N; j++) kq_quantize_q8k(x + (int64_t)j * K, K, A + (int64_t)j * nb);
        for (int r = 0; r < R; r++) kq_dequant_blocks(t, W + (int64_t)r * nb * ts, nb, wf + (int64_t)r * K);
        float *Y = malloc(sizeof(float) * N * R), *Y1 = malloc(sizeof(float) * N * R), *Y3 = malloc(sizeof(float) * N * R);
        kq_matmul_rows(t, W, nb * ts, 0, R, nb, A, N, Y, R);          /* tiles of 64 and 6 tokens */
        for (int j = 0; j < N; j++)                                       /* one token a call */
            kq_matmul_rows(t, W, nb * ts, 0, R, nb, A + (int64_t)j * nb, 1, Y1 + (int64_t)j * R, R);
        for (int j = 0; j + 3 <= N; j += 3)                               /* three */
            kq_matmul_rows(t, W, nb * ts, 0, R, nb, A + (int64_t)j * nb, 3, Y3 + (int64_t)j * R, R);
        double num = 0, den = 0;
        int differ = 0;
        for (int j = 0; j < N; j++)
            for (int r = 0; r < R; r++) {
                double ref = 0;  /* the dequantized weights against the quantized activations */
                for (int64_t b = 0; b < nb; b++)
                    for (int e = 0; e < KQ_QK; e++)
                        ref += (double)wf[(int64_t)r * K + b * KQ_QK + e] * A[(int64_t)j * nb + b].d * A[(int64_t)j * nb + b].qs[e];
                const double y = Y[(int64_t)j * R + r];
                num += (y - ref) * (y - ref);
                den += ref * ref;
                differ += Y1[(int64_t)j * R + r] != Y[(int64_t)j * R + r];
                if (j + 3 <= N - N % 3) differ += Y3[(int64_t)j * R + r] != Y[(int64_t)j * R + r];
            }
        printf("type %d nmse %.3g differ %d\n", t, num / den, differ);
        if (!(num / den < 1e-10) || differ) bad++;
        free(W); free(x); free(wf); free(A); free(Y); free(Y1); free(Y3);
    }
    return bad;
}
"""


@pytest.mark.parametrize("flags", [["-mavx2", "-mfma", "-mf16c"], []], ids=["avx2", "portable"])
def test_kquant_build_paths_match_reference(tmp_path, flags):
    exe = build_c_harness(tmp_path, HARNESS, flags, opt="-O2")
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"kernels {'avx2' if flags else 'c'}" in out.stdout, out.stdout
