"""The attention kernels of builds other than this machine's: simd_attention.h compiled with
AVX2 only (no AVX-512) and as plain C, each checked against a NumPy attention over the same
(dequantized) K/V, for decode rows items and prefill tile items of every cache type.

A machine with AVX-512 builds neither path into llmcore's extensions, so without this test the
AVX2 kernels (what Zen 2/3 and many Intel machines run) would go untested there."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from c_harness import build_c_harness

# One sequence of N_CTX cached keys in blocks of BS, H heads over KVH kv heads of D values.
# argv: kv type (0 f32, 1 f16, 2 q8_0, 3 q4_0, 4 q4_0 with K in 16-key tiles), item kind (0 tile: the last NT tokens
# attend causally; 1 rows: one decode token at the end), softcap. Prints q, the K/V values the
# pool holds (dequantized), then the outputs.
HARNESS = r"""
#include "simd_attention.h"
#include <stdio.h>
#include <stdlib.h>
enum { D = 64, DV = 64, H = 6, KVH = 2, BS = 32, N_CTX = 100, NT = 16 };
static uint32_t rs = 2463534242u;
static float rnd(void) { rs ^= rs << 13; rs ^= rs >> 17; rs ^= rs << 5; return (float)((rs >> 8) / 16777216.0) * 2.0f - 1.0f; }
static int row_bytes(int t, int n) { return t == 0 ? 4 * n : t == 1 ? 2 * n : t == 2 ? n / 32 * 34 : n / 32 * 18; }
static void store_row(int t, const float *x, uint8_t *dst, int n) {
    if (t == 0) memcpy(dst, x, 4 * (size_t)n);
    else if (t == 1) simd_f32_to_f16_row(x, (uint16_t *)dst, n);
    else if (t == 2) kv_quantize_q8_0(x, dst, n);
    else kv_quantize_q4_0(x, dst, n);
}
int main(int argc, char **argv) {
    const int kv_arg = atoi(argv[1]), kind = atoi(argv[2]);
    const int kv = kv_arg == 4 ? 3 : kv_arg, tiled = kv_arg == 4;
    const float softcap = (float)atof(argv[3]);
    const int nb = (N_CTX + BS - 1) / BS, kr = row_bytes(kv, D), vr = row_bytes(kv, DV);
    uint8_t *K = calloc((size_t)nb * BS * KVH, kr), *V = calloc((size_t)nb * BS * KVH, vr);
    float x[D > DV ? D : DV], y[D > DV ? D : DV];
    for (int t = 0; t < N_CTX; t++)
        for (int h = 0; h < KVH; h++) {
            uint8_t *kd = K + ((long)t * KVH + h) * kr, *vd = V + ((long)t * KVH + h) * vr;
            for (int i = 0; i < D; i++) x[i] = 2.0f * rnd();
            if (tiled) {
                uint8_t *kblk = K + (long)(t / BS) * BS * KVH * kr;
                kv_tile_store_q4_0(x, kblk, t % BS, h, KVH, D / 32);
                kv_tile_load_q4_0(kblk, t % BS, h, KVH, D / 32, y);
            } else {
                store_row(kv, x, kd, D);
                attn_load_row(kd, kv, y, D);
            }
            printf("k");
            for (int i = 0; i < D; i++) printf(" %.9g", y[i]);
            printf("\n");
            for (int i = 0; i < DV; i++) x[i] = rnd();
            store_row(kv, x, vd, DV);
            attn_load_row(vd, kv, y, DV);
            printf("v");
            for (int i = 0; i < DV; i++) printf(" %.9g", y[i]);
            printf("\n");
        }
    const int N = kind == 0 ? NT : 1;
    float *q = malloc(sizeof(float) * N * H * D), *out = calloc((size_t)N * H * DV, sizeof(float));
    int32_t table[8], qpos[NT], toks[NT], zero[NT], one[NT];
    for (int b = 0; b < nb; b++) table[b] = b;
    for (int i = 0; i < N * H * D; i++) q[i] = rnd();
    for (int i = 0; i < N; i++) { qpos[i] = N_CTX - N + i; toks[i] = i; zero[i] = 0; one[i] = 1; }
    attn_ctx c = {0};
    c.q = q; c.out = out; c.k = K; c.v = V;
    c.k_bstride = (long)BS * KVH * kr; c.v_bstride = (long)BS * KVH * vr; c.k_row = kr; c.v_row = vr;
    c.kv_type = kv; c.bs = BS; c.KVH = KVH; c.H = H; c.G = H / KVH; c.D = D; c.Dv = DV;
    c.tables = table; c.max_blocks = nb; c.q_pos = qpos; c.scale = 0.125f; c.softcap = softcap;
    c.window = 0; c.sinks = NULL; c.toks = toks; c.slot_base = zero; c.chunk0 = zero; c.nparts = one;
    c.k_tiled = tiled;
    float *buf = malloc(sizeof(float) * (attn_scratch_floats(D, DV, BS) + 64));
    if (kind == 0) {
        for (int g = 0; g < KVH; g++) {
            attn_item it = {0, 0, g * (H / KVH), (g + 1) * (H / KVH), 0, N, 0, nb, 0};
            attn_run_item(&c, &it, buf);
        }
    } else {
        attn_item it = {1, 0, 0, H, 0, 1, 0, nb, 0};
        attn_run_item(&c, &it, buf);
    }
    printf("q");
    for (int i = 0; i < N * H * D; i++) printf(" %.9g", q[i]);
    printf("\no");
    for (int i = 0; i < N * H * DV; i++) printf(" %.9g", out[i]);
    printf("\n");
    return 0;
}
"""

BUILDS = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "portable": []}


def _build(tmp_path, name):
    return build_c_harness(tmp_path, HARNESS, BUILDS[name], f"h_{name}")


def _run(exe, kv, kind, softcap):
    out = subprocess.run([str(exe), str(kv), str(kind), str(softcap)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[:2000]
    rows = {"k": [], "v": [], "q": [], "o": []}
    for line in out.stdout.splitlines():
        tag, *vals = line.split()
        rows[tag].append(np.array(vals, dtype=np.float64))
    return rows


def _reference(rows, kind, softcap, kv):
    D, DV, H, KVH, N_CTX = 64, 64, 6, 2, 100
    k = np.stack(rows["k"]).reshape(N_CTX, KVH, D)
    v = np.stack(rows["v"]).reshape(N_CTX, KVH, DV)
    n = 16 if kind == 0 else 1
    q = rows["q"][0].reshape(n, H, D)
    if kv in (2, 3, 4):  # a quantized K: q rounded to 8 bits a 32-value block, as the kernels take it
        b = q.reshape(n, H, D // 32, 32)
        d = np.abs(b).max(-1, keepdims=True) / 127
        q = (np.rint(b / np.where(d > 0, d, 1)) * d).reshape(n, H, D) / 0.125
        q = q * 0.125  # (scale folded before rounding in the kernel: same rounding up to scale)
    out = np.zeros((n, H, DV))
    for t in range(n):
        pos = N_CTX - n + t
        for h in range(H):
            s = (k[: pos + 1, h // (H // KVH)] @ q[t, h]) * 0.125
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[: pos + 1, h // (H // KVH)]
    return out.reshape(-1)


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("kv", [0, 1, 2, 3, 4], ids=["f32", "f16", "q8_0", "q4_0", "q4_0-k-tiles"])
@pytest.mark.parametrize("kind", [0, 1], ids=["tile", "rows"])
def test_attention_build_paths_match_reference(tmp_path, build, kv, kind):
    exe = _build(tmp_path, build)
    for softcap in (0.0, 5.0):
        rows = _run(exe, kv, kind, softcap)
        got, ref = rows["o"][0], _reference(rows, kind, softcap, kv)
        # f16 K: q rounded to f16; q8_0 / q4_0 K: q rounded to 8 bits (the reference does too)
        tol = 2e-5 if kv == 0 else 2e-3
        np.testing.assert_allclose(got, ref, rtol=0, atol=tol, err_msg=f"{build} kv {kv} kind {kind} cap {softcap}")
