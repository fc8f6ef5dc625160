/* Prefill matmuls on AMX-BF16 tiles: float sums over the whole row, no per-block epilogue.
 *
 * The int8 kernels (VNNI, and AMX-INT8 in simd_quants.h / simd_kquants.h) turn every 32-value
 * block's integer dot into float (a convert, a multiply by the two scales, an fma or two a
 * token and block): on a Xeon that epilogue bounds them at ~0.4 of the int8 peak, and AMX-INT8
 * only moves the dot to the tile unit. Here a row group's weights are dequantized once per
 * call into bf16 (value d * q + m, or d * sc * q - dmin * mn for the K-quants, computed in
 * f32 and rounded to nearest-even), the activations are rounded to bf16 once, and TDPBF16PS
 * accumulates each 16 tokens x 16 rows output tile in f32 over every block of the row: the
 * tile unit does the whole product, the vector units only the conversions.
 *
 * bf16 keeps 8 bits of a value (relative error <= 2^-9), which is finer than the Q8 blocks the
 * int8 kernels round activations to (1/254 of a block's largest value), but it is a different
 * rounding: results agree with the int8 kernels and llama.cpp within the conformance
 * tolerances, not bit for bit, so a prompt's logits depend on whether its tokens were a large
 * prefill chunk (this path, from ab_min_tokens tokens) or a decode step. LLMCORE_NO_AMX_BF16=1
 * (or LLMCORE_NO_AMX=1) keeps every matmul on the int8 kernels.
 *
 * Layouts (uint16 bf16 elements; a "step" is 32 values of the row, one tile product):
 *   activations: token tile tt (16 tokens), step s: 16 rows x 32 values, 1 KB at
 *                xb + (tt * nsteps + s) * 512 (tile loads of contiguous lines, not rows of the
 *                row length apart, which all fall in one L1 set for a 2048-value row);
 *   weights:     a 16-row group's step s: the B tile, 16 pair rows x (16 rows x 2 values):
 *                element [p][2 r + e] = W[r][32 s + 2 p + e], 1 KB at wb + s * 512.
 * The int8 unpacked chunks both quant headers already make (chunk J: values 4J..4J+3 of each
 * of 16 rows, one dword a row) give two pair rows each: their low and high words. */
#ifndef LLMCORE_SIMD_AMX_BF16_H
#define LLMCORE_SIMD_AMX_BF16_H

#include "simd.h"

/* ---- activations ------------------------------------------------------------------------ */
static inline int64_t ab_steps(int64_t K) { return K / 32; }
/* bytes of the activation tiles of n tokens (whole 16-token tiles, an even count of them) */
static inline size_t ab_act_bytes(int64_t n, int64_t K) {
    const int64_t ntt = ((n + 15) / 16 + 1) & ~(int64_t)1;
    return (size_t)ntt * (size_t)ab_steps(K) * 1024;
}

/* a thread's grow-only buffer (64-byte aligned): *buf holding *cap bytes, grown to bytes */
static inline uint16_t *ab_grow(uint8_t **buf, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        free(*buf);
        *buf = (uint8_t *)simd_alloc(bytes);
        *cap = *buf ? bytes : 0;
    }
    return (uint16_t *)*buf;
}
/* a work item's dequantized weights */
static __thread uint8_t *ab_wbuf = NULL;
static __thread size_t ab_wcap = 0;
static inline uint16_t *ab_weight_buffer(size_t bytes) { return ab_grow(&ab_wbuf, &ab_wcap, bytes); }
/* the calling thread's activation tiles (one per call, shared by the call's threads) */
static __thread uint8_t *ab_abuf = NULL;
static __thread size_t ab_acap = 0;
static inline uint16_t *ab_act_buffer(size_t bytes) { return ab_grow(&ab_abuf, &ab_acap, bytes); }

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__linux__)
#define AB_BUILT 1
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

static int ab_on = 0;
/* fewest tokens a matmul takes this path from: a group's weights are dequantized once per
 * call, which pays over many token tiles (below it the int8 kernels keep a decode step's bits) */
#define AB_MIN_TOKENS_DEFAULT 128
static int ab_min_tokens = AB_MIN_TOKENS_DEFAULT;

/* enable: 0 leaves the path off. Returns whether it is in use (the CPU has AMX-TILE and
 * AMX-BF16 and Linux grants the tile state). */
static int ab_init(int enable) {
    ab_on = enable && simd_amx_grant(22); /* AMX-BF16 */
    return ab_on;
}

static inline int ab_use(int64_t n) { return ab_on && n >= ab_min_tokens; }

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ab_tilecfg;

/* tiles 0-3: C (16 tokens x 16 f32), 4/5: A (16 tokens x 32 bf16), 6/7: B (16 pairs x 16 rows x 2) */
static inline void ab_config(void) {
    ab_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 8; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
}

/* token tile tt of x (nt valid tokens, the rest zeros) into its tiles at dst */
static inline void ab_pack_act_tile(const float *x, int64_t K, int nt, uint16_t *dst) {
    const int64_t ns = ab_steps(K);
    for (int r = 0; r < 16; r++) {
        if (r < nt) {
            const float *xr = x + r * K;
            for (int64_t s = 0; s < ns; s++) {
                const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + 32 * s + 16), _mm512_loadu_ps(xr + 32 * s));
                _mm512_store_si512((void *)(dst + s * 512 + r * 32), (__m512i)v);
            }
        } else {
            for (int64_t s = 0; s < ns; s++) _mm512_store_si512((void *)(dst + s * 512 + r * 32), _mm512_setzero_si512());
        }
    }
}

/* ---- weights ------------------------------------------------------------------------------ */
/* row scales (or offsets) of 16 rows, each twice: lanes 2r, 2r+1 = v[r] (lo: rows 0-7, hi: 8-15) */
static inline __m512 ab_pairs_lo(__m512 v) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), v);
}
static inline __m512 ab_pairs_hi(__m512 v) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8), v);
}

/* one unpacked chunk v (16 rows x 4 unsigned bytes: values 4J..4J+3) -> its two pair rows
 * (values 4J, 4J+1 and 4J+2, 4J+3 of each row) as bf16 of u * scale + offset, lane-wise */
static inline __attribute__((always_inline)) void ab_chunk(const __m512i v, __m512 slo, __m512 shi, __m512 olo,
                                                           __m512 ohi, uint16_t *p0, uint16_t *p1) {
    const __m256i w0 = _mm512_cvtepi32_epi16(v), w1 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16));
    __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(w0)));
    __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(w0, 1)));
    _mm512_store_si512((void *)p0, (__m512i)_mm512_cvtne2ps_pbh(_mm512_fmadd_ps(b, shi, ohi), _mm512_fmadd_ps(a, slo, olo)));
    a = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(w1)));
    b = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(w1, 1)));
    _mm512_store_si512((void *)p1, (__m512i)_mm512_cvtne2ps_pbh(_mm512_fmadd_ps(b, shi, ohi), _mm512_fmadd_ps(a, slo, olo)));
}

/* chunk J of a step (J = 0..7) goes to pair rows 2J, 2J+1 of the step's B tile */
static inline __attribute__((always_inline)) void ab_chunk_to_step(const __m512i c, int J, __m512 s, __m512 o,
                                                                   uint16_t *step) {
    ab_chunk(c, ab_pairs_lo(s), ab_pairs_hi(s), ab_pairs_lo(o), ab_pairs_hi(o), step + (2 * J) * 32,
             step + (2 * J + 1) * 32);
}

/* ---- attention: pair rows ------------------------------------------------------- */
/* 16 dwords, lane i = bf16(lo[i]) | bf16(hi[i]) << 16: a B tile's pair row from two rows of
 * 16 values (two keys' values of 16 dims, or two dims of 16 query rows) */
static inline __m512i ab_pair16(__m512 lo, __m512 hi) {
    static const uint16_t idx[32] __attribute__((aligned(64))) = {
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_load_si512((const void *)idx), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* x rounded to bf16 (nearest even), as f32 */
static inline __m512 ab_bf16_round(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)), 16));
}

/* ---- the tile products --------------------------------------------------------------------- */
/* C tile -> nt tokens x nv rows of y (row stride ys floats) */
static inline void ab_store(const int C, float *y, int64_t ys, int nt, int nv) {
    if (nt == 16 && nv == 16) {
        switch (C) {
        case 0: _tile_stored(0, y, ys * 4); break;
        case 1: _tile_stored(1, y, ys * 4); break;
        case 2: _tile_stored(2, y, ys * 4); break;
        default: _tile_stored(3, y, ys * 4); break;
        }
        return;
    }
    __attribute__((aligned(64))) float buf[256];
    switch (C) {
    case 0: _tile_stored(0, buf, 64); break;
    case 1: _tile_stored(1, buf, 64); break;
    case 2: _tile_stored(2, buf, 64); break;
    default: _tile_stored(3, buf, 64); break;
    }
    const __mmask16 m = (__mmask16)((1u << nv) - 1u);
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + t * ys, m, _mm512_load_ps(buf + 16 * t));
}

/* Two token tiles (A at xa, xa2; xa2 unused when !TWO_T) x one or two row groups (B at wb0,
 * wb1; wb1 unused when !TWO_G) over ns steps: C0 = tile 0 x group 0, C1 = tile 0 x group 1,
 * C2 = tile 1 x group 0, C3 = tile 1 x group 1. Leaves the sums in the C tiles. */
static inline __attribute__((always_inline)) void ab_products(const uint16_t *xa, const uint16_t *xa2,
                                                              const uint16_t *wb0, const uint16_t *wb1, int64_t ns,
                                                              const int TWO_T, const int TWO_G) {
    _tile_zero(0);
    if (TWO_G) _tile_zero(1);
    if (TWO_T) _tile_zero(2);
    if (TWO_T && TWO_G) _tile_zero(3);
    for (int64_t s = 0; s < ns; s++) {
        _tile_loadd(4, xa + s * 512, 64);
        _tile_loadd(6, wb0 + s * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (TWO_G) {
            _tile_loadd(7, wb1 + s * 512, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (TWO_T) {
            _tile_loadd(5, xa2 + s * 512, 64);
            _tile_dpbf16ps(2, 5, 6);
            if (TWO_G) _tile_dpbf16ps(3, 5, 7);
        }
    }
}

/* y[t][16 g_j + r] for every token of n (activation tiles xb, ns steps) and the row groups
 * whose B tiles are at wb0 (nv0 valid rows, outputs y0) and wb1 (NULL: none; nv1, y1); y row
 * stride ys. The caller has loaded the tile config. */
static void ab_gemm(const uint16_t *xb, int64_t n, int64_t ns, const uint16_t *wb0, int nv0, float *y0,
                    const uint16_t *wb1, int nv1, float *y1, int64_t ys) {
    const int64_t ntt = (n + 15) / 16, tsz = ns * 512;
    for (int64_t tt = 0; tt < ntt; tt += 2) {
        const int two_t = tt + 1 < ntt;
        const int nt0 = (int)(n - tt * 16 < 16 ? n - tt * 16 : 16);
        const int nt1 = two_t ? (int)(n - (tt + 1) * 16 < 16 ? n - (tt + 1) * 16 : 16) : 0;
        const uint16_t *xa = xb + tt * tsz, *xa2 = xa + tsz;
        if (wb1) {
            if (two_t) ab_products(xa, xa2, wb0, wb1, ns, 1, 1);
            else ab_products(xa, xa2, wb0, wb1, ns, 0, 1);
            ab_store(1, y1 + tt * 16 * ys, ys, nt0, nv1);
            if (two_t) ab_store(3, y1 + (tt + 1) * 16 * ys, ys, nt1, nv1);
        } else {
            if (two_t) ab_products(xa, xa2, wb0, wb0, ns, 1, 0);
            else ab_products(xa, xa2, wb0, wb0, ns, 0, 0);
        }
        ab_store(0, y0 + tt * 16 * ys, ys, nt0, nv0);
        if (two_t) ab_store(2, y0 + (tt + 1) * 16 * ys, ys, nt1, nv0);
    }
}

/* A gated FFN's group g: gate B tiles at wbg, up at wbu; out[t][16 g + r] = act(gate) * up for
 * every token (out row stride ldo); act is a row function act(g, u, y, n) of the activations
 * module (simd_activations.h). */
typedef void (*ab_act_fn)(const float *g, const float *u, float *y, int n);
static void ab_gemm_glu(const uint16_t *xb, int64_t n, int64_t ns, const uint16_t *wbg, const uint16_t *wbu,
                        float *out, int64_t ldo, ab_act_fn act) {
    const int64_t ntt = (n + 15) / 16, tsz = ns * 512;
    __attribute__((aligned(64))) float bg[2][256], bu[2][256];
    for (int64_t tt = 0; tt < ntt; tt += 2) {
        const int two_t = tt + 1 < ntt;
        const uint16_t *xa = xb + tt * tsz;
        if (two_t) ab_products(xa, xa + tsz, wbg, wbu, ns, 1, 1);
        else ab_products(xa, xa, wbg, wbu, ns, 0, 1);
        _tile_stored(0, bg[0], 64);
        _tile_stored(1, bu[0], 64);
        if (two_t) {
            _tile_stored(2, bg[1], 64);
            _tile_stored(3, bu[1], 64);
        }
        for (int h = 0; h < 1 + two_t; h++) {
            const int64_t t0 = (tt + h) * 16;
            const int nt = (int)(n - t0 < 16 ? n - t0 : 16);
            act(bg[h], bu[h], bg[h], nt * 16);
            for (int t = 0; t < nt; t++) _mm512_storeu_ps(out + (t0 + t) * ldo, _mm512_load_ps(bg[h] + 16 * t));
        }
    }
}

#else
#define AB_BUILT 0
static int ab_on = 0;
static int ab_min_tokens = 128;
static int ab_init(int enable) { (void)enable; return 0; }
static inline int ab_use(int64_t n) { (void)n; return 0; }
static inline void ab_pack_act_tile(const float *x, int64_t K, int nt, uint16_t *dst) {
    (void)x; (void)K; (void)nt; (void)dst;
}
#endif

static inline void ab_set_min_tokens(int n) { ab_min_tokens = n > 0 ? n : 128; }

#endif /* LLMCORE_SIMD_AMX_BF16_H */
