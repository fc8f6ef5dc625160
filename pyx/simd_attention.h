/* Attention work items for pyx/attention.pyx: blocked (flash-style) attention over the KV
 * block pool with an online softmax, single-threaded (the .pyx runs items in parallel).
 *
 * An item is a set of query rows that share one kv head (query tokens x the heads of its
 * GQA group, possibly of several sequences that share the blocks) and a range of KV blocks.
 * Each K/V block is read (and converted to f32) once per item, the rows' running max m,
 * sum l and output accumulator o are updated block by block:
 *
 *     m' = max(m, max_j s_j),  p_j = exp(s_j - m'),  l' = l * exp(m - m') + sum_j p_j,
 *     o' = o * exp(m - m') + sum_j p_j v_j
 *
 * and the item ends with o / l, or with (o, m, l) as a partial that attn_merge combines with
 * the item's other key ranges. Two kernels:
 *
 * - tile (prefill, many query rows): rows in vector lanes. Q^T (D x rows) is transposed once
 *   per item; S^T = K Q^T is an 8 keys x 48 rows register tile (two passes for 96 rows), the
 *   softmax statistics are per lane, P.V an (up to) 6 rows x 64 values register tile.
 * - rows (decode, few rows per sequence): keys in vector lanes. Each score is one fma chain
 *   over the head dim reduced by simd_hsum16x16, P.V accumulates rows x 64 values. Every
 *   row's arithmetic is independent of the other rows of the item and of the keys the item
 *   reads beyond the row's own range, so a sequence decoded in a batch (sharing blocks with
 *   a few others) gets the bits it gets alone; many decode rows sharing blocks take the
 *   tile kernel. A rows item with many rows of one kv head (a verify segment, a decode of a
 *   large GQA group) runs in the lanes form: rows in lanes like the tile kernel, but each
 *   score, statistic and output summed exactly as the rows kernel sums it (same bits).
 *
 * Scores are (q * scale) . k, q rounded to f16 first for an f16 cache (llama.cpp's K.Q takes
 * q as f16). Every function has a plain C fallback (LLMCORE_PORTABLE=1 builds it). */
#ifndef LLMCORE_SIMD_ATTENTION_H
#define LLMCORE_SIMD_ATTENTION_H

#include <limits.h>
#include "simd.h"
#include "simd_kv_rows.h"
#include "simd_amx_bf16.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ATTN_AVX512 1
#else
#define ATTN_AVX512 0
#endif
/* 256-bit kernels where AVX-512 is absent (F16C for f16 K/V, FMA for the sums) */
#if !ATTN_AVX512 && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ATTN_AVX2 1
#else
#define ATTN_AVX2 0
#endif

/* storage type codes: kv_rows.pxd's T_* (attention.pyx checks they agree) */
enum { ATTN_KV_F32 = 0, ATTN_KV_F16 = 1, ATTN_KV_Q8_0 = 2, ATTN_KV_Q4_0 = 3 };
/* (the kernels' own code for a Q4_0 K stored in 16-key tiles, simd_kv_rows.h: the pointer is
 * a block's first tile of the kv head, the stride the next 16-key group's) */
enum { ATTN_KV_Q4_0T = 4 };

#ifndef ATTN_PF_AHEAD
/* decode: blocks prefetched ahead of the one computed, row by row as the kernels reach each
 * key (1 measured best, for rows read in place and for blocks converted to f32 first) */
#define ATTN_PF_AHEAD 1
#endif

enum {
    ATTN_TILE_ROWS = 96,   /* rows of a tile item: 6 vectors of 16 lanes */
    ATTN_MAX_ROWS = 96,    /* rows of any item */
    ATTN_MAX_BS = 256,     /* largest block size the scratch layout takes */
};

/* Everything an item reads or writes, fixed for one attention call. */
typedef struct {
    const float *q;            /* (N, H, D) */
    float *out;                /* (N, H, Dv) */
    const uint8_t *k, *v;      /* pools, bytes: row (token t, kv head h) of block b at
                                  b * bstride + (t * KVH + h) * row */
    long k_bstride, v_bstride;
    int k_row, v_row;
    int kv_type, bs, KVH, H, G, D, Dv;
    const int32_t *tables;     /* (S, max_blocks), -1: freed */
    int max_blocks;
    const int32_t *q_pos;      /* (N,) */
    float scale, softcap;
    int window;
    const float *sinks;        /* (H,) or NULL */
    const int32_t *toks;       /* the items' token lists */
    const int32_t *slot_base;  /* (N,) first partial slot of a token */
    const int32_t *chunk0;     /* (N,) chunk index of that slot */
    const int32_t *nparts;     /* (N,) partials of a token (1: items write out directly) */
    float *partial;            /* (slots, H, Dv + 2): o, m, l */
    int k_tiled;               /* a Q4_0 K pool in 16-key tiles (simd_kv_rows.h) */
} attn_ctx;

/* kind 0: tile (decodes sharing blocks), 2: tile (a prompt's tokens: on AMX-BF16 where the CPU
 * has it), 1: rows. Rows r = hi * nt + ti (nt = tok1 - tok0): token toks[tok0 + ti],
 * head h0 + hi, so the rows of one kv head are consecutive; a tile's heads belong to one kv
 * head, a rows item's may span several (each block is then read once, front to back).
 * Blocks [b0, b1) of sequence seq's table; chunk names the partial. */
typedef struct {
    int32_t kind, seq, h0, h1, tok0, tok1, b0, b1, chunk;
} attn_item;

/* Rows of a block to prefetch while another is computed: row j at p + j * stride, bytes
 * long. The rows kernels ask for row j of it as they reach key j, so the requests flow at
 * the pace of the arithmetic (a whole block asked for at once overflows the miss buffers
 * and most of the prefetches are dropped). */
typedef struct {
    const uint8_t *p;
    long stride;
    int bytes;
    int lin;  /* key j's bytes are p + j * bytes (a spread part: attn_pf_lin) */
} attn_pf;

#ifndef ATTN_PF_LOCALITY
/* the K/V prefetches' hint: 2 (prefetcht1, into L2), not 3 (prefetcht0, into L1): on Zen 4
 * the L1-bound requests waited on its few miss buffers and a decode step's K/V came from
 * memory at ~7 GB/s a thread; into L2 the same requests halved decode attention at a 16k
 * depth (attn_ab.py --verify 0 --ctx 16000 --kv f16: 0.50-0.54 of the time) and left it in
 * cache unchanged (Zen 3: T1 measured even, session 19) */
#define ATTN_PF_LOCALITY 2
#endif

/* prefetch n bytes from p: a line every 64 bytes from p, and the last byte's line when that
 * stride stops short of it; whole lines on a line boundary (f16 rows of a multiple of 32
 * values in the line-aligned pool) just those lines, with no test of the last one (on Zen 3
 * each prefetch instruction costs ~3 cycles even when the line is in L1; the general path
 * cost a 64-value f16 row 2-3 of them more: decode attention 0.93 of the time in cache, 0.95
 * from memory). The 128-byte row (64 values) is the common one: no loop. */
static inline __attribute__((always_inline)) void attn_pf_span(const uint8_t *p, int n) {
    if (n == 128 && ((uintptr_t)p & 63) == 0) {
        __builtin_prefetch(p, 0, ATTN_PF_LOCALITY);
        __builtin_prefetch(p + 64, 0, ATTN_PF_LOCALITY);
        return;
    }
    if (((n | (int)((uintptr_t)p & 63)) & 63) == 0) {
        for (int c = 0; c < n; c += 64) __builtin_prefetch(p + c, 0, ATTN_PF_LOCALITY);
        return;
    }
    if (n <= 0) return;
    if (n <= 64) {  /* a row of at most a line touches two lines at most: no loop, no test */
        __builtin_prefetch(p, 0, ATTN_PF_LOCALITY);
        __builtin_prefetch(p + n - 1, 0, ATTN_PF_LOCALITY);
        return;
    }
    if (n <= 128) {  /* three lines at most (a key's Q4_0 rows of 3 kv heads, 108 bytes, whose
                      * general loop below was ~10% of decode attention): no loop, no test */
        __builtin_prefetch(p, 0, ATTN_PF_LOCALITY);
        __builtin_prefetch(p + 64, 0, ATTN_PF_LOCALITY);
        __builtin_prefetch(p + n - 1, 0, ATTN_PF_LOCALITY);
        return;
    }
    int c = 0;
    for (; c < n; c += 64) __builtin_prefetch(p + c, 0, ATTN_PF_LOCALITY);
    if ((((uintptr_t)p + (uintptr_t)(c - 64)) >> 6) != (((uintptr_t)p + (uintptr_t)(n - 1)) >> 6))
        __builtin_prefetch(p + n - 1, 0, ATTN_PF_LOCALITY);
}

/* (A/B) 0: a spread part's keys ask for their bytes as any row (attn_pf_span) */
static int attn_pf_lin_on = 1;
static inline int attn_set_pf_lin(int on) { const int old = attn_pf_lin_on; attn_pf_lin_on = on; return old; }

/* key j of a linear sweep (a decode rows item's next-block part, spread over a head's keys:
 * key j's share is bytes p + j * bytes, at most a line): the line its last byte lies in
 * when that line is new to the sweep (one prefetch every 64 / bytes keys, not attn_pf_span's
 * two a key and its address arithmetic, which were ~20% of a 32-sequence step's scores).
 * The sweep's first line is asked for by its first key only when the part starts on a line
 * boundary (a spread part does: K / V bytes of a block a head, 64-byte multiples). */
static inline __attribute__((always_inline)) void attn_pf_lin(const attn_pf *pf, int j) {
    const uintptr_t a = (uintptr_t)pf->p + (uintptr_t)((long)j * pf->bytes), e = a + (uintptr_t)pf->bytes - 1;
    if ((e >> 6) != ((a - 1) >> 6)) __builtin_prefetch((const void *)e, 0, ATTN_PF_LOCALITY);
}

/* key j of a tiled Q4_0 K (ATTN_KV_Q4_0T): p is the block's first tile of the item's first kv
 * head, stride the 16-key groups' distance, bytes a key's share of the group's tiles of the
 * item's kv heads (adjacent): the tiles' bytes asked for at the pace of the keys */
static inline __attribute__((always_inline)) void attn_pf_tile_row(const attn_pf *pf, int j) {
    if (!pf) return;
    if (pf->lin) {
        attn_pf_lin(pf, j);
        return;
    }
    attn_pf_span(pf->p + (long)(j >> 4) * pf->stride + (long)(j & 15) * pf->bytes, pf->bytes);
}

static inline __attribute__((always_inline)) void attn_pf_row(const attn_pf *pf, int j) {
    if (!pf) return;
    if (pf->lin) {
        attn_pf_lin(pf, j);
        return;
    }
    /* every line the row touches: a quantized row (36 bytes for a 64-value Q4_0 head, rows
     * of kv heads side by side) often straddles a line boundary, and the stride from its
     * start missed the last line (SmolLM2's 8-sequence attention out of cache with a Q4_0
     * cache: 4.7 -> 3.9 ms) */
    attn_pf_span(pf->p + (long)j * pf->stride, pf->bytes);
}

/* The next block's K and V rows, asked for a few at a time while a tile's P.V runs (the
 * tile's 64 rows of lines at once overflowed the miss buffers, most of those prefetches were
 * dropped, and the block's conversion waited on memory: 0.91-0.93 of the time on a 16k
 * prefill chunk). rows: rows left to ask for (0: nothing), per: rows each step asks. */
typedef struct {
    attn_pf k, v;
    int next, rows, per;
} attn_pf_pace;

/* before a P.V of `steps` kernel calls: spread what is left over them */
static inline void attn_pace_plan(attn_pf_pace *pp, int steps) {
    if (pp) pp->per = steps > 0 ? (pp->rows - pp->next + steps - 1) / steps : pp->rows - pp->next;
}

static inline __attribute__((always_inline)) void attn_pace_step(attn_pf_pace *pp) {
    if (!pp) return;
    for (int i = 0; i < pp->per && pp->next < pp->rows; i++, pp->next++) {
        attn_pf_row(&pp->k, pp->next);
        attn_pf_row(&pp->v, pp->next);
    }
}

/* after the P.V: whatever its steps left */
static inline void attn_pace_rest(attn_pf_pace *pp) {
    if (!pp) return;
    pp->per = pp->rows - pp->next;
    attn_pace_step(pp);
}

/* floats of per-thread scratch an item needs: the f32 kernels', then (from attn_ab_base) the
 * AMX-BF16 tile item's bf16 tiles */
static inline long attn_f32_scratch_floats(int D, int Dv, int bs) {
    const long ldS = (bs + 15) & ~15;
    return (long)ATTN_MAX_ROWS * D + (long)ATTN_MAX_ROWS * Dv + (long)bs * D + (long)bs * Dv
         + ldS * ATTN_MAX_ROWS + (long)ATTN_MAX_ROWS * (16 + 4) + 64
         + (long)ATTN_MAX_ROWS * D;  /* the lanes form's Q^T */
}
static inline long attn_ab_base(int D, int Dv, int bs) { return (attn_f32_scratch_floats(D, Dv, bs) + 15) & ~15L; }
static inline long attn_scratch_floats(int D, int Dv, int bs) {
    /* high and low bf16 parts of: Q^T pair tiles (96 rows x D), K (32 keys x D), V pair
     * tiles (32 keys x Dv), P tiles (96 rows x 32 keys); and 16 floats to align the start */
    return attn_ab_base(D, Dv, bs) + (long)ATTN_MAX_ROWS * D + 32L * D + 32L * Dv + ATTN_MAX_ROWS * 32 + 16;
}

/* Prefetch n rows of row_bytes each, stride bytes apart (the next block of a kv head: its
 * rows are spread over several 4 KiB pages, where hardware prefetch stops). */
static inline void attn_prefetch_rows(const uint8_t *p, long stride, int n, int row_bytes) {
    for (int j = 0; j < n; j++, p += stride) attn_pf_span(p, row_bytes);
}

static inline void attn_load_row(const uint8_t *src, int kv_type, float *y, int n) {
    switch (kv_type) {
        case ATTN_KV_F16: simd_f16_to_f32_row((const uint16_t *)src, y, n); break;
        case ATTN_KV_Q8_0: kv_dequant_q8_0(src, y, n); break;
        case ATTN_KV_Q4_0: kv_dequant_q4_0(src, y, n); break;
        default: memcpy(y, src, (size_t)n * sizeof(float));
    }
}

/* rows j0..j1-1 of a block (one kv head) as f32 rows of n values, ld apart */
static inline void attn_load_rows(const uint8_t *p, long stride, int kv_type, int j0, int j1, int n, float *y, int ld) {
#if ATTN_AVX512
    if (kv_type == ATTN_KV_F16 && n % 16 == 0) {
        for (int j = j0; j < j1; j++) {
            const uint16_t *src = (const uint16_t *)(p + (long)j * stride);
            float *dst = y + (long)j * ld;
            for (int d = 0; d < n; d += 16)
                _mm512_storeu_ps(dst + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + d))));
        }
        return;
    }
#endif
    for (int j = j0; j < j1; j++) attn_load_row(p + (long)j * stride, kv_type, y + (long)j * ld, n);
}

/* ---- exp and tanh ------------------------------------------------------------------------ */

/* Scores are kept in log2 units (q is scaled by scale * log2(e)), so probabilities are
 * 2^(s - m): one roundscale, a degree-5 polynomial (max relative error 2.4e-7 on [-1/2,
 * 1/2]) and a scalef. Inputs are <= 0 here (s - running max); below -125 (and -inf, NaN)
 * the result is 0, never a denormal. */
#define ATTN_LOG2E 1.44269504088896340736f
static inline float attn_exp2(float x) { return x >= -125.0f ? exp2f(x) : 0.0f; }

#if ATTN_AVX512
static inline __m512 attn_exp2_16(__m512 x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(0x1.5c08b6p-10f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.3d0c4ap-7f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.c6b6e6p-5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.ebf918p-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.62e428p-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.000002p+0f));
    return _mm512_maskz_scalef_ps(live, p, n);
}

/* softcap * tanh(x / softcap); tanh(y) = 1 - 2 / (exp(2y) + 1) (saturates to +-1) */
static inline __m512 attn_softcap16(__m512 x, float softcap) {
    const __m512 c = _mm512_set1_ps(softcap);
    const __m512 e = simd_exp_f32x16(_mm512_mul_ps(x, _mm512_set1_ps(2.0f / softcap)));
    const __m512 t = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    return _mm512_mul_ps(c, t);
}
#endif

static inline float attn_softcap1(float x, float softcap) { return softcap * tanhf(x / softcap); }

/* ---- AVX2 (256-bit, no AVX-512): the same kernels 8 lanes wide --------------------------
 * Machines without AVX-512 (AMD Zen 2/3, many Intel desktops) run these instead of the plain
 * C loops. Every score, statistic and output is summed per row as the plain C path's
 * contract asks (a row's numbers depend on its own q and keys only), so batching and block
 * sharing keep their bits; int8 scores against a quantized K are exact integer sums and so
 * the bits of every other path. */
#if ATTN_AVX2
/* attn_exp2_16's polynomial; 2^n built in the exponent field (n in [-125, 127]: exact, as
 * scalef is), so the same bits */
static inline __m256 attn_exp2_8(__m256 x) {
    const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-125.0f), _CMP_GE_OQ);
    const __m256 n = _mm256_min_ps(_mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                   _mm256_set1_ps(127.0f));
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(0x1.5c08b6p-10f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.3d0c4ap-7f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.c6b6e6p-5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.ebf918p-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.62e428p-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.000002p+0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(_mm256_and_ps(n, live)),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), live);
}

/* softcap * tanh(x / softcap) = softcap * (1 - 2 / (2^(2 x log2e / softcap) + 1)) */
static inline __m256 attn_softcap8(__m256 x, float softcap) {
    const __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(2.0f * ATTN_LOG2E / softcap));
    const __m256 big = _mm256_cmp_ps(y, _mm256_set1_ps(126.0f), _CMP_GT_OQ);  /* tanh = 1 */
    const __m256 e = attn_exp2_8(_mm256_min_ps(y, _mm256_set1_ps(126.0f)));
    __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    t = _mm256_blendv_ps(t, _mm256_set1_ps(1.0f), big);
    return _mm256_mul_ps(_mm256_set1_ps(softcap), t);
}

/* lane u = the sum of v[u]'s 8 lanes (a fixed tree: pairs, quads, halves) */
/* the tree past its first level: t_i = hadd(v[2i], v[2i + 1]) */
static inline __m256 attn_hsum8x8_pairs(__m256 t0, __m256 t1, __m256 t2, __m256 t3) {
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

static inline __m256 attn_hsum8x8(const __m256 *v) {
    return attn_hsum8x8_pairs(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]), _mm256_hadd_ps(v[4], v[5]),
                              _mm256_hadd_ps(v[6], v[7]));
}

/* r[i] (row i of an 8 x 8 block) -> r[j] (its column j) */
static inline void attn_transpose8(__m256 *r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* lanes i of [base, base + 8) with lo <= i <= hi, as an all-ones float mask */
static inline __m256 attn_range8(int base, int lo, int hi) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i ok = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(lo), idx),
                                           _mm256_cmpgt_epi32(_mm256_set1_epi32(hi + 1), idx));
    return _mm256_castsi256_ps(ok);
}

/* the f16 scales at p + u * ld (u < 8; lanes outside `live` 0) as 8 floats: a gather (8
 * two-byte stores read back as one vector stall on the store forwarding: ~18% of the
 * batched decode scores' samples) */
static inline __m256 attn_scales8(const uint8_t *p, long ld, __m256 live) {
    const __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)ld));
    const __m256i g = _mm256_and_si256(
        _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)p, offs, _mm256_castps_si256(live), 1),
        _mm256_set1_epi32(0xFFFF));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1)));
}

/* 8 values e.. of row j of an f32 / f16 K or V (rows ld elements apart; a quantized block is
 * converted to f32 first: attn_rows_item) */
static inline __m256 attn_kvec8(const void *k, const int T, long j, long ld, int e) {
    if (T == ATTN_KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)k + j * ld + e)));
    return _mm256_loadu_ps((const float *)k + j * ld + e);
}
#endif

/* ---- results: final rows and partials ---------------------------------------------------- */

/* Row (token t, head h) done over the item's keys: o (Dv), max m, sum l. */
static inline void attn_emit(const attn_ctx *c, int t, int h, const float *o, float m, float l, int chunk) {
    const int Dv = c->Dv;
    if (c->nparts[t] > 1) {
        float *p = c->partial + ((long)(c->slot_base[t] + chunk - c->chunk0[t]) * c->H + h) * (Dv + 2);
        memcpy(p, o, (size_t)Dv * sizeof(float));
        p[Dv] = m;
        p[Dv + 1] = l;
        return;
    }
    float f = 1.0f;
    if (c->sinks) {  /* an extra logit with no value (m and l are in log2 units) */
        const float sk = c->sinks[h] * ATTN_LOG2E;
        const float mf = m > sk ? m : sk;
        f = m == -INFINITY ? 0.0f : attn_exp2(m - mf);
        l = l * f + attn_exp2(sk - mf);
    }
    /* (o * f) / l as attn_merge rounds it: a row whose other chunks are empty (a verify
     * segment's earlier tokens) gets the bits it gets here */
    float *dst = c->out + ((long)t * c->H + h) * Dv;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int i = 0; i < Dv; i++) dst[i] = (o[i] * f) * inv;
}

/* out row (t, h) from its partials, combined in chunk order */
static void attn_merge(const attn_ctx *c, int t, int h) {
    const int Dv = c->Dv, np = c->nparts[t];
    const float *p0 = c->partial + ((long)c->slot_base[t] * c->H + h) * (Dv + 2);
    const long stride = (long)c->H * (Dv + 2);
    float M = -INFINITY;
    const float sk = c->sinks ? c->sinks[h] * ATTN_LOG2E : -INFINITY;
    for (int k = 0; k < np; k++) M = p0[k * stride + Dv] > M ? p0[k * stride + Dv] : M;
    M = sk > M ? sk : M;
    float *dst = c->out + ((long)t * c->H + h) * Dv;
    for (int i = 0; i < Dv; i++) dst[i] = 0.0f;
    float L = 0.0f;
    if (M != -INFINITY) {
        for (int k = 0; k < np; k++) {
            const float *p = p0 + k * stride;
            if (p[Dv] == -INFINITY) continue;
            const float w = attn_exp2(p[Dv] - M);
            L += p[Dv + 1] * w;
            for (int i = 0; i < Dv; i++) dst[i] += p[i] * w;
        }
        if (c->sinks) L += attn_exp2(sk - M);
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int i = 0; i < Dv; i++) dst[i] *= inv;
}

/* ---- tile kernel: rows in lanes ----------------------------------------------------------- */

/* st[j*ldq + r] = sum_d k[j*ldk + d] * qt[d*ldq + r], j < nk, r < 16*nv */
#if ATTN_AVX512
/* NK keys x NV lane vectors of accumulators (NK * NV <= 24 registers). bmax != NULL: also
 * the lanes' maximum score over the nk keys (16 * NV floats), so the softmax of a block that
 * needs no mask or cap skips its max pass. */
static inline __attribute__((always_inline)) void attn_tile_scores_nv(
        const int NV, const int NK, const float *qt, int ldq, const float *k, long ldk, int nk, int D, float *st,
        float *bmax) {
    __m512 bm[4];
    for (int v = 0; v < NV; v++) bm[v] = _mm512_set1_ps(-INFINITY);
    int j0 = 0;
    for (; j0 + NK <= nk; j0 += NK) {
        __m512 a[16][4];
        for (int jj = 0; jj < NK; jj++)
            for (int v = 0; v < NV; v++) a[jj][v] = _mm512_setzero_ps();
        const float *kr = k + (long)j0 * ldk;
        for (int d = 0; d < D; d++) {
            __m512 qv[4];
            for (int v = 0; v < NV; v++) qv[v] = _mm512_loadu_ps(qt + (long)d * ldq + 16 * v);
            for (int jj = 0; jj < NK; jj++) {
                const __m512 kb = _mm512_set1_ps(kr[jj * ldk + d]);
                for (int v = 0; v < NV; v++) a[jj][v] = _mm512_fmadd_ps(kb, qv[v], a[jj][v]);
            }
        }
        for (int jj = 0; jj < NK; jj++)
            for (int v = 0; v < NV; v++) {
                _mm512_storeu_ps(st + (long)(j0 + jj) * ldq + 16 * v, a[jj][v]);
                if (bmax) bm[v] = _mm512_max_ps(bm[v], a[jj][v]);
            }
    }
    for (; j0 < nk; j0++) {
        __m512 a[4];
        for (int v = 0; v < NV; v++) a[v] = _mm512_setzero_ps();
        const float *kr = k + (long)j0 * ldk;
        for (int d = 0; d < D; d++) {
            const __m512 kb = _mm512_set1_ps(kr[d]);
            for (int v = 0; v < NV; v++) a[v] = _mm512_fmadd_ps(kb, _mm512_loadu_ps(qt + (long)d * ldq + 16 * v), a[v]);
        }
        for (int v = 0; v < NV; v++) {
            _mm512_storeu_ps(st + (long)j0 * ldq + 16 * v, a[v]);
            if (bmax) bm[v] = _mm512_max_ps(bm[v], a[v]);
        }
    }
    if (bmax)
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(bmax + 16 * v, bm[v]);
}
#endif

#if ATTN_AVX2
/* 16 lanes (two vectors) of st against keys: 6 keys x 2 vectors of accumulators a pass */
static inline __attribute__((always_inline)) void attn_tile_scores8(const float *qt, int ldq, const float *k, long ldk, int nk, int D, float *st,
                                     float *bmax) {
    __m256 bm0 = _mm256_set1_ps(-INFINITY), bm1 = bm0;
    int j0 = 0;
    for (; j0 + 6 <= nk; j0 += 6) {
        __m256 a[6][2];
        for (int jj = 0; jj < 6; jj++) a[jj][0] = a[jj][1] = _mm256_setzero_ps();
        const float *kr = k + (long)j0 * ldk;
        for (int d = 0; d < D; d++) {
            const __m256 q0 = _mm256_loadu_ps(qt + (long)d * ldq), q1 = _mm256_loadu_ps(qt + (long)d * ldq + 8);
            for (int jj = 0; jj < 6; jj++) {
                const __m256 kb = _mm256_broadcast_ss(kr + jj * ldk + d);
                a[jj][0] = _mm256_fmadd_ps(kb, q0, a[jj][0]);
                a[jj][1] = _mm256_fmadd_ps(kb, q1, a[jj][1]);
            }
        }
        for (int jj = 0; jj < 6; jj++) {
            _mm256_storeu_ps(st + (long)(j0 + jj) * ldq, a[jj][0]);
            _mm256_storeu_ps(st + (long)(j0 + jj) * ldq + 8, a[jj][1]);
            bm0 = _mm256_max_ps(bm0, a[jj][0]);
            bm1 = _mm256_max_ps(bm1, a[jj][1]);
        }
    }
    /* the keys past the passes of 6 two at a time: one key's two fma chains waited on the fma
     * latency (a 32-key block's last 2 keys cost what 8 others do); each key's chain over d
     * is the same, so the same bits */
    for (; j0 + 2 <= nk; j0 += 2) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, c0 = a0, c1 = a0;
        const float *kr = k + (long)j0 * ldk;
        for (int d = 0; d < D; d++) {
            const __m256 q0 = _mm256_loadu_ps(qt + (long)d * ldq), q1 = _mm256_loadu_ps(qt + (long)d * ldq + 8);
            const __m256 ka = _mm256_broadcast_ss(kr + d), kc = _mm256_broadcast_ss(kr + ldk + d);
            a0 = _mm256_fmadd_ps(ka, q0, a0);
            a1 = _mm256_fmadd_ps(ka, q1, a1);
            c0 = _mm256_fmadd_ps(kc, q0, c0);
            c1 = _mm256_fmadd_ps(kc, q1, c1);
        }
        _mm256_storeu_ps(st + (long)j0 * ldq, a0);
        _mm256_storeu_ps(st + (long)j0 * ldq + 8, a1);
        _mm256_storeu_ps(st + (long)(j0 + 1) * ldq, c0);
        _mm256_storeu_ps(st + (long)(j0 + 1) * ldq + 8, c1);
        bm0 = _mm256_max_ps(bm0, _mm256_max_ps(a0, c0));
        bm1 = _mm256_max_ps(bm1, _mm256_max_ps(a1, c1));
    }
    for (; j0 < nk; j0++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        const float *kr = k + (long)j0 * ldk;
        for (int d = 0; d < D; d++) {
            const __m256 kb = _mm256_broadcast_ss(kr + d);
            a0 = _mm256_fmadd_ps(kb, _mm256_loadu_ps(qt + (long)d * ldq), a0);
            a1 = _mm256_fmadd_ps(kb, _mm256_loadu_ps(qt + (long)d * ldq + 8), a1);
        }
        _mm256_storeu_ps(st + (long)j0 * ldq, a0);
        _mm256_storeu_ps(st + (long)j0 * ldq + 8, a1);
        bm0 = _mm256_max_ps(bm0, a0);
        bm1 = _mm256_max_ps(bm1, a1);
    }
    if (bmax) {
        _mm256_storeu_ps(bmax, bm0);
        _mm256_storeu_ps(bmax + 8, bm1);
    }
}

/* NK keys (from k, rows ldk apart) against 8 lanes of qt: scores to st (rows ldq apart), their
 * max into bm */
static inline __attribute__((always_inline)) void attn_tile_scores8_keys(
        const int NK, const float *qt, int ldq, const float *k, long ldk, int D, float *st, __m256 *bm) {
    __m256 a[12];
    for (int jj = 0; jj < NK; jj++) a[jj] = _mm256_setzero_ps();
    for (int d = 0; d < D; d++) {
        const __m256 q0 = _mm256_loadu_ps(qt + (long)d * ldq);
        for (int jj = 0; jj < NK; jj++) a[jj] = _mm256_fmadd_ps(_mm256_broadcast_ss(k + jj * ldk + d), q0, a[jj]);
    }
    for (int jj = 0; jj < NK; jj++) {
        _mm256_storeu_ps(st + (long)jj * ldq, a[jj]);
        *bm = _mm256_max_ps(*bm, a[jj]);
    }
}

/* attn_tile_scores8 for 8 lanes (a tile's last rows past whole 16-lane pairs): 12 keys a pass
 * (one vector each: 12 fma chains), the same chain over d for every key and lane, so the
 * same bits as the 16-lane form gives those lanes */
static inline void attn_tile_scores8_half(const float *qt, int ldq, const float *k, long ldk, int nk, int D, float *st,
                                          float *bmax) {
    __m256 bm = _mm256_set1_ps(-INFINITY);
    int j0 = 0;
    for (; j0 + 12 <= nk; j0 += 12) attn_tile_scores8_keys(12, qt, ldq, k + (long)j0 * ldk, ldk, D, st + (long)j0 * ldq, &bm);
    for (; j0 + 4 <= nk; j0 += 4) attn_tile_scores8_keys(4, qt, ldq, k + (long)j0 * ldk, ldk, D, st + (long)j0 * ldq, &bm);
    for (; j0 < nk; j0++) attn_tile_scores8_keys(1, qt, ldq, k + (long)j0 * ldk, ldk, D, st + (long)j0 * ldq, &bm);
    if (bmax) _mm256_storeu_ps(bmax, bm);
}

/* RB rows x NV vectors of values (8 each) from o / v's first: accumulators in registers. H:
 * V is f16 (read from the pool and converted in the loop: the conversion is exact and runs
 * beside the fmas; no f32 copy of the block passes through L1), else f32. */
static inline __attribute__((always_inline)) void attn_tile_pv8_rb(
        const int RB, const int NV, const int H, float *o, int Dv, const float *pt, int ldp, const void *v, long ldv,
        int nk, const float *alpha) {
    __m256 acc[6][2];
    for (int r = 0; r < RB; r++) {
        const __m256 a = _mm256_set1_ps(alpha[r]);
        for (int i = 0; i < NV; i++) acc[r][i] = _mm256_mul_ps(_mm256_loadu_ps(o + (long)r * Dv + 8 * i), a);
    }
    for (int j = 0; j < nk; j++) {
        __m256 vv[2];
        for (int i = 0; i < NV; i++)
            vv[i] = H ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)v + (long)j * ldv + 8 * i)))
                      : _mm256_loadu_ps((const float *)v + (long)j * ldv + 8 * i);
        const float *pr = pt + (long)j * ldp;
        for (int r = 0; r < RB; r++) {
            const __m256 pb = _mm256_broadcast_ss(pr + r);
            for (int i = 0; i < NV; i++) acc[r][i] = _mm256_fmadd_ps(pb, vv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NV; i++) _mm256_storeu_ps(o + (long)r * Dv + 8 * i, acc[r][i]);
}

#define ATTN_PV8_NV(RB, nv, H, ...)                                              \
    do {                                                                         \
        if ((nv) == 2) attn_tile_pv8_rb(RB, 2, H, __VA_ARGS__);                  \
        else attn_tile_pv8_rb(RB, 1, H, __VA_ARGS__);                            \
    } while (0)

/* attn_tile_pv on AVX2 (Dv % 8 == 0), V f32 or (H) f16, rows ldv values apart; pp: the next
 * block's rows, asked for along the way (or NULL) */
static inline __attribute__((always_inline)) void attn_tile_pv8(
        const int H, float *o, int Dv, int R, const float *pt, int ldp, const void *v, long ldv, int nk,
        const float *alpha, attn_pf_pace *pp) {
    attn_pace_plan(pp, (Dv + 15) / 16 * ((R + 5) / 6));
    for (int c0 = 0; c0 < Dv; c0 += 16) {
        const int nv = Dv - c0 >= 16 ? 2 : 1;
        float *oc = o + c0;
        const void *vc = H ? (const void *)((const uint16_t *)v + c0) : (const void *)((const float *)v + c0);
        int r = 0;
        for (; r + 6 <= R; r += 6) {
            attn_pace_step(pp);
            ATTN_PV8_NV(6, nv, H, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r);
        }
        attn_pace_step(pp);
        switch (R - r) {
            case 1: ATTN_PV8_NV(1, nv, H, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r); break;
            case 2: ATTN_PV8_NV(2, nv, H, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r); break;
            case 3: ATTN_PV8_NV(3, nv, H, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r); break;
            case 4: ATTN_PV8_NV(4, nv, H, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r); break;
            case 5: ATTN_PV8_NV(5, nv, H, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r); break;
            default: break;
        }
    }
    attn_pace_rest(pp);
}

/* attn_tile_pv for an f16 V read from the pool (its own symbol for profiles) */
static void attn_tile_pv_f16(float *o, int Dv, int R, const float *pt, int ldp, const uint16_t *v, long ldv, int nk,
                             const float *alpha, attn_pf_pace *pp) {
    attn_tile_pv8(1, o, Dv, R, pt, ldp, v, ldv, nk, alpha, pp);
}
#endif

static void attn_tile_scores(const float *qt, int ldq, int nv, int R, const float *k, long ldk, int nk, int D,
                             float *st, float *bmax) {
#if ATTN_AVX512
    (void)R;
    /* passes of up to 4 lane vectors (K read again from L1 per pass): 4, 3 | 2, 3 | 3 */
    for (int v0 = 0; v0 < nv;) {
        const int left = nv - v0, w = left == 4 ? 4 : left >= 3 ? 3 : left;
        const float *q = qt + 16 * v0;
        float *o = st + 16 * v0, *bm = bmax ? bmax + 16 * v0 : NULL;
        switch (w) {
            case 1: attn_tile_scores_nv(1, 16, q, ldq, k, ldk, nk, D, o, bm); break;
            case 2: attn_tile_scores_nv(2, 12, q, ldq, k, ldk, nk, D, o, bm); break;
            case 3: attn_tile_scores_nv(3, 8, q, ldq, k, ldk, nk, D, o, bm); break;
            default: attn_tile_scores_nv(4, 6, q, ldq, k, ldk, nk, D, o, bm); break;
        }
        v0 += w;
    }
#else
#if ATTN_AVX2
    /* 16 lanes a pass (K read again from L1); rows past whole pairs that fit 8 lanes, 8
     * (their other 8 lanes, padding, are neither computed nor read: a next turn's 13 tokens
     * x 3 heads are 39 rows, 40 lanes, not 48) */
    const int nh8 = (R + 7) / 8;
    for (int v0 = 0; v0 < nh8; v0 += 2) {
        if (v0 + 1 < nh8)
            attn_tile_scores8(qt + 8 * v0, ldq, k, ldk, nk, D, st + 8 * v0, bmax ? bmax + 8 * v0 : NULL);
        else
            attn_tile_scores8_half(qt + 8 * v0, ldq, k, ldk, nk, D, st + 8 * v0, bmax ? bmax + 8 * v0 : NULL);
    }
    (void)nv;
    return;
#endif
    const int nl = 16 * nv;  /* every lane, padding too (R: the rows, unused here) */
    (void)R;
    for (int j = 0; j < nk; j++) {
        float *s = st + (long)j * ldq;
        for (int r = 0; r < nl; r++) s[r] = 0.0f;
        for (int d = 0; d < D; d++) {
            const float kd = k[(long)j * ldk + d];
            const float *q = qt + (long)d * ldq;
            for (int r = 0; r < nl; r++) s[r] += kd * q[r];
        }
    }
    if (bmax)
        for (int r = 0; r < nl; r++) {
            float mx = -INFINITY;
            for (int j = 0; j < nk; j++) mx = st[(long)j * ldq + r] > mx ? st[(long)j * ldq + r] : mx;
            bmax[r] = mx;
        }
#endif
}

/* Scores st (nk keys at positions kpos0.., lanes r < 16*nv) -> probabilities, and the
 * online-softmax update of m, l; alpha = exp(m_old - m_new) per lane. With need_mask, keys a
 * lane does not see (kpos > qpos, or outside the window) are dropped. bmax: the lanes' max
 * score over the block from attn_tile_scores (only without mask and softcap), or NULL.
 * lazy > 0 (AVX-512 only: the AMX item, ATTN_AB_LAZY): m moves only when the block's max
 * passes it by more than lazy; 0: m is the running max. */
static void attn_tile_softmax(float *st, int ldq, int nv, int R, int nk, int need_mask, const int32_t *qpos,
                              int kpos0, int window, float softcap, float *m, float *l, float *alpha,
                              const float *bmax, float lazy) {
    (void)R;  /* (AVX2: the 8-lane halves past the rows, not computed by the scores, skipped) */
    (void)lazy;
#if ATTN_AVX512
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int v = 0; v < nv; v++) {
        const __m512i qp = _mm512_loadu_si512((const void *)(qpos + 16 * v));
        __m512 bm = bmax ? _mm512_loadu_ps(bmax + 16 * v) : ninf;
        for (int j = 0; j < nk && !bmax; j++) {
            float *s = st + (long)j * ldq + 16 * v;
            __m512 x = _mm512_loadu_ps(s);
            if (softcap > 0.0f) x = attn_softcap16(x, softcap);
            if (need_mask) {
                const __m512i kp = _mm512_set1_epi32(kpos0 + j);
                __mmask16 ok = _mm512_cmple_epi32_mask(kp, qp);
                if (window > 0)
                    ok &= _mm512_cmplt_epi32_mask(_mm512_sub_epi32(qp, kp), _mm512_set1_epi32(window));
                x = _mm512_mask_blend_ps(ok, ninf, x);
            }
            if (softcap > 0.0f || need_mask) _mm512_storeu_ps(s, x);
            bm = _mm512_max_ps(bm, x);
        }
        const __m512 mo = _mm512_loadu_ps(m + 16 * v);
        __m512 mn = _mm512_max_ps(mo, bm);
        __mmask16 moved = 0xFFFF;
        if (lazy > 0.0f) { /* the reference moves only past the lazy margin (and from -inf) */
            moved = _mm512_cmp_ps_mask(bm, _mm512_add_ps(mo, _mm512_set1_ps(lazy)), _CMP_GT_OQ);
            mn = _mm512_mask_blend_ps(moved, mo, bm);
        }
        /* a lane that has seen no key yet: p = exp(-inf) = 0 against 0 */
        const __m512 mu = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn, _mm512_setzero_ps());
        const __m512 a = _mm512_mask_blend_ps(moved, _mm512_set1_ps(1.0f), attn_exp2_16(_mm512_sub_ps(mo, mu)));
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        int j = 0;
        for (; j + 2 <= nk; j += 2) {
            float *s0 = st + (long)j * ldq + 16 * v, *s1 = s0 + ldq;
            const __m512 p0 = attn_exp2_16(_mm512_sub_ps(_mm512_loadu_ps(s0), mu));
            const __m512 p1 = attn_exp2_16(_mm512_sub_ps(_mm512_loadu_ps(s1), mu));
            _mm512_storeu_ps(s0, p0);
            _mm512_storeu_ps(s1, p1);
            sum0 = _mm512_add_ps(sum0, p0);
            sum1 = _mm512_add_ps(sum1, p1);
        }
        if (j < nk) {
            float *s0 = st + (long)j * ldq + 16 * v;
            const __m512 p0 = attn_exp2_16(_mm512_sub_ps(_mm512_loadu_ps(s0), mu));
            _mm512_storeu_ps(s0, p0);
            sum0 = _mm512_add_ps(sum0, p0);
        }
        _mm512_storeu_ps(l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(l + 16 * v), a, _mm512_add_ps(sum0, sum1)));
        _mm512_storeu_ps(m + 16 * v, mn);
        _mm512_storeu_ps(alpha + 16 * v, a);
    }
#else
#if ATTN_AVX2
    {
        const __m256 ninf = _mm256_set1_ps(-INFINITY);
        for (int v = 0; v < (R + 7) / 8; v++) {
            const __m256i qp = _mm256_loadu_si256((const __m256i *)(qpos + 8 * v));
            __m256 bm = bmax ? _mm256_loadu_ps(bmax + 8 * v) : ninf;
            for (int j = 0; j < nk && !bmax; j++) {
                float *s = st + (long)j * ldq + 8 * v;
                __m256 x = _mm256_loadu_ps(s);
                if (softcap > 0.0f) x = attn_softcap8(x, softcap);
                if (need_mask) {
                    const __m256i kp = _mm256_set1_epi32(kpos0 + j);
                    __m256i bad = _mm256_cmpgt_epi32(kp, qp);
                    if (window > 0)
                        bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_sub_epi32(qp, kp), _mm256_set1_epi32(window - 1)));
                    x = _mm256_blendv_ps(x, ninf, _mm256_castsi256_ps(bad));
                }
                if (softcap > 0.0f || need_mask) _mm256_storeu_ps(s, x);
                bm = _mm256_max_ps(bm, x);
            }
            const __m256 mo = _mm256_loadu_ps(m + 8 * v);
            const __m256 mn = _mm256_max_ps(mo, bm);
            const __m256 mu = _mm256_blendv_ps(mn, _mm256_setzero_ps(), _mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ));
            const __m256 a = attn_exp2_8(_mm256_sub_ps(mo, mu));
            __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
            int j = 0;
            for (; j + 2 <= nk; j += 2) {
                float *s0 = st + (long)j * ldq + 8 * v, *s1 = s0 + ldq;
                const __m256 p0 = attn_exp2_8(_mm256_sub_ps(_mm256_loadu_ps(s0), mu));
                const __m256 p1 = attn_exp2_8(_mm256_sub_ps(_mm256_loadu_ps(s1), mu));
                _mm256_storeu_ps(s0, p0);
                _mm256_storeu_ps(s1, p1);
                sum0 = _mm256_add_ps(sum0, p0);
                sum1 = _mm256_add_ps(sum1, p1);
            }
            if (j < nk) {
                float *s0 = st + (long)j * ldq + 8 * v;
                const __m256 p0 = attn_exp2_8(_mm256_sub_ps(_mm256_loadu_ps(s0), mu));
                _mm256_storeu_ps(s0, p0);
                sum0 = _mm256_add_ps(sum0, p0);
            }
            _mm256_storeu_ps(l + 8 * v, _mm256_fmadd_ps(_mm256_loadu_ps(l + 8 * v), a, _mm256_add_ps(sum0, sum1)));
            _mm256_storeu_ps(m + 8 * v, mn);
            _mm256_storeu_ps(alpha + 8 * v, a);
        }
        return;
    }
#endif
    const int nl = 16 * nv;  /* every lane */
    for (int r = 0; r < nl; r++) {
        float bm = bmax ? bmax[r] : -INFINITY;
        for (int j = 0; j < nk && !bmax; j++) {
            float *s = st + (long)j * ldq + r;
            float x = *s;
            if (softcap > 0.0f) x = attn_softcap1(x, softcap);
            if (need_mask) {
                const int kp = kpos0 + j;
                if (kp > qpos[r] || (window > 0 && qpos[r] - kp >= window)) x = -INFINITY;
            }
            *s = x;
            bm = x > bm ? x : bm;
        }
        const float mn = m[r] > bm ? m[r] : bm;
        const float mu = mn == -INFINITY ? 0.0f : mn;
        const float a = attn_exp2(m[r] - mu);
        float sum = 0.0f;
        for (int j = 0; j < nk; j++) {
            float *s = st + (long)j * ldq + r;
            *s = attn_exp2(*s - mu);
            sum += *s;
        }
        l[r] = l[r] * a + sum;
        m[r] = mn;
        alpha[r] = a;
    }
#endif
}

/* o[r*Dv + c] = o * alpha[r] + sum_j pt[j*ldp + r] * v[j*ldv + c], r < R, j < nk */
#if ATTN_AVX512
/* RB rows x NV vectors of values c0.. (the last one masked by kl): accumulators in registers */
static inline __attribute__((always_inline)) void attn_tile_pv_rb(
        const int RB, const int NV, float *o, int Dv, const float *pt, int ldp, const float *v, long ldv, int nk,
        const float *alpha, __mmask16 kl) {
    __m512 acc[6][4];
    __mmask16 km[4];
    for (int i = 0; i < NV; i++) km[i] = i == NV - 1 ? kl : (__mmask16)0xFFFF;
    for (int r = 0; r < RB; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int i = 0; i < NV; i++) acc[r][i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(km[i], o + (long)r * Dv + 16 * i), a);
    }
    for (int j = 0; j < nk; j++) {
        __m512 vv[4];
        const float *vr = v + (long)j * ldv;
        for (int i = 0; i < NV; i++) vv[i] = _mm512_maskz_loadu_ps(km[i], vr + 16 * i);
        const float *pr = pt + (long)j * ldp;
        for (int r = 0; r < RB; r++) {
            const __m512 pb = _mm512_set1_ps(pr[r]);
            for (int i = 0; i < NV; i++) acc[r][i] = _mm512_fmadd_ps(pb, vv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NV; i++) _mm512_mask_storeu_ps(o + (long)r * Dv + 16 * i, km[i], acc[r][i]);
}

#define ATTN_PV_NV(RB, nv, ...)                                        \
    do {                                                               \
        switch (nv) {                                                  \
            case 1: attn_tile_pv_rb(RB, 1, __VA_ARGS__); break;        \
            case 2: attn_tile_pv_rb(RB, 2, __VA_ARGS__); break;        \
            case 3: attn_tile_pv_rb(RB, 3, __VA_ARGS__); break;        \
            default: attn_tile_pv_rb(RB, 4, __VA_ARGS__); break;       \
        }                                                              \
    } while (0)
#endif

static void attn_tile_pv(float *o, int Dv, int R, const float *pt, int ldp, const float *v, long ldv, int nk,
                         const float *alpha, attn_pf_pace *pp) {
#if ATTN_AVX512
    attn_pace_plan(pp, (Dv + 63) / 64 * ((R + 5) / 6));
    for (int c0 = 0; c0 < Dv; c0 += 64) {
        const int w = Dv - c0 < 64 ? Dv - c0 : 64, nv = (w + 15) / 16;
        const __mmask16 kl = simd_mask16(w - 16 * (nv - 1));
        float *oc = o + c0;
        const float *vc = v + c0;
        int r = 0;
        for (; r + 6 <= R; r += 6) {
            attn_pace_step(pp);
            ATTN_PV_NV(6, nv, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r, kl);
        }
        attn_pace_step(pp);
        switch (R - r) {
            case 1: ATTN_PV_NV(1, nv, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r, kl); break;
            case 2: ATTN_PV_NV(2, nv, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r, kl); break;
            case 3: ATTN_PV_NV(3, nv, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r, kl); break;
            case 4: ATTN_PV_NV(4, nv, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r, kl); break;
            case 5: ATTN_PV_NV(5, nv, oc + (long)r * Dv, Dv, pt + r, ldp, vc, ldv, nk, alpha + r, kl); break;
            default: break;
        }
    }
    attn_pace_rest(pp);
#else
#if ATTN_AVX2
    if (Dv % 8 == 0) {
        attn_tile_pv8(0, o, Dv, R, pt, ldp, v, ldv, nk, alpha, pp);
        return;
    }
#endif
    attn_pace_plan(pp, R);
    for (int r = 0; r < R; r++) {
        attn_pace_step(pp);
        float *orow = o + (long)r * Dv;
        for (int c = 0; c < Dv; c++) orow[c] *= alpha[r];
        for (int j = 0; j < nk; j++) {
            const float p = pt[(long)j * ldp + r];
            const float *vr = v + (long)j * ldv;
            for (int c = 0; c < Dv; c++) orow[c] += p * vr[c];
        }
    }
    attn_pace_rest(pp);
#endif
}

/* the lowest key position row (token position qp) sees */
static inline int attn_key_lo(int qp, int window) {
    const int lo = window > 0 ? qp - window + 1 : 0;
    return lo > 0 ? lo : 0;
}

#if ATTN_AVX512
/* r[i] (row i of a 16 x 16 block) -> r[j] (its column j) */
static inline void attn_transpose16(__m512 *r) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}
#endif

/* ---- int8 scores against a quantized K (Q8_0 / Q4_0 cache) ----------------------------------
 *
 * With a Q8_0 / Q4_0 cache a rows item rounds q to 8 bits a 32-value block, as llama.cpp
 * takes Q for a quantized K (d = max|x| / 127, kept in f32 here), and a score is
 *     s = sum_b (float)I_b * (dk_b * dq_b)     (block 0 a product, then fma in block order)
 * with I_b block b's integer dot product. Integer sums are exact in any order, so every
 * path (any row count, the AVX-512 keys-in-lanes form below, the plain C loop) gives the
 * same bits, and the arithmetic is the VNNI byte dot product instead of f32 fma chains over
 * a dequantized K (Qwen3.5/3.6's attention layers at 16k with a Q4_0 cache: 29.5 -> 19.8 ms a
 * step, one thread; SmolLM2's 3 rows a kv head share each transposition too little to gain).
 * The tile kernel (prefill) takes the same rounded q in f32 (attn_tile_qt). */

static inline int attn_q8_scores(int kv_type) { return kv_type == ATTN_KV_Q8_0 || kv_type == ATTN_KV_Q4_0; }

/* bytes of one row's rounded q: AVX-512, 64 a pair of blocks in the K vector's lane order
 * (attn_rows_scores_q8); plain C, D in order */
static inline int attn_q8_row_bytes(int D) {
#if ATTN_AVX512
    return ((D / 32 + 1) / 2) * 64;
#else
    return D;
#endif
}

/* block b of x (32 values) rounded: v = rint(x / d), d = max|x| / 127 (0 for a zero block;
 * NaN for a block with a NaN or infinity, so that it shows in the output as the f32 path's
 * would); returns d */
static inline float attn_q8_block(const float *x, int8_t *v, int *sum) {
#if ATTN_AVX512
    /* the loop below's numbers: max is exact, cvtps rounds to nearest even as lrintf does */
    {
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1), big = _mm512_set1_ps(3.4e38f);
        const int bad = (_mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ)) != 0;
        const float amax = bad ? 0.0f : _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
        const __m512 iv = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, iv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, iv));
        q0 = _mm512_max_epi32(_mm512_min_epi32(q0, lim), nlim);
        q1 = _mm512_max_epi32(_mm512_min_epi32(q1, lim), nlim);
        if (bad) q0 = q1 = _mm512_setzero_si512();
        _mm_storeu_si128((__m128i *)v, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(v + 16), _mm512_cvtepi32_epi8(q1));
        *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        return bad ? NAN : amax / 127.0f;
    }
#elif ATTN_AVX2
    {  /* the same numbers, 8 lanes (lrintf through the PLT was 3% of batched decode attention) */
        const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), big = _mm256_set1_ps(3.4e38f);
        __m256 xv[4], mx = _mm256_setzero_ps(), nb = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            xv[i] = _mm256_loadu_ps(x + 8 * i);
            const __m256 a = _mm256_and_ps(xv[i], absm);
            nb = _mm256_or_ps(nb, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
            mx = _mm256_max_ps(mx, a);
        }
        const int bad = _mm256_movemask_ps(nb) != 0;
        const float amax = bad ? 0.0f : simd_hmax_f32x8(mx);
        const __m256 iv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
        __m256i q[4], t = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            q[i] = bad ? _mm256_setzero_si256()
                       : _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(xv[i], iv)), lim), nlim);
            t = _mm256_add_epi32(t, q[i]);
        }
        _mm256_storeu_si256((__m256i *)v, simd_pack_i8x32(q[0], q[1], q[2], q[3]));
        *sum = simd_hsum_i32x8(t);
        return bad ? NAN : amax / 127.0f;
    }
#endif
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < 32; i++) {
        const float a = fabsf(x[i]);
        bad |= !(a <= 3.4e38f);
        amax = a > amax ? a : amax;
    }
    const float id = amax > 0.0f && !bad ? 127.0f / amax : 0.0f;
    int s = 0;
    for (int i = 0; i < 32; i++) {
        long r = bad ? 0 : lrintf(x[i] * id);
        r = r > 127 ? 127 : r < -127 ? -127 : r;
        v[i] = (int8_t)r;
        s += (int)r;
    }
    *sum = s;
    return bad ? NAN : amax / 127.0f;
}

/* x (D values, D % 32 == 0) -> qb (attn_q8_row_bytes), dq[b], corr[b] = the K bytes' offset
 * times sum_i v_i (AVX-512 reads K as unsigned bytes: q8_0 + 128, q4_0 nibbles n = q + 8) */
static void attn_q8_prep(const float *x, int D, int kv_type, int8_t *qb, float *dq, int32_t *corr) {
    const int nb = D / 32;
    int8_t v[32];
#if ATTN_AVX512
    memset(qb, 0, (size_t)attn_q8_row_bytes(D));
#endif
    for (int b = 0; b < nb; b++) {
        int sum;
        dq[b] = attn_q8_block(x + 32 * b, v, &sum);
        corr[b] = (kv_type == ATTN_KV_Q8_0 ? 128 : 8) * sum;
#if ATTN_AVX512
        int8_t *dst = qb + 64 * (b / 2);
        const int odd = b & 1;
        if (kv_type == ATTN_KV_Q8_0) {
            memcpy(dst + 32 * odd, v, 32);
        } else {  /* [lo nibbles of 2p | of 2p+1 | hi nibbles of 2p | of 2p+1], 16 each */
            memcpy(dst + 16 * odd, v, 16);
            memcpy(dst + 32 + 16 * odd, v + 16, 16);
        }
#else
        memcpy(qb + 32 * b, v, 32);
#endif
    }
}

/* y = src * scale rounded as attn_q8_prep rounds it, in f32 (the tile kernel's q) */
static void attn_q8_round(const float *src, float scale, int D, float *y) {
    for (int b = 0; b < D / 32; b++) {
        float x[32];
        int8_t v[32];
        int sum;
        for (int i = 0; i < 32; i++) x[i] = src[32 * b + i] * scale;
        const float d = attn_q8_block(x, v, &sum);
        for (int i = 0; i < 32; i++) y[32 * b + i] = (float)v[i] * d;
    }
}

static inline int32_t attn_rd32(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

#if ATTN_AVX512
/* acc + the dot products of 4 unsigned bytes of u with 4 signed bytes of s, per 32-bit lane */
static inline __m512i attn_dpbusd(__m512i acc, __m512i u, __m512i s) {
#if SIMD_AVX512_VNNI
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    /* exact 16-bit products (maddubs would saturate at 255 x 127 x 2) */
    const __m512i m = _mm512_set1_epi16(0xFF);
    const __m512i ue = _mm512_and_si512(u, m), uo = _mm512_srli_epi16(u, 8);
    const __m512i se = _mm512_srai_epi16(_mm512_slli_epi16(s, 8), 8), so = _mm512_srai_epi16(s, 8);
    return _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_madd_epi16(ue, se), _mm512_madd_epi16(uo, so)));
#endif
}
#endif

#if ATTN_AVX2
/* RB rows' scores against 8 keys' block b of a Q4_0 K in lanes (lo[m], hi[m]: values 4m..4m+3
 * and 16 + 4m.. of each key as nibbles; dk the keys' scales): 8 maddubs a row against
 * broadcasts of its q, summed in int16 (8 x 15 x 127 x 2 < 32767) and widened once, the
 * offset correction and the scales, added into sacc[r] in block order */
static inline __attribute__((always_inline)) void attn_q4_keys8_rows(
        const int RB, const __m256i *lo, const __m256i *hi, __m256 dk, const int8_t *qb, int qstride, const float *dq,
        const int32_t *corr, int nb, int b, __m256 *sacc) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < RB; r++) {
        const int32_t *qw = (const int32_t *)(qb + (long)r * qstride + 32 * b);
        __m256i acc = _mm256_maddubs_epi16(lo[0], _mm256_set1_epi32(qw[0]));
        for (int m = 1; m < 4; m++) acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(lo[m], _mm256_set1_epi32(qw[m])));
        for (int m = 0; m < 4; m++) acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(hi[m], _mm256_set1_epi32(qw[4 + m])));
        __m256i I = _mm256_madd_epi16(acc, ones);
        I = _mm256_sub_epi32(I, _mm256_set1_epi32(corr[(long)r * nb + b]));
        const __m256 kq = _mm256_mul_ps(dk, _mm256_set1_ps(dq[(long)r * nb + b]));
        sacc[r] = b == 0 ? _mm256_mul_ps(_mm256_cvtepi32_ps(I), kq)
                         : _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), kq, sacc[r]);
    }
}

/* int8 scores (attn_rows_scores_q8's numbers) for RB rows: per key and block, the K bytes
 * once (Q4_0: nibbles n; Q8_0: signed bytes) against each row's q by maddubs + madd (exact:
 * |n q| pairs <= 3810, |k||q| pairs <= 32512), 8 keys' lane sums at once by simd_hsum8x8_i32 */
static inline __attribute__((always_inline)) void attn_rows_scores_q8_rb(
        const int RB, const int T, const int8_t *qb, int qstride, const float *dq, const int32_t *corr, int D,
        const uint8_t *k, long ldk, int j0, int j1, float *s, int ldS, const attn_pf *pf) {
    const int nb = D / 32, bb = T == ATTN_KV_Q8_0 ? 34 : 18;
    const __m256i ones = _mm256_set1_epi16(1), lowbits = _mm256_set1_epi8(0x0F);
    if (T == ATTN_KV_Q4_0T) {
        /* tiles (simd_kv_rows.h): the transposed dwords below are stored as such, 16 keys a
         * 64-byte vector, the scales as a vector: half a vector serves 8 keys */
        for (int jb = j0 & ~7; jb < j1; jb += 8) {
            __m256 sacc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            const __m256 live = attn_range8(jb, j0, j1 - 1);
            for (int u = 0; u < 8; u++)
                if (jb + u >= j0 && jb + u < j1) attn_pf_tile_row(pf, jb + u);
            const uint8_t *tile = k + (long)(jb >> 4) * ldk;
            const int half = jb & 8;  /* the group's keys 0..7 or 8..15 */
            for (int b = 0; b < nb; b++) {
                const uint8_t *pk = tile + 32 * nb + 512 * (b >> 1) + 256 * (b & 1) + 4 * half;
                __m256i lo[4], hi[4];  /* values 4m..4m+3 and 16 + 4m..16 + 4m + 3 of each key */
                for (int m = 0; m < 4; m++) {
                    const __m256i kv = _mm256_loadu_si256((const __m256i *)(pk + 64 * m));
                    lo[m] = _mm256_and_si256(kv, lowbits);
                    hi[m] = _mm256_and_si256(_mm256_srli_epi16(kv, 4), lowbits);
                }
                const __m256 dk = _mm256_and_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 32 * b + 2 * half))),
                                                live);
                attn_q4_keys8_rows(RB, lo, hi, dk, qb, qstride, dq, corr, nb, b, sacc);
            }
            for (int r = 0; r < RB; r++) _mm256_storeu_ps(s + (long)r * ldS + jb, _mm256_and_ps(sacc[r], live));
        }
        return;
    }
    if (T == ATTN_KV_Q4_0) {
        /* keys in lanes: a block's 16 nibble bytes of 8 keys transposed by dwords (vector m:
         * bytes 4m..4m+3 of every key), so a row's dots are 8 maddubs against broadcasts of
         * its q, summed in int16 (8 x 15 x 127 x 2 < 32767) and widened once: no horizontal
         * sums, and the transposition and unpacking are shared by the rows. The integers are
         * the same, and so the bits. */
        for (int jb = j0 & ~7; jb < j1; jb += 8) {
            __m256 sacc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            const __m256 live = attn_range8(jb, j0, j1 - 1);
            const int whole = jb >= j0 && jb + 8 <= j1;
            for (int u = 0; u < 8; u++)
                if (jb + u >= j0 && jb + u < j1) attn_pf_row(pf, jb + u);
            for (int b = 0; b < nb; b++) {
                /* the 8 keys' rows of this block (zeros for keys outside [j0, j1)) */
                const uint8_t *row[8];
                uint8_t zero[18] = {0};
                for (int u = 0; u < 8; u++) {
                    const int j = jb + u;
                    row[u] = whole || (j >= j0 && j < j1) ? k + (long)j * ldk + (long)b * bb : zero;
                }
                /* y_u: key u's bytes (low lane), key u + 4's (high lane) */
                __m256i y[4];
                for (int u = 0; u < 4; u++)
                    y[u] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row[u] + 2))),
                                                   _mm_loadu_si128((const __m128i *)(row[u + 4] + 2)), 1);
                const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
                const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
                __m256i kv[4];  /* kv[m]: dword m of keys 0..7 */
                kv[0] = _mm256_unpacklo_epi64(t0, t2);
                kv[1] = _mm256_unpackhi_epi64(t0, t2);
                kv[2] = _mm256_unpacklo_epi64(t1, t3);
                kv[3] = _mm256_unpackhi_epi64(t1, t3);
                __m256i lo[4], hi[4];  /* values 4m..4m+3 and 16 + 4m..16 + 4m + 3 of each key */
                for (int m = 0; m < 4; m++) {
                    lo[m] = _mm256_and_si256(kv[m], lowbits);
                    hi[m] = _mm256_and_si256(_mm256_srli_epi16(kv[m], 4), lowbits);
                }
                const __m256 dk = attn_scales8(k + (long)jb * ldk + (long)b * bb, ldk, live);
                attn_q4_keys8_rows(RB, lo, hi, dk, qb, qstride, dq, corr, nb, b, sacc);
            }
            for (int r = 0; r < RB; r++) _mm256_storeu_ps(s + (long)r * ldS + jb, _mm256_and_ps(sacc[r], live));
        }
        return;
    }
    for (int jb = j0 & ~7; jb < j1; jb += 8) {
        __m256 sacc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        const __m256 live = attn_range8(jb, j0, j1 - 1);
        for (int b = 0; b < nb; b++) {
            __m256i tmp[4][8];
            uint16_t dkh[8];
            for (int u = 0; u < 8; u++) {
                const int j = jb + u;
                if (j < j0 || j >= j1) {
                    dkh[u] = 0;
                    for (int r = 0; r < RB; r++) tmp[r][u] = _mm256_setzero_si256();
                    continue;
                }
                if (b == 0) attn_pf_row(pf, j);
                const uint8_t *blk = k + (long)j * ldk + (long)b * bb;
                dkh[u] = simd_rd16(blk);
                __m256i kx;
                if (T == ATTN_KV_Q4_0) {
                    const __m128i x = _mm_loadu_si128((const __m128i *)(blk + 2));
                    kx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), lowbits);
                } else {
                    kx = _mm256_loadu_si256((const __m256i *)(blk + 2));
                }
                const __m256i ka = T == ATTN_KV_Q4_0 ? kx : _mm256_abs_epi8(kx);
                for (int r = 0; r < RB; r++) {
                    __m256i qv = _mm256_loadu_si256((const __m256i *)(qb + (long)r * qstride + 32 * b));
                    if (T != ATTN_KV_Q4_0) qv = _mm256_sign_epi8(qv, kx);
                    tmp[r][u] = _mm256_madd_epi16(_mm256_maddubs_epi16(ka, qv), ones);
                }
            }
            const __m256 dk = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dkh));
            for (int r = 0; r < RB; r++) {
                __m256i I = simd_hsum8x8_i32(tmp[r]);
                if (T == ATTN_KV_Q4_0) I = _mm256_sub_epi32(I, _mm256_set1_epi32(corr[(long)r * nb + b]));
                const __m256 kq = _mm256_mul_ps(dk, _mm256_set1_ps(dq[(long)r * nb + b]));
                sacc[r] = b == 0 ? _mm256_mul_ps(_mm256_cvtepi32_ps(I), kq)
                                 : _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), kq, sacc[r]);
            }
        }
        for (int r = 0; r < RB; r++) _mm256_storeu_ps(s + (long)r * ldS + jb, _mm256_and_ps(sacc[r], live));
    }
}
#endif

/* s[r * ldS + j] = the int8 score of row r (qb: rows qstride bytes apart; dq, corr: nb a row)
 * and key j, for r < R and keys of [j0, j1) of a block of K rows ldk bytes apart stored as T
 * (Q8_0 / Q4_0); AVX-512: keys of a 16-key group outside [j0, j1) get 0.
 *
 * AVX-512, keys in lanes: a group's 16 K rows, two blocks (64 values) at a time as unsigned
 * bytes, are transposed so that vector l holds 32-bit lane l of every key; a row's integer
 * dots are then 16 vpdpbusd against broadcasts of its q, with no reduction across lanes,
 * and the transposition is shared by all the rows of the kv head. Lane l of a pair holds
 * block 2p's values for l < 8 (Q8_0) or (l & 4) == 0 (Q4_0: low nibbles, then high). */
#if ATTN_AVX512
/* One row's int8 scores of 16 keys for the block pair p: ia, ib the integer sums of blocks
 * 2p and 2p + 1 (ib unused unless two), dkA / dkB the keys' scales, dqr / cr the row's scales
 * and offsets of the pair; sr[0:16] = the scores so far (p > 0) plus the pair's, 0 outside
 * live */
static inline __attribute__((always_inline)) void attn_q8_scores_put(__m512i ia, __m512i ib, __m512 dkA, __m512 dkB,
                                                                    const float *dqr, const int32_t *cr, int p,
                                                                    int two, __mmask16 live, float *sr) {
    const __m512 iA = _mm512_cvtepi32_ps(_mm512_sub_epi32(ia, _mm512_set1_epi32(cr[0])));
    const __m512 kqA = _mm512_mul_ps(dkA, _mm512_set1_ps(dqr[0]));
    __m512 sv = p == 0 ? _mm512_mul_ps(iA, kqA) : _mm512_fmadd_ps(iA, kqA, _mm512_loadu_ps(sr));
    if (two) {
        const __m512 iB = _mm512_cvtepi32_ps(_mm512_sub_epi32(ib, _mm512_set1_epi32(cr[1])));
        sv = _mm512_fmadd_ps(iB, _mm512_mul_ps(dkB, _mm512_set1_ps(dqr[1])), sv);
    }
    _mm512_storeu_ps(sr, _mm512_maskz_mov_ps(live, sv));
}

/* attn_rows_scores_q8's AVX-512 body for a K of Q8_0 / Q4_0 rows (T, a constant: with T known
 * at run time only, gcc kept the 16 key vectors t[] on the stack and read each dpbusd operand
 * from there: the scores took 2x their in-register time); a tiled Q4_0 K: attn_rows_scores_q4t */
static inline __attribute__((always_inline)) void attn_rows_scores_q8_t(
        const int8_t *qb, int qstride, const float *dq, const int32_t *corr, int R, int D, const uint8_t *k,
        const int T, long ldk, int j0, int j1, float *s, int ldS, const attn_pf *pf) {
    const int nb = D / 32, bb = T == ATTN_KV_Q8_0 ? 34 : 18;
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)ldk));
    const __m512i lowbits = _mm512_set1_epi8(0x0F), sign = _mm512_set1_epi8((char)0x80);
    for (int jb = j0 & ~15; jb < j1; jb += 16) {
        const int a = j0 > jb ? j0 - jb : 0, z = j1 - jb < 16 ? j1 - jb : 16;
        const __mmask16 live = (__mmask16)(((1u << z) - 1u) & ~((1u << a) - 1u));
        for (int u = a; u < z; u++) attn_pf_row(pf, jb + u);
        const uint8_t *kg = k + (long)jb * ldk;  /* the group's first row */
        for (int p = 0; 2 * p < nb; p++) {
            const int two = 2 * p + 1 < nb;
            __m512 t[16];
            if (T == ATTN_KV_Q4_0) {
                /* packed bytes first (32 a key: 8 x 8 transposes in 256-bit halves), the nibbles
                 * after: vector u holds keys k and k + 4 (k = u, u + 4 from u = 4), so that
                 * the halves' 128-bit quarters come out in key order */
                __m512i v[8];
                for (int u = 0; u < 8; u++) {
                    __m256i h[2];
                    for (int e = 0; e < 2; e++) {
                        const int kk = (u < 4 ? u : u + 4) + 4 * e;
                        h[e] = _mm256_setzero_si256();
                        if ((live >> kk) & 1) {
                            const uint8_t *b0 = kg + (long)kk * ldk + (long)(2 * p) * bb + 2;
                            const __m128i x0 = _mm_loadu_si128((const __m128i *)b0);
                            const __m128i x1 = two ? _mm_loadu_si128((const __m128i *)(b0 + bb)) : _mm_setzero_si128();
                            h[e] = _mm256_inserti128_si256(_mm256_castsi128_si256(x0), x1, 1);
                        }
                    }
                    v[u] = _mm512_inserti64x4(_mm512_castsi256_si512(h[0]), h[1], 1);
                }
                __m512i w[8];
                for (int u = 0; u < 8; u += 2) {
                    w[u] = _mm512_unpacklo_epi32(v[u], v[u + 1]);
                    w[u + 1] = _mm512_unpackhi_epi32(v[u], v[u + 1]);
                }
                for (int u = 0; u < 8; u += 4) {
                    v[u] = _mm512_unpacklo_epi64(w[u], w[u + 2]);
                    v[u + 1] = _mm512_unpackhi_epi64(w[u], w[u + 2]);
                    v[u + 2] = _mm512_unpacklo_epi64(w[u + 1], w[u + 3]);
                    v[u + 3] = _mm512_unpackhi_epi64(w[u + 1], w[u + 3]);
                }
                for (int d = 0; d < 4; d++) {  /* packed 32-bit lane d and d + 4 of every key */
                    w[d] = _mm512_shuffle_i32x4(v[d], v[d + 4], 0x88);
                    w[d + 4] = _mm512_shuffle_i32x4(v[d], v[d + 4], 0xdd);
                }
                for (int d = 0; d < 8; d++) {
                    t[d] = _mm512_castsi512_ps(_mm512_and_si512(w[d], lowbits));
                    t[d + 8] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_srli_epi32(w[d], 4), lowbits));
                }
            } else {
            for (int u = 0; u < 16; u++) {
                __m512i x = _mm512_setzero_si512();
                if ((live >> u) & 1) {
                    const uint8_t *b0 = kg + (long)u * ldk + (long)(2 * p) * bb + 2;
                    if (T == ATTN_KV_Q8_0) {
                        const __m256i lo = _mm256_loadu_si256((const __m256i *)b0);
                        const __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(b0 + bb)) : _mm256_setzero_si256();
                        x = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), sign);
                    } else {
                        const __m128i x0 = _mm_loadu_si128((const __m128i *)b0);
                        const __m128i x1 = two ? _mm_loadu_si128((const __m128i *)(b0 + bb)) : _mm_setzero_si128();
                        const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(x0), x1, 1);
                        x = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(y), _mm256_srli_epi16(y, 4), 1),
                                             lowbits);
                    }
                }
                t[u] = _mm512_castsi512_ps(x);
            }
            attn_transpose16(t);
            }
            /* the blocks' f16 scales of the 16 keys (the low half of a 32-bit gather) */
            const __m512 dkA = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offs, kg + (long)(2 * p) * bb, 1)));
            const __m512 dkB = two ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_mask_i32gather_epi32(
                                         _mm512_setzero_si512(), live, offs, kg + (long)(2 * p + 1) * bb, 1)))
                                   : _mm512_setzero_ps();
            for (int r = 0; r < R; r++) {
                const int8_t *qr = qb + (long)r * qstride + 64 * p;
                /* a0, a1: block 2p; b0, b1: block 2p + 1 (two chains each) */
                __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
#define ATTN_Q8_DP(acc, l) acc = attn_dpbusd(acc, _mm512_castps_si512(t[l]), _mm512_set1_epi32(attn_rd32(qr + 4 * (l))))
                if (T == ATTN_KV_Q8_0) {
                    ATTN_Q8_DP(a0, 0); ATTN_Q8_DP(a1, 1); ATTN_Q8_DP(a0, 2); ATTN_Q8_DP(a1, 3);
                    ATTN_Q8_DP(a0, 4); ATTN_Q8_DP(a1, 5); ATTN_Q8_DP(a0, 6); ATTN_Q8_DP(a1, 7);
                    ATTN_Q8_DP(b0, 8); ATTN_Q8_DP(b1, 9); ATTN_Q8_DP(b0, 10); ATTN_Q8_DP(b1, 11);
                    ATTN_Q8_DP(b0, 12); ATTN_Q8_DP(b1, 13); ATTN_Q8_DP(b0, 14); ATTN_Q8_DP(b1, 15);
                } else {
                    ATTN_Q8_DP(a0, 0); ATTN_Q8_DP(a1, 1); ATTN_Q8_DP(a0, 2); ATTN_Q8_DP(a1, 3);
                    ATTN_Q8_DP(b0, 4); ATTN_Q8_DP(b1, 5); ATTN_Q8_DP(b0, 6); ATTN_Q8_DP(b1, 7);
                    ATTN_Q8_DP(a0, 8); ATTN_Q8_DP(a1, 9); ATTN_Q8_DP(a0, 10); ATTN_Q8_DP(a1, 11);
                    ATTN_Q8_DP(b0, 12); ATTN_Q8_DP(b1, 13); ATTN_Q8_DP(b0, 14); ATTN_Q8_DP(b1, 15);
                }
#undef ATTN_Q8_DP
                attn_q8_scores_put(_mm512_add_epi32(a0, a1), _mm512_add_epi32(b0, b1), dkA, dkB,
                                   dq + (long)r * nb + 2 * p, corr + (long)r * nb + 2 * p, p, two, live,
                                   s + (long)r * ldS + jb);
            }
        }
    }
}
#endif

#if ATTN_AVX512
/* a 32-bit word at p (a q row's four bytes), read so that gcc broadcasts it from memory (a
 * load) and not through a general register (a load and a port-5 uop each) */
typedef int32_t attn_i32u __attribute__((may_alias, aligned(1)));
#define ATTN_BCAST32(p) _mm512_set1_epi32(*(const attn_i32u *)(p))

/* attn_rows_scores_q8_t's numbers for a tiled Q4_0 K and RB <= 4 rows: each 16-key group's 8
 * vectors of nibbles loaded once and split as they are used, two chains a block and row
 * (integer sums: any split gives the same ones), the float epilogue in its order. The t[16]
 * form kept the group's 16 key vectors live beside the rows' chains: gcc spilled them and
 * moved q through general registers (13.6 -> 11.5% of a 32-sequence step's samples). */
static inline __attribute__((always_inline)) void attn_q4t_scores_rb(
        const int RB, const int8_t *qb, int qstride, const float *dq, const int32_t *corr, int nb, const uint8_t *kg,
        int p, __mmask16 live, float *s, int ldS) {
    const __m512i lowbits = _mm512_set1_epi8(0x0F);
    const int two = 2 * p + 1 < nb;
    const uint8_t *pk = kg + 32 * nb + 512 * p;
    __m512i A[4][2], B[4][2];
    for (int r = 0; r < RB; r++)
        for (int c = 0; c < 2; c++) A[r][c] = B[r][c] = _mm512_setzero_si512();
    /* vector d < 8 of the tile: nibbles of lane dword d (t[d]: low, t[d + 8]: high); t[l] for
     * l in 0-3 and 8-11 sums block 2p, 4-7 and 12-15 block 2p + 1, chain l & 1 */
#pragma GCC unroll 8
    for (int d = 0; d < 8; d++) {
        if (d >= 4 && !two) break;
        const __m512i wd = _mm512_loadu_si512((const void *)(pk + 64 * d));
        const __m512i lo = _mm512_and_si512(wd, lowbits), hi = _mm512_and_si512(_mm512_srli_epi32(wd, 4), lowbits);
        for (int r = 0; r < RB; r++) {
            const int8_t *qr = qb + (long)r * qstride + 64 * p;
            if (d < 4) {
                A[r][d & 1] = attn_dpbusd(A[r][d & 1], lo, ATTN_BCAST32(qr + 4 * d));
                A[r][d & 1] = attn_dpbusd(A[r][d & 1], hi, ATTN_BCAST32(qr + 4 * (d + 8)));
            } else {
                B[r][d & 1] = attn_dpbusd(B[r][d & 1], lo, ATTN_BCAST32(qr + 4 * d));
                B[r][d & 1] = attn_dpbusd(B[r][d & 1], hi, ATTN_BCAST32(qr + 4 * (d + 8)));
            }
        }
    }
    const __m512 dkA = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kg + 64 * p)));
    const __m512 dkB = two ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kg + 64 * p + 32))) : _mm512_setzero_ps();
    for (int r = 0; r < RB; r++) {
        attn_q8_scores_put(_mm512_add_epi32(A[r][0], A[r][1]), _mm512_add_epi32(B[r][0], B[r][1]), dkA, dkB,
                           dq + (long)r * nb + 2 * p, corr + (long)r * nb + 2 * p, p, two, live, s + (long)r * ldS);
    }
}

/* attn_rows_scores_q8 for a tiled Q4_0 K (ATTN_KV_Q4_0T) */
static void attn_rows_scores_q4t(const int8_t *qb, int qstride, const float *dq, const int32_t *corr, int R, int D,
                                 const uint8_t *k, long ldk, int j0, int j1, float *s, int ldS, const attn_pf *pf) {
    const int nb = D / 32;
    for (int jb = j0 & ~15; jb < j1; jb += 16) {
        const int a = j0 > jb ? j0 - jb : 0, z = j1 - jb < 16 ? j1 - jb : 16;
        const __mmask16 live = (__mmask16)(((1u << z) - 1u) & ~((1u << a) - 1u));
        for (int u = a; u < z; u++) attn_pf_tile_row(pf, jb + u);
        const uint8_t *kg = k + (long)(jb >> 4) * ldk;
        for (int p = 0; 2 * p < nb; p++)
            for (int r = 0; r < R; r += 4) {
                const int8_t *qr = qb + (long)r * qstride;
                const float *dqr = dq + (long)r * nb;
                const int32_t *cr = corr + (long)r * nb;
                float *sr = s + (long)r * ldS + jb;
                switch (R - r) {
                    case 1: attn_q4t_scores_rb(1, qr, qstride, dqr, cr, nb, kg, p, live, sr, ldS); break;
                    case 2: attn_q4t_scores_rb(2, qr, qstride, dqr, cr, nb, kg, p, live, sr, ldS); break;
                    case 3: attn_q4t_scores_rb(3, qr, qstride, dqr, cr, nb, kg, p, live, sr, ldS); break;
                    default: attn_q4t_scores_rb(4, qr, qstride, dqr, cr, nb, kg, p, live, sr, ldS); break;
                }
            }
    }
}
#endif

static void attn_rows_scores_q8(const int8_t *qb, int qstride, const float *dq, const int32_t *corr, int R, int D,
                                const uint8_t *k, int T, long ldk, int j0, int j1, float *s, int ldS,
                                const attn_pf *pf) {
#if ATTN_AVX512
    if (T == ATTN_KV_Q4_0T)
        attn_rows_scores_q4t(qb, qstride, dq, corr, R, D, k, ldk, j0, j1, s, ldS, pf);
    else if (T == ATTN_KV_Q4_0)
        attn_rows_scores_q8_t(qb, qstride, dq, corr, R, D, k, ATTN_KV_Q4_0, ldk, j0, j1, s, ldS, pf);
    else
        attn_rows_scores_q8_t(qb, qstride, dq, corr, R, D, k, ATTN_KV_Q8_0, ldk, j0, j1, s, ldS, pf);
#else
    const int nb = D / 32, bb = T == ATTN_KV_Q8_0 ? 34 : 18;
#if ATTN_AVX2
    for (int r = 0; r < R; r += 4) {
        const int8_t *qr = qb + (long)r * qstride;
        const float *dqr = dq + (long)r * nb;
        const int32_t *cr = corr + (long)r * nb;
        float *sr = s + (long)r * ldS;
        const attn_pf *pfr = r == 0 ? pf : NULL;
#define ATTN_Q8_RB(RB)                                                                                   \
        do {                                                                                             \
            if (T == ATTN_KV_Q4_0T)                                                                      \
                attn_rows_scores_q8_rb(RB, ATTN_KV_Q4_0T, qr, qstride, dqr, cr, D, k, ldk, j0, j1, sr, ldS, pfr); \
            else if (T == ATTN_KV_Q4_0)                                                                  \
                attn_rows_scores_q8_rb(RB, ATTN_KV_Q4_0, qr, qstride, dqr, cr, D, k, ldk, j0, j1, sr, ldS, pfr); \
            else                                                                                         \
                attn_rows_scores_q8_rb(RB, ATTN_KV_Q8_0, qr, qstride, dqr, cr, D, k, ldk, j0, j1, sr, ldS, pfr); \
        } while (0)
        switch (R - r) {
            case 1: ATTN_Q8_RB(1); break;
            case 2: ATTN_Q8_RB(2); break;
            case 3: ATTN_Q8_RB(3); break;
            default: ATTN_Q8_RB(4); break;
        }
#undef ATTN_Q8_RB
    }
    return;
#endif
    (void)corr;
    (void)pf;
    uint8_t kt[18 * 32];  /* (a tiled key's row: head_dim <= 1024) */
    for (int r = 0; r < R; r++) {
        const int8_t *qr = qb + (long)r * qstride;
        for (int j = j0; j < j1; j++) {
            const uint8_t *kr = k + (long)j * ldk;
            if (T == ATTN_KV_Q4_0T) {
                kv_tile_get_q4_0(k + (long)(j >> 4) * ldk, j & 15, kt, nb);
                kr = kt;
            }
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = kr + (long)b * bb;
                const int8_t *qv = qr + 32 * b;
                int32_t I = 0;
                if (T == ATTN_KV_Q8_0) {
                    for (int i = 0; i < 32; i++) I += (int32_t)qv[i] * (int8_t)blk[2 + i];
                } else {
                    for (int i = 0; i < 16; i++)
                        I += (int32_t)qv[i] * ((blk[2 + i] & 15) - 8) + (int32_t)qv[16 + i] * ((blk[2 + i] >> 4) - 8);
                }
                const float kq = simd_load_f16(blk) * dq[(long)r * nb + b];
                acc = b == 0 ? (float)I * kq : fmaf((float)I, kq, acc);
            }
            s[(long)r * ldS + j] = acc;
        }
    }
#endif
}

/* the q rows r0..r0+W-1 of a tile item (NULL past its R rows), each first rounded (and
 * scaled) into rq (W x D) for a quantized K; the register-transpose forms read these */
static inline void attn_tile_qt_rows(const attn_ctx *c, const attn_item *it, int R, int nt, int r0, int W, int q8,
                                     float qscale, float *rq, const float **src) {
    const int D = c->D;
    for (int i = 0; i < W; i++) {
        const int r = r0 + i;
        src[i] = r < R ? c->q + ((long)c->toks[it->tok0 + r % nt] * c->H + it->h0 + r / nt) * D : NULL;
        if (q8 && src[i]) {
            attn_q8_round(src[i], qscale, D, rq + (long)i * D);
            src[i] = rq + (long)i * D;
        }
    }
}

/* Q^T of a tile item: qt[d * ldq + r] = q row r (f16-rounded for an f16 cache) * qscale, 0 in
 * the padding lanes r >= R. AVX-512: 16 x 16 blocks through registers, AVX2: 8 x 8 (a head
 * dim that is not a multiple of the block takes the scalar loop; the same bits). */
static void attn_tile_qt(const attn_ctx *c, const attn_item *it, int R, int nt, int ldq, int r16, float qscale,
                         float *qt) {
    const int D = c->D;
    const int q8 = attn_q8_scores(c->kv_type) && D % 32 == 0;  /* a quantized K: q rounded as the rows kernel rounds it */
#if ATTN_AVX512
    if (D % 16 == 0) {
        const __m512 sc = _mm512_set1_ps(qscale);
        float rq[q8 ? 16 * D + 1 : 1];
        for (int r0 = 0; r0 < ldq; r0 += 16) {
            const float *src[16];
            attn_tile_qt_rows(c, it, R, nt, r0, 16, q8, qscale, rq, src);
            for (int d0 = 0; d0 < D; d0 += 16) {
                __m512 x16[16];
                for (int i = 0; i < 16; i++) {
                    if (!src[i]) { x16[i] = _mm512_setzero_ps(); continue; }
                    __m512 v = _mm512_loadu_ps(src[i] + d0);
                    if (r16) v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                    x16[i] = q8 ? v : _mm512_mul_ps(v, sc);
                }
                attn_transpose16(x16);
                for (int i = 0; i < 16; i++) _mm512_storeu_ps(qt + (long)(d0 + i) * ldq + r0, x16[i]);
            }
        }
        return;
    }
#endif
#if ATTN_AVX2
    if (D % 8 == 0) {
        const __m256 sc = _mm256_set1_ps(qscale);
        float rq[q8 ? 8 * D + 1 : 1];
        for (int r0 = 0; r0 < ldq; r0 += 8) {
            const float *src[8];
            attn_tile_qt_rows(c, it, R, nt, r0, 8, q8, qscale, rq, src);
            for (int d0 = 0; d0 < D; d0 += 8) {
                __m256 x8[8];
                for (int i = 0; i < 8; i++) {
                    if (!src[i]) { x8[i] = _mm256_setzero_ps(); continue; }
                    __m256 v = _mm256_loadu_ps(src[i] + d0);
                    if (r16) v = _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                    x8[i] = q8 ? v : _mm256_mul_ps(v, sc);
                }
                attn_transpose8(x8);
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(qt + (long)(d0 + i) * ldq + r0, x8[i]);
            }
        }
        return;
    }
#endif
    if (q8) {
        float y[D];
        for (int r = 0; r < ldq; r++) {
            if (r < R) {
                const float *src = c->q + ((long)c->toks[it->tok0 + r % nt] * c->H + it->h0 + r / nt) * D;
                attn_q8_round(src, qscale, D, y);
            }
            for (int d = 0; d < D; d++) qt[(long)d * ldq + r] = r < R ? y[d] : 0.0f;
        }
        return;
    }
    for (int r = 0; r < ldq; r++) {
        if (r >= R) {
            for (int d = 0; d < D; d++) qt[(long)d * ldq + r] = 0.0f;
            continue;
        }
        const float *src = c->q + ((long)c->toks[it->tok0 + r % nt] * c->H + it->h0 + r / nt) * D;
        for (int d = 0; d < D; d++) qt[(long)d * ldq + r] = (r16 ? simd_f16_round(src[d]) : src[d]) * qscale;
    }
}

/* A tile item's rows: m = -inf, l = 0, qp the rows' positions (-1 for the padding lanes up
 * to ldq, which see no key); the smallest and largest position and the first key any row sees. */
static inline void attn_tile_rows_init(const attn_ctx *c, const attn_item *it, int R, int nt, int ldq, float *m,
                                       float *l, int32_t *qp, int *min_qp, int *max_qp, int *lo_all) {
    *min_qp = INT_MAX;
    *max_qp = -1;
    *lo_all = INT_MAX;
    for (int r = 0; r < ldq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        if (r >= R) {  /* padding lanes: no query, every key masked */
            qp[r] = -1;
            continue;
        }
        const int t = c->toks[it->tok0 + r % nt];
        qp[r] = c->q_pos[t];
        *min_qp = qp[r] < *min_qp ? qp[r] : *min_qp;
        *max_qp = qp[r] > *max_qp ? qp[r] : *max_qp;
        const int lo = attn_key_lo(qp[r], c->window);
        *lo_all = lo < *lo_all ? lo : *lo_all;
    }
}

/* The next block of a tile item (after block b; none past its range or where freed), asked
 * for along this one's P.V (tiles: the block's bytes in order, a row's worth a key: all kv
 * heads' tiles) */
static inline attn_pf_pace attn_tile_next_block(const attn_ctx *c, const attn_item *it, const int32_t *table, int b,
                                                int kvh) {
    const long ks = (long)c->KVH * c->k_row, vs = (long)c->KVH * c->v_row;
    attn_pf_pace pace = {{NULL, ks, c->k_row}, {NULL, vs, c->v_row}, 0, 0, 0};
    if (b + 1 < it->b1 && table[b + 1] >= 0) {
        pace.k.p = c->k + table[b + 1] * c->k_bstride + (c->k_tiled ? 0 : (long)kvh * c->k_row);
        if (c->k_tiled) pace.k.bytes = (int)ks;
        pace.v.p = c->v + table[b + 1] * c->v_bstride + (long)kvh * c->v_row;
        pace.rows = c->bs;
    }
    return pace;
}

/* Block b of a tile item (first key at k0 = b * bs): the keys [*jlo, *jhi] its rows (positions
 * up to max_qp, none before lo_all) see; 0 where none */
static inline int attn_tile_block_keys(int lo_all, int max_qp, int k0, int bs, int *jlo, int *jhi) {
    *jlo = lo_all - k0 > 0 ? lo_all - k0 : 0;
    *jhi = max_qp - k0 < bs - 1 ? max_qp - k0 : bs - 1;
    return *jhi >= *jlo;
}

/* Keys [jlo, jhi] of kv head kvh in block blk as f32 rows: an f32 K in place, any other (f16,
 * Q8_0, Q4_0 rows or tiles) converted into kf (bs x D); *ldk their stride in floats */
static inline const float *attn_tile_block_k(const attn_ctx *c, int blk, int kvh, int jlo, int jhi, float *kf,
                                             long *ldk) {
    const long ks = (long)c->KVH * c->k_row;
    const uint8_t *kb = c->k + blk * c->k_bstride + (long)kvh * c->k_row;
    if (c->kv_type == ATTN_KV_F32) {
        *ldk = ks / 4;
        return (const float *)(kb + jlo * ks);
    }
    if (c->k_tiled)
        kv_tile_load_rows_q4_0(c->k + blk * c->k_bstride, jlo, jhi + 1, kvh, c->KVH, c->D / 32, kf, c->D);
    else
        attn_load_rows(kb, ks, c->kv_type, jlo, jhi + 1, c->D, kf, c->D);
    *ldk = c->D;
    return kf + (long)jlo * c->D;
}

static void attn_tile_item(const attn_ctx *c, const attn_item *it, float *buf) {
    const int D = c->D, Dv = c->Dv, bs = c->bs, KVH = c->KVH, kvh = it->h0 / c->G;
    const int nt = it->tok1 - it->tok0, R = nt * (it->h1 - it->h0);
    const int nv = (R + 15) / 16, ldq = 16 * nv;
    float *qt = buf;                                  /* D x ldq */
    float *o = qt + (long)ATTN_MAX_ROWS * D;          /* R x Dv */
    float *kf = o + (long)ATTN_MAX_ROWS * Dv;         /* bs x D */
    float *vf = kf + (long)bs * D;                    /* bs x Dv */
    float *st = vf + (long)bs * Dv;                   /* bs x ldq */
    float *m = st + (long)bs * ATTN_MAX_ROWS;
    float *l = m + ATTN_MAX_ROWS, *alpha = l + ATTN_MAX_ROWS;
    int32_t *qp = (int32_t *)(alpha + ATTN_MAX_ROWS);
    float *bmax = (float *)(qp + ATTN_MAX_ROWS);
    const int r16 = c->kv_type == ATTN_KV_F16;
    const float qscale = c->scale * ATTN_LOG2E, cap = c->softcap * ATTN_LOG2E;  /* log2 units */
    int min_qp, max_qp, lo_all;
    attn_tile_rows_init(c, it, R, nt, ldq, m, l, qp, &min_qp, &max_qp, &lo_all);
    attn_tile_qt(c, it, R, nt, ldq, r16, qscale, qt);
    memset(o, 0, (size_t)R * Dv * sizeof(float));
    const int32_t *table = c->tables + (long)it->seq * c->max_blocks;
    const long vs = (long)KVH * c->v_row;
    for (int b = it->b0; b < it->b1; b++) {
        const int blk = table[b];
        if (blk < 0) continue;  /* freed (outside every window): never read */
        const int k0 = b * bs;
        int jlo, jhi;
        if (!attn_tile_block_keys(lo_all, max_qp, k0, bs, &jlo, &jhi)) continue;
        const int nk = jhi - jlo + 1;
        const uint8_t *vb = c->v + blk * c->v_bstride + (long)kvh * c->v_row;
        long ldk;
        const float *kp = attn_tile_block_k(c, blk, kvh, jlo, jhi, kf, &ldk);
        /* V: an f32 one in place; others converted after the softmax (below) */
        const float *vp = c->kv_type == ATTN_KV_F32 ? (const float *)(vb + jlo * vs) : NULL;
        const long ldv = c->kv_type == ATTN_KV_F32 ? vs / 4 : Dv;
        const int need_mask = !(k0 + jhi <= min_qp && (c->window <= 0 || max_qp - (k0 + jlo) < c->window));
        const int fold_max = !need_mask && cap <= 0.0f;
        attn_tile_scores(qt, ldq, nv, R, kp, ldk, nk, D, st, fold_max ? bmax : NULL);
        attn_pf_pace pace = attn_tile_next_block(c, it, table, b, kvh);
        attn_tile_softmax(st, ldq, nv, R, nk, need_mask, qp, k0 + jlo, c->window, cap, m, l, alpha,
                          fold_max ? bmax : NULL, 0.0f);
#if ATTN_AVX2
        if (c->kv_type == ATTN_KV_F16 && Dv % 8 == 0) {  /* V converted in the P.V loop */
            attn_tile_pv_f16(o, Dv, R, st, ldq, (const uint16_t *)(vb + jlo * vs), vs / 2, nk, alpha, &pace);
            continue;
        }
#endif
        if (c->kv_type != ATTN_KV_F32) {
            attn_load_rows(vb, vs, c->kv_type, jlo, jhi + 1, Dv, vf, Dv);
            vp = vf + (long)jlo * Dv;
        }
        attn_tile_pv(o, Dv, R, st, ldq, vp, ldv, nk, alpha, &pace);
    }
    for (int r = 0; r < R; r++)
        attn_emit(c, c->toks[it->tok0 + r % nt], it->h0 + r / nt, o + (long)r * Dv, m[r], l[r], it->chunk);
}

/* ---- rows kernel: keys in lanes ------------------------------------------------------------ */

/* (the AVX-512 and AVX2 rows kernels dispatch through these) */
#define ATTN_RB_SWITCH_T(fn, n, T, ...)                         \
    do {                                                         \
        switch (n) {                                             \
            case 1: fn(1, T, __VA_ARGS__); break;                \
            case 2: fn(2, T, __VA_ARGS__); break;                \
            case 3: fn(3, T, __VA_ARGS__); break;                \
            default: fn(4, T, __VA_ARGS__); break;               \
        }                                                        \
    } while (0)

/* fn(RB, T, ...) for RB = min(n, 4) rows and storage type t (ATTN_KV_*) */
#define ATTN_RB_SWITCH(fn, n, t, ...)                                                  \
    do {                                                                               \
        switch (t) {                                                                   \
            case ATTN_KV_F16: ATTN_RB_SWITCH_T(fn, n, ATTN_KV_F16, __VA_ARGS__); break;   \
            case ATTN_KV_Q8_0: ATTN_RB_SWITCH_T(fn, n, ATTN_KV_Q8_0, __VA_ARGS__); break; \
            case ATTN_KV_Q4_0: ATTN_RB_SWITCH_T(fn, n, ATTN_KV_Q4_0, __VA_ARGS__); break; \
            default: ATTN_RB_SWITCH_T(fn, n, ATTN_KV_F32, __VA_ARGS__); break;            \
        }                                                                              \
    } while (0)

/* fn(RB, T, ...) for an f16 or f32 storage type t (the AVX2 rows kernels' float K/V) */
#define ATTN_RB_SWITCH_FLOAT(fn, n, t, ...)                               \
    do {                                                                  \
        if ((t) == ATTN_KV_F16) ATTN_RB_SWITCH_T(fn, n, ATTN_KV_F16, __VA_ARGS__); \
        else ATTN_RB_SWITCH_T(fn, n, ATTN_KV_F32, __VA_ARGS__);          \
    } while (0)


#if ATTN_AVX512
/* 16 values e.. of K/V row j, stored as T (ATTN_KV_*: f32 and f16 rows ld elements apart;
 * Q8_0 / Q4_0 rows ld bytes apart, e a multiple of 16): f32 values, a quantized value as
 * d * q, one rounding, the bits kv_dequant_* gives (rows read in place, converted or not,
 * sum the same numbers). */
static inline __m512 attn_scale16(const uint8_t *b) {  /* a block's f16 scale in 16 lanes */
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)simd_rd16(b)));
}

static inline __m512 attn_kvec(const void *k, const int T, long j, long ld, int e, __mmask16 msk) {
    if (T == ATTN_KV_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(msk, (const uint16_t *)k + j * ld + e));
    if (T == ATTN_KV_Q8_0) {
        const uint8_t *b = (const uint8_t *)k + j * ld + (e >> 5) * 34;
        const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + (e & 31))));
        return _mm512_mul_ps(attn_scale16(b), _mm512_cvtepi32_ps(q));
    }
    if (T == ATTN_KV_Q4_0) {
        /* nibble n -> (float)(n - 8) by a permute (it reads the low 4 bits of each index) */
        const __m512 lut = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
        const uint8_t *b = (const uint8_t *)k + j * ld + (e >> 5) * 18;
        __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
        if (e & 16) q = _mm512_srli_epi32(q, 4);
        return _mm512_mul_ps(attn_scale16(b), _mm512_permutexvar_ps(q, lut));
    }
    return _mm512_maskz_loadu_ps(msk, (const float *)k + j * ld + e);
}

/* s[r*ldS + j] = q_r . k_j for r < RB and keys j of [j0, j1) (16-key groups from j0 & ~15;
 * keys of a group outside [j0, j1) get 0). Each score: one fma chain over d, reduced by
 * simd_hsum16x16, so it depends on its row and key only. ND > 0: D == 16 * ND, the rows'
 * q held in registers; ND == 0: any D (masked tail). */
static inline __attribute__((always_inline)) void attn_rows_scores_nd(
        const int RB, const int T, const int ND, const float *q, int D, const void *k, long ldk, int j0, int j1,
        float *s, int ldS, const attn_pf *pf) {
    __m512 qv[4][4];
    if (ND > 0)
        for (int r = 0; r < RB; r++)
            for (int i = 0; i < ND; i++) qv[r][i] = _mm512_loadu_ps(q + (long)r * D + 16 * i);
    /* keys per pass: independent fma chains enough to cover the fma latency, in registers */
    const int KG = ND == 0 ? 1 : RB <= 2 ? 4 : RB == 3 ? 3 : 2;
    for (int jb = j0 & ~15; jb < j1; jb += 16) {
        __m512 tmp[4][16];
        if (ND > 0 && jb >= j0 && jb + 16 <= j1) {
            /* a whole group of keys (most of them): the loop below's sums, unrolled, with no
             * per-key range tests (they cost as much as the key's arithmetic), the keys in
             * simd_hsum16x16's groups (e, e+4, e+8, e+12), each group reduced as soon as its
             * chains end: the same additions in the same order as the sixteen kept to the
             * end, without storing them (they spilled: a third of the scores' time) */
            __m512 grp[4][4];
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++) {
                if (pf)
                    for (int u = 0; u < 4; u++) attn_pf_row(pf, jb + e + 4 * u);
                __m512 a[4][4];
                for (int u = 0; u < 4; u++)
                    for (int r = 0; r < RB; r++) a[u][r] = _mm512_setzero_ps();
                for (int i = 0; i < ND; i++)
                    for (int u = 0; u < 4; u++) {
                        const __m512 kv = attn_kvec(k, T, jb + e + 4 * u, ldk, 16 * i, (__mmask16)0xFFFF);
                        for (int r = 0; r < RB; r++) a[u][r] = _mm512_fmadd_ps(qv[r][i], kv, a[u][r]);
                    }
                for (int r = 0; r < RB; r++) grp[r][e] = simd_hsum16x16_group(a[0][r], a[1][r], a[2][r], a[3][r]);
            }
            for (int r = 0; r < RB; r++) _mm512_storeu_ps(s + (long)r * ldS + jb, simd_hsum16x16_tail(grp[r]));
            continue;
        }
        for (int jj = 0; jj < 16; jj += KG) {
            for (int u = 0; u < KG && jj + u < 16; u++)
                if (jb + jj + u >= j0 && jb + jj + u < j1) attn_pf_row(pf, jb + jj + u);
            if (ND > 0) {
                __m512 a[4][4];
                for (int u = 0; u < KG; u++)
                    for (int r = 0; r < RB; r++) a[u][r] = _mm512_setzero_ps();
                for (int i = 0; i < ND; i++)
                    for (int u = 0; u < KG; u++) {
                        const int j = jb + jj + u;
                        if (jj + u < 16 && j >= j0 && j < j1) {
                            const __m512 kv = attn_kvec(k, T, j, ldk, 16 * i, (__mmask16)0xFFFF);
                            for (int r = 0; r < RB; r++) a[u][r] = _mm512_fmadd_ps(qv[r][i], kv, a[u][r]);
                        }
                    }
                for (int u = 0; u < KG && jj + u < 16; u++) {
                    const int slot = 4 * ((jj + u) & 3) + ((jj + u) >> 2);  /* simd_hsum16x16's order */
                    for (int r = 0; r < RB; r++) tmp[r][slot] = a[u][r];
                }
                continue;
            }
            const int j = jb + jj, slot = 4 * (jj & 3) + (jj >> 2);  /* simd_hsum16x16's order */
            __m512 a[4];
            for (int r = 0; r < RB; r++) a[r] = _mm512_setzero_ps();
            if (j >= j0 && j < j1) {
                {
                    for (int d = 0; d < D; d += 16) {
                        const __mmask16 msk = simd_mask16(D - d);
                        const __m512 kv = attn_kvec(k, T, j, ldk, d, msk);
                        for (int r = 0; r < RB; r++)
                            a[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(msk, q + (long)r * D + d), kv, a[r]);
                    }
                }
            }
            for (int r = 0; r < RB; r++) tmp[r][slot] = a[r];
        }
        for (int r = 0; r < RB; r++) _mm512_storeu_ps(s + (long)r * ldS + jb, simd_hsum16x16(tmp[r]));
    }
}

/* The same scores for a long head (D a multiple of 32 above 64: 96, 128, 256): q read from
 * L1 by each fma, KG keys a pass, each score one fma chain over d in order (the bits of
 * attn_rows_scores_nd), the head walked 32 values (a quantized block) at a time. Keys of a
 * group outside [j0, j1) get 0. */
static inline __attribute__((always_inline)) void attn_rows_scores_long(
        const int RB, const int T, const float *q, int D, const void *k, long ldk, int j0, int j1,
        float *s, int ldS, const attn_pf *pf) {
    const int KG = RB <= 2 ? 4 : RB == 3 ? 3 : 2;
    /* bytes of a row step and of 32 values */
    const long rstep = T == ATTN_KV_F16 ? 2 * ldk : T == ATTN_KV_F32 ? 4 * ldk : ldk;
    const int b32 = T == ATTN_KV_F16 ? 64 : T == ATTN_KV_F32 ? 128 : T == ATTN_KV_Q8_0 ? 34 : 18;
    for (int jb = j0 & ~15; jb < j1; jb += 16) {
        __m512 tmp[4][16];
        for (int jj = 0; jj < 16; jj += KG) {
            const uint8_t *kr[4];
            int live[4];
            for (int u = 0; u < KG; u++) {
                const int j = jb + jj + u;
                live[u] = jj + u < 16 && j >= j0 && j < j1;
                if (live[u]) attn_pf_row(pf, j);
                kr[u] = (const uint8_t *)k + (live[u] ? j : j0) * rstep;  /* a dead key reads a live row */
            }
            __m512 a[4][4];
            for (int u = 0; u < KG; u++)
                for (int r = 0; r < RB; r++) a[u][r] = _mm512_setzero_ps();
            for (int e = 0; e < D; e += 32, q += 32) {
                for (int h = 0; h < 2; h++)
                    for (int u = 0; u < KG; u++) {
                        const __m512 kv = attn_kvec(kr[u], T, 0, 0, 16 * h, (__mmask16)0xFFFF);
                        for (int r = 0; r < RB; r++)
                            a[u][r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + (long)r * D + 16 * h), kv, a[u][r]);
                    }
                for (int u = 0; u < KG; u++) kr[u] += b32;
            }
            q -= D;
            for (int u = 0; u < KG && jj + u < 16; u++) {
                const int slot = 4 * ((jj + u) & 3) + ((jj + u) >> 2);  /* simd_hsum16x16's order */
                for (int r = 0; r < RB; r++) tmp[r][slot] = live[u] ? a[u][r] : _mm512_setzero_ps();
            }
        }
        for (int r = 0; r < RB; r++) _mm512_storeu_ps(s + (long)r * ldS + jb, simd_hsum16x16(tmp[r]));
    }
}

static inline __attribute__((always_inline)) void attn_rows_scores_rb(
        const int RB, const int T, const float *q, int D, const void *k, long ldk, int j0, int j1,
        float *s, int ldS, const attn_pf *pf) {
    switch (D) {  /* the common head dims with q in registers (same sums as the loop) */
        case 64: attn_rows_scores_nd(RB, T, 4, q, D, k, ldk, j0, j1, s, ldS, pf); break;
        case 32: attn_rows_scores_nd(RB, T, 2, q, D, k, ldk, j0, j1, s, ldS, pf); break;
        default:
            if (D % 32 == 0) attn_rows_scores_long(RB, T, q, D, k, ldk, j0, j1, s, ldS, pf);
            else attn_rows_scores_nd(RB, T, 0, q, D, k, ldk, j0, j1, s, ldS, pf);
            break;
    }
}

/* o[r*Dv + c] = o * alpha[r] + sum_{j0 <= j < j1} p[r*ldS + j] v_j[c] for r < RB, over NV
 * vectors of values from c0 (the last masked by kl) */
/* (A/B) 0: a Q4_0 V's block scales converted key by key inside the P.V loop */
static int attn_pv_scales_first = 1;
static inline int attn_set_pv_scales_first(int on) { const int old = attn_pv_scales_first; attn_pv_scales_first = on; return old; }

/* the f16 scales of V rows [j0, j1) (Q4_0 / Q8_0 blocks ldv bytes apart; the scale at x + j * ldv) as
 * floats d[j - j0], 16 rows a gather (the P.V loop then multiplies its table by a float
 * from L1: one instruction a block, not a scalar load, a conversion and a broadcast) */
static inline void attn_block_scales(const uint8_t *x, long ldv, int j0, int j1, float *d) {
    const __m512i off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)ldv));
    for (int jb = j0; jb < j1; jb += 16) {
        const int n = j1 - jb < 16 ? j1 - jb : 16;
        const __mmask16 live = (__mmask16)((1u << n) - 1u);
        const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, off, x + (long)jb * ldv, 1);
        _mm512_storeu_ps(d + (jb - j0), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
    }
}

static inline __attribute__((always_inline)) void attn_rows_pv_rb(
        const int RB, const int T, const int NV, float *o, int Dv, const float *p, int ldS, const void *v, long ldv,
        int c0, int j0, int j1, const float *alpha, __mmask16 kl, const attn_pf *pf) {
    __m512 acc[4][4];
    /* (Q4_0, Q8_0) the blocks' scales as floats, d[i / 2][j - j0] for the block of values
     * c0 + 16 i */
    __attribute__((aligned(64))) float dq[2][ATTN_MAX_BS + 16];
    const int bbytes = T == ATTN_KV_Q8_0 ? 34 : 18;
    const int scales_first = (T == ATTN_KV_Q4_0 || T == ATTN_KV_Q8_0) && attn_pv_scales_first && j1 - j0 <= ATTN_MAX_BS;
    if (scales_first)
        for (int i = 0; i < NV; i += 2)
            attn_block_scales((const uint8_t *)v + ((c0 + 16 * i) >> 5) * bbytes, ldv, j0, j1, dq[i / 2]);
    __mmask16 km[4];
    for (int i = 0; i < NV; i++) km[i] = i == NV - 1 ? kl : (__mmask16)0xFFFF;
    for (int r = 0; r < RB; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int i = 0; i < NV; i++)
            acc[r][i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(km[i], o + (long)r * Dv + c0 + 16 * i), a);
    }
    for (int j = j0; j < j1; j++) {
        attn_pf_row(pf, j);
        __m512 vv[4];
        if (T == ATTN_KV_Q4_0) {
            /* attn_kvec's values a block at a time (c0 is a multiple of 64, Dv of 32): its
             * bytes loaded once for both halves, the same bits */
            for (int i = 0; i < NV; i += 2) {
                const uint8_t *xb = (const uint8_t *)v + j * ldv + ((c0 + 16 * i) >> 5) * 18;
                if (scales_first) kv_q4_0_block_d(xb, dq[i / 2][j - j0], &vv[i], &vv[i + 1]);
                else kv_q4_0_block(xb, &vv[i], &vv[i + 1]);
            }
        } else if (T == ATTN_KV_Q8_0 && scales_first) {  /* attn_kvec's values, the scale from dq */
            for (int i = 0; i < NV; i++) {
                const uint8_t *b = (const uint8_t *)v + j * ldv + ((c0 + 16 * i) >> 5) * 34 + 2 + ((c0 + 16 * i) & 31);
                vv[i] = _mm512_mul_ps(_mm512_set1_ps(dq[i / 2][j - j0]),
                                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b))));
            }
        } else
            for (int i = 0; i < NV; i++) vv[i] = attn_kvec(v, T, j, ldv, c0 + 16 * i, km[i]);
        for (int r = 0; r < RB; r++) {
            const __m512 pb = _mm512_set1_ps(p[(long)r * ldS + j]);
            for (int i = 0; i < NV; i++) acc[r][i] = _mm512_fmadd_ps(pb, vv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NV; i++) _mm512_mask_storeu_ps(o + (long)r * Dv + c0 + 16 * i, km[i], acc[r][i]);
}

#define ATTN_ROWS_PV(RB, T, nv, ...)                                   \
    do {                                                                 \
        switch (nv) {                                                    \
            case 1: attn_rows_pv_rb(RB, T, 1, __VA_ARGS__); break;     \
            case 2: attn_rows_pv_rb(RB, T, 2, __VA_ARGS__); break;     \
            case 3: attn_rows_pv_rb(RB, T, 3, __VA_ARGS__); break;     \
            default: attn_rows_pv_rb(RB, T, 4, __VA_ARGS__); break;    \
        }                                                                \
    } while (0)

/* RB rows: every 64-value chunk of the outputs */
static inline __attribute__((always_inline)) void attn_rows_pv_all(
        const int RB, const int T, float *o, int Dv, const float *p, int ldS, const void *v, long ldv,
        int j0, int j1, const float *alpha, const attn_pf *pf) {
    for (int c0 = 0; c0 < Dv; c0 += 64) {
        const int w = Dv - c0 < 64 ? Dv - c0 : 64, nv = (w + 15) / 16;
        const __mmask16 kl = simd_mask16(w - 16 * (nv - 1));
        ATTN_ROWS_PV(RB, T, nv, o, Dv, p, ldS, v, ldv, c0, j0, j1, alpha, kl, c0 == 0 ? pf : NULL);
    }
}
#else
static inline int attn_set_pv_scales_first(int on) { (void)on; return 0; }
#endif

#if ATTN_AVX2
/* many rows of an f32 (converted) K / V go in groups of 5 (15 rows, a verify of 4: groups
 * of 4 and 6 were 1.12x and 1.03x the P.V's time with 5) */
#define ATTN_ROWS_GROUP 5
/* a[r], c[r] += the fma chains of q_r . k_ja and q_r . k_jc, r < RB: two keys a pass, each q
 * vector loaded once for both (gcc folds a vector loaded once into each fma that uses it
 * unless an empty asm pins it in a register) */
static inline __attribute__((always_inline)) void attn_rows_pass2(
        const int RB, const int T, const float *q, const int D, const void *k, long ja, long jc, long ldk,
        __m256 *a, __m256 *c) {
#pragma GCC unroll 8
    for (int d = 0; d < D; d += 8) {
        const __m256 ka = attn_kvec8(k, T, ja, ldk, d), kc = attn_kvec8(k, T, jc, ldk, d);
        for (int r = 0; r < RB; r++) {
            __m256 qv = _mm256_loadu_ps(q + (long)r * D + d);
            __asm__("" : "+x"(qv));
            a[r] = _mm256_fmadd_ps(qv, ka, a[r]);
            c[r] = _mm256_fmadd_ps(qv, kc, c[r]);
        }
    }
}

/* x[r] += the 8 lanes of the fma chain of q_r . k_j, r < RB (one key: a pass's or a group's edge) */
static inline __attribute__((always_inline)) void attn_rows_chain1(
        const int RB, const int T, const float *q, const int D, const void *k, long j, long ldk, __m256 *x) {
    for (int d = 0; d < D; d += 8) {
        const __m256 kv = attn_kvec8(k, T, j, ldk, d);
        for (int r = 0; r < RB; r++) x[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (long)r * D + d), kv, x[r]);
    }
}

/* s[r*ldS + j] = q_r . k_j, r < RB, keys of [j0, j1) of an f32 / f16 K (8-key groups from
 * j0 & ~7; keys of a group outside the range get 0): one fma chain a score over d, reduced
 * by attn_hsum8x8, so a score depends on its row and key only. Two keys a pass: the chains
 * of one key (RB of them) were latency-bound (an fma's latency per 8 values of d), two keys'
 * interleaved chains share each q load (the same chains, so the same bits). */
static inline __attribute__((always_inline)) void attn_rows_scores8_rb_d(
        const int RB, const int T, const float *q, const int D, const void *k, long ldk, int j0, int j1,
        float *s, int ldS, const attn_pf *pf) {
    for (int jb = j0 & ~7; jb < j1; jb += 8) {
        __m256 tmp[4][8];
        for (int u = 0; u < 8; u += 2) {
            const int ja = jb + u, jc = ja + 1;
            const int la = ja >= j0 && ja < j1, lc = jc >= j0 && jc < j1;
            __m256 a[4], c[4];
            for (int r = 0; r < RB; r++) a[r] = c[r] = _mm256_setzero_ps();
            if (la) attn_pf_row(pf, ja);
            if (lc) attn_pf_row(pf, jc);
            if (la && lc) {
                attn_rows_pass2(RB, T, q, D, k, ja, jc, ldk, a, c);
            } else if (la || lc) {
                attn_rows_chain1(RB, T, q, D, k, la ? ja : jc, ldk, la ? a : c);
            }
            for (int r = 0; r < RB; r++) {
                tmp[r][u] = a[r];
                tmp[r][u + 1] = c[r];
            }
        }
        for (int r = 0; r < RB; r++) _mm256_storeu_ps(s + (long)r * ldS + jb, attn_hsum8x8(tmp[r]));
    }
}

/* attn_rows_scores8_rb_d's numbers for RB <= 3 rows of an f32 K, 4 keys at a time with the
 * keys read by each fma from L1: 12 fma chains in flight, not 8 (its 2 keys x 4 rows left
 * no slack over the fma latency); the same chains and the same tree, so the same bits */
static inline __attribute__((always_inline)) void attn_rows_scores8_k4_d(
        const int RB, const float *q, const int D, const float *k, long ldk, int j0, int j1, float *s, int ldS,
        const attn_pf *pf) {
    for (int jb = j0 & ~7; jb < j1; jb += 8) {
        __m256 tmp[3][8];
        for (int u = 0; u < 8; u += 4) {
            const int j = jb + u;
            if (j >= j0 && j + 4 <= j1) {
                for (int e = 0; e < 4; e++) attn_pf_row(pf, j + e);
                __m256 a[3][4];
                for (int r = 0; r < RB; r++)
                    for (int e = 0; e < 4; e++) a[r][e] = _mm256_setzero_ps();
                const float *kj = k + (long)j * ldk;
                for (int d = 0; d < D; d += 8)
                    for (int r = 0; r < RB; r++) {
                        const __m256 qv = _mm256_loadu_ps(q + (long)r * D + d);
                        for (int e = 0; e < 4; e++)
                            a[r][e] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kj + (long)e * ldk + d), a[r][e]);
                    }
                for (int r = 0; r < RB; r++)
                    for (int e = 0; e < 4; e++) tmp[r][u + e] = a[r][e];
                continue;
            }
            for (int e = 0; e < 4; e++) {  /* a group's edge: key by key, zeros outside [j0, j1) */
                __m256 a[3];
                for (int r = 0; r < RB; r++) a[r] = _mm256_setzero_ps();
                if (j + e >= j0 && j + e < j1) {
                    attn_pf_row(pf, j + e);
                    attn_rows_chain1(RB, ATTN_KV_F32, q, D, k, j + e, ldk, a);
                }
                for (int r = 0; r < RB; r++) tmp[r][u + e] = a[r];
            }
        }
        for (int r = 0; r < RB; r++) _mm256_storeu_ps(s + (long)r * ldS + jb, attn_hsum8x8(tmp[r]));
    }
}

/* attn_rows_scores8_rb_d's numbers for 4 <= RB <= 5 rows of an f32 K, 2 keys a pass with
 * both in registers and each q vector loaded once for both (2 + RB loads a 2 RB fmas; 3 rows
 * x 4 keys read 15 for 12); each pass's two keys go through the tree's first level at once
 * (the same hadd of the same chains: the same bits). attn_rows_scores8_rb_d taking 5 rows
 * instead (8 keys' chains kept for one attn_hsum8x8) cost a verify 1.06-1.09x the time. */
static inline __attribute__((always_inline)) void attn_rows_scores8_k2_d(
        const int RB, const float *q, const int D, const float *k, long ldk, int j0, int j1, float *s, int ldS,
        const attn_pf *pf) {
    for (int jb = j0 & ~7; jb < j1; jb += 8) {
        __m256 t[5][4];
        for (int u = 0; u < 8; u += 2) {
            const int ja = jb + u, jc = ja + 1;
            const int la = ja >= j0 && ja < j1, lc = jc >= j0 && jc < j1;
            __m256 a[5], c[5];
            for (int r = 0; r < RB; r++) a[r] = c[r] = _mm256_setzero_ps();
            if (la && lc) {
                attn_pf_row(pf, ja);
                attn_pf_row(pf, jc);
                attn_rows_pass2(RB, ATTN_KV_F32, q, D, k, ja, jc, ldk, a, c);
            } else if (la || lc) {
                attn_pf_row(pf, la ? ja : jc);
                attn_rows_chain1(RB, ATTN_KV_F32, q, D, k, la ? ja : jc, ldk, la ? a : c);
            }
            for (int r = 0; r < RB; r++) t[r][u / 2] = _mm256_hadd_ps(a[r], c[r]);
        }
        for (int r = 0; r < RB; r++)
            _mm256_storeu_ps(s + (long)r * ldS + jb, attn_hsum8x8_pairs(t[r][0], t[r][1], t[r][2], t[r][3]));
    }
}

static inline __attribute__((always_inline)) void attn_rows_scores8_k2(
        const int RB, const float *q, int D, const float *k, long ldk, int j0, int j1, float *s, int ldS,
        const attn_pf *pf) {
    switch (D) {
        case 64: attn_rows_scores8_k2_d(RB, q, 64, k, ldk, j0, j1, s, ldS, pf); break;
        case 128: attn_rows_scores8_k2_d(RB, q, 128, k, ldk, j0, j1, s, ldS, pf); break;
        case 256: attn_rows_scores8_k2_d(RB, q, 256, k, ldk, j0, j1, s, ldS, pf); break;
        default: attn_rows_scores8_k2_d(RB, q, D, k, ldk, j0, j1, s, ldS, pf); break;
    }
}

static inline __attribute__((always_inline)) void attn_rows_scores8_k4(
        const int RB, const float *q, int D, const float *k, long ldk, int j0, int j1, float *s, int ldS,
        const attn_pf *pf) {
    switch (D) {
        case 64: attn_rows_scores8_k4_d(RB, q, 64, k, ldk, j0, j1, s, ldS, pf); break;
        case 128: attn_rows_scores8_k4_d(RB, q, 128, k, ldk, j0, j1, s, ldS, pf); break;
        case 256: attn_rows_scores8_k4_d(RB, q, 256, k, ldk, j0, j1, s, ldS, pf); break;
        default: attn_rows_scores8_k4_d(RB, q, D, k, ldk, j0, j1, s, ldS, pf); break;
    }
}

/* the common head dims as constants (the d loop unrolled) */
static inline __attribute__((always_inline)) void attn_rows_scores8_rb(
        const int RB, const int T, const float *q, int D, const void *k, long ldk, int j0, int j1,
        float *s, int ldS, const attn_pf *pf) {
    switch (D) {
        case 64: attn_rows_scores8_rb_d(RB, T, q, 64, k, ldk, j0, j1, s, ldS, pf); break;
        case 128: attn_rows_scores8_rb_d(RB, T, q, 128, k, ldk, j0, j1, s, ldS, pf); break;
        case 256: attn_rows_scores8_rb_d(RB, T, q, 256, k, ldk, j0, j1, s, ldS, pf); break;
        default: attn_rows_scores8_rb_d(RB, T, q, D, k, ldk, j0, j1, s, ldS, pf); break;
    }
}

/* o[r*Dv + c] = o * alpha[r] + sum_{j0 <= j < j1} p[r*ldS + j] v_j[c], r < RB, NV vectors of
 * values from c0, V f32 / f16 */
static inline __attribute__((always_inline)) void attn_rows_pv8_rb(
        const int RB, const int T, const int NV, float *o, int Dv, const float *p, int ldS, const void *v, long ldv,
        int c0, int j0, int j1, const float *alpha, const attn_pf *pf) {
    __m256 acc[5][4];
    for (int r = 0; r < RB; r++) {
        const __m256 a = _mm256_set1_ps(alpha[r]);
        for (int i = 0; i < NV; i++) acc[r][i] = _mm256_mul_ps(_mm256_loadu_ps(o + (long)r * Dv + c0 + 8 * i), a);
    }
    for (int j = j0; j < j1; j++) {
        attn_pf_row(pf, j);
        if (T == ATTN_KV_F32 && RB * NV > 8 && NV == 4) {  /* values read by each fma from L1: 12 accumulators fit */
            const float *vj = (const float *)v + (long)j * ldv + c0;
            for (int r = 0; r < RB; r++) {
                const __m256 pb = _mm256_broadcast_ss(p + (long)r * ldS + j);
                for (int i = 0; i < NV; i++) acc[r][i] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vj + 8 * i), acc[r][i]);
            }
            continue;
        }
        __m256 vv[4];
        for (int i = 0; i < NV; i++) vv[i] = attn_kvec8(v, T, j, ldv, c0 + 8 * i);
        for (int r = 0; r < RB; r++) {
            const __m256 pb = _mm256_broadcast_ss(p + (long)r * ldS + j);
            for (int i = 0; i < NV; i++) acc[r][i] = _mm256_fmadd_ps(pb, vv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NV; i++) _mm256_storeu_ps(o + (long)r * Dv + c0 + 8 * i, acc[r][i]);
}

/* RB rows, every value: 32 a pass for one or two rows (three from f32 values), 24 for three
 * rows of f16 values (9 fma chains: 6 left each key waiting on an fma's latency) and for four
 * (12 chains and 3 value vectors fill the 16 registers; 16 a pass took a fourth pass over
 * the keys for a 64-value head, each with its rows' broadcasts: verify rows in place
 * 0.91-0.96 of the time with 24), 16 for four of f32 values */
static inline __attribute__((always_inline)) void attn_rows_pv8_all(
        const int RB, const int T, float *o, int Dv, const float *p, int ldS, const void *v, long ldv,
        int j0, int j1, const float *alpha, const attn_pf *pf) {
    const int NVMAX = RB <= 2 || (RB == 3 && T == ATTN_KV_F32) ? 4 : RB == 3 || (RB == 4 && T == ATTN_KV_F16) ? 3 : 2;
    for (int c0 = 0; c0 < Dv; c0 += 8 * NVMAX) {
        const int nv = (Dv - c0) / 8 < NVMAX ? (Dv - c0) / 8 : NVMAX;
        const attn_pf *pfc = c0 == 0 ? pf : NULL;
        switch (nv) {
            case 1: attn_rows_pv8_rb(RB, T, 1, o, Dv, p, ldS, v, ldv, c0, j0, j1, alpha, pfc); break;
            case 2: attn_rows_pv8_rb(RB, T, 2, o, Dv, p, ldS, v, ldv, c0, j0, j1, alpha, pfc); break;
            case 3: attn_rows_pv8_rb(RB, T, 3, o, Dv, p, ldS, v, ldv, c0, j0, j1, alpha, pfc); break;
            default: attn_rows_pv8_rb(RB, T, 4, o, Dv, p, ldS, v, ldv, c0, j0, j1, alpha, pfc); break;
        }
    }
}

/* o[r*Dv + c] = o * alpha[r] + sum_{j0 <= j < j1} p[r*ldS + j] v_j[c], r < RB <= 3, for a
 * Q4_0 / Q8_0 V read in place (rows ldv bytes apart), one 32-value block b a pass. The
 * block's scale is folded into the probabilities, w_j = p_j d_j (w: RB x 8-key groups from
 * j0 & ~7, scratch), and Q4_0's offset into one correction, sum_j w_j (n_j - 8) =
 * sum_j w_j n_j - 8 sum_j w_j: a value costs an unpack and a convert, no multiply, no
 * store and reload of an f32 copy. */
static inline __attribute__((always_inline)) void attn_rows_pv_q8_rb(
        const int RB, const int T, float *o, int Dv, const float *p, int ldS, const uint8_t *v, long ldv,
        int j0, int j1, const float *alpha, float *w, const attn_pf *pf) {
    const int bb = T == ATTN_KV_Q8_0 ? 34 : 18, jlo = j0 & ~7, nw = ((j1 + 7) & ~7) - jlo;
    const __m256i lowbits = _mm256_set1_epi32(0x0F);
    for (int b = 0; b < Dv / 32; b++) {
        __m256 wsum[3] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int jb = jlo; jb < j1; jb += 8) {
            const __m256 live = attn_range8(jb, j0, j1 - 1);
            const __m256 dv = attn_scales8(v + (long)jb * ldv + (long)b * bb, ldv, live);
            for (int r = 0; r < RB; r++) {
                /* (masked after the product: the scores past a block's keys are not written) */
                const __m256 wv = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(p + (long)r * ldS + jb), dv), live);
                _mm256_storeu_ps(w + (long)r * nw + (jb - jlo), wv);
                if (T == ATTN_KV_Q4_0) wsum[r] = _mm256_add_ps(wsum[r], wv);
            }
        }
        __m256 corr[3];  /* Q4_0: 8 sum_j w_j a row, in every lane (Q8_0: 0) */
        for (int r = 0; r < RB; r++)
            corr[r] = _mm256_set1_ps(T == ATTN_KV_Q4_0 ? 8.0f * simd_hsum_f32x8(wsum[r]) : 0.0f);
        const uint8_t *vb = v + (long)b * bb + 2;
        /* two passes of 16 values (Q4_0: bytes 0..7 hold values 0..7 and 16..23, bytes 8..15
         * values 8..15 and 24..31), even and odd keys in their own accumulators: 12 chains
         * and no spill */
        for (int h = 0; h < 2; h++) {
            const int c0 = T == ATTN_KV_Q4_0 ? 8 * h : 16 * h, c1 = T == ATTN_KV_Q4_0 ? 16 + 8 * h : 16 * h + 8;
            __m256 acc[2][3][2];
            for (int r = 0; r < RB; r++) {
                const __m256 a = _mm256_set1_ps(alpha[r]);
                acc[0][r][0] = _mm256_mul_ps(_mm256_loadu_ps(o + (long)r * Dv + 32 * b + c0), a);
                acc[0][r][1] = _mm256_mul_ps(_mm256_loadu_ps(o + (long)r * Dv + 32 * b + c1), a);
                acc[1][r][0] = acc[1][r][1] = _mm256_setzero_ps();
            }
            const uint8_t *x = vb + (T == ATTN_KV_Q4_0 ? 8 * h : 16 * h) + (long)j0 * ldv;
            const float *wj = w + (j0 - jlo);
            const float *w1 = wj + nw, *w2 = w1 + nw;  /* (rows past RB: not read) */
#define ATTN_PV_Q8_KEY(e)                                                                                \
            do {                                                                                         \
                const uint8_t *xe = x + (e) * ldv;                                                       \
                __m256 f0, f1;                                                                           \
                if (T == ATTN_KV_Q4_0) {                                                                 \
                    const __m256i x0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)xe));      \
                    f0 = _mm256_cvtepi32_ps(_mm256_and_si256(x0, lowbits));                              \
                    f1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(x0, 4));                                   \
                } else {                                                                                 \
                    f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)xe))); \
                    f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(xe + 8)))); \
                }                                                                                        \
                __m256 wb = _mm256_broadcast_ss(wj + (e));                                               \
                acc[e][0][0] = _mm256_fmadd_ps(wb, f0, acc[e][0][0]);                                    \
                acc[e][0][1] = _mm256_fmadd_ps(wb, f1, acc[e][0][1]);                                    \
                if (RB > 1) {                                                                            \
                    wb = _mm256_broadcast_ss(w1 + (e));                                                  \
                    acc[e][1][0] = _mm256_fmadd_ps(wb, f0, acc[e][1][0]);                                \
                    acc[e][1][1] = _mm256_fmadd_ps(wb, f1, acc[e][1][1]);                                \
                }                                                                                        \
                if (RB > 2) {                                                                            \
                    wb = _mm256_broadcast_ss(w2 + (e));                                                  \
                    acc[e][2][0] = _mm256_fmadd_ps(wb, f0, acc[e][2][0]);                                \
                    acc[e][2][1] = _mm256_fmadd_ps(wb, f1, acc[e][2][1]);                                \
                }                                                                                        \
            } while (0)
            const int n = j1 - j0;
            int i = 0;
            if (b == 0 && h == 0 && pf) {  /* the next block's rows asked for at this pass's pace */
                const uint8_t *q = pf->p + (long)j0 * pf->stride;
                for (; i + 2 <= n; i += 2, x += 2 * ldv, wj += 2, w1 += 2, w2 += 2, q += 2 * pf->stride) {
                    attn_pf_span(q, pf->bytes);
                    attn_pf_span(q + pf->stride, pf->bytes);
                    ATTN_PV_Q8_KEY(0);
                    ATTN_PV_Q8_KEY(1);
                }
                if (i < n) attn_pf_span(q, pf->bytes);
            } else {
                for (; i + 2 <= n; i += 2, x += 2 * ldv, wj += 2, w1 += 2, w2 += 2) {
                    ATTN_PV_Q8_KEY(0);
                    ATTN_PV_Q8_KEY(1);
                }
            }
            if (i < n) ATTN_PV_Q8_KEY(0);
#undef ATTN_PV_Q8_KEY
            for (int r = 0; r < RB; r++) {
                _mm256_storeu_ps(o + (long)r * Dv + 32 * b + c0,
                                 _mm256_sub_ps(_mm256_add_ps(acc[0][r][0], acc[1][r][0]), corr[r]));
                _mm256_storeu_ps(o + (long)r * Dv + 32 * b + c1,
                                 _mm256_sub_ps(_mm256_add_ps(acc[0][r][1], acc[1][r][1]), corr[r]));
            }
        }
    }
}
#endif

/* scores of rows r < R (q: (R, D)) against keys [j0, j1) of a block of K rows stored as t
 * (ATTN_KV_*; f32 / f16 rows ldk elements apart, Q8_0 / Q4_0 rows ldk bytes apart, read in
 * place only by the AVX-512 kernels) */
static void attn_rows_scores(const float *q, int R, int D, const void *k, int t, long ldk, int j0, int j1,
                             float *s, int ldS, const attn_pf *pf) {
#if ATTN_AVX512
    for (int r = 0; r < R; r += 4)
        ATTN_RB_SWITCH(attn_rows_scores_rb, R - r, t, q + (long)r * D, D, k, ldk, j0, j1, s + (long)r * ldS, ldS,
                       r == 0 ? pf : NULL);
#else
#if ATTN_AVX2
    if (D % 8 == 0 && t == ATTN_KV_F32 && R > 4) {  /* many rows of an f32 K: 5 a group, 2 keys a pass */
        for (int r = 0; r < R; r += ATTN_ROWS_GROUP) {
            const int n = R - r < ATTN_ROWS_GROUP ? R - r : ATTN_ROWS_GROUP;
            const float *qr = q + (long)r * D, *kf = (const float *)k;
            float *sr = s + (long)r * ldS;
            const attn_pf *pfr = r == 0 ? pf : NULL;
            if (n == 5) attn_rows_scores8_k2(5, qr, D, kf, ldk, j0, j1, sr, ldS, pfr);
            else if (n == 4) attn_rows_scores8_k2(4, qr, D, kf, ldk, j0, j1, sr, ldS, pfr);
            else if (n == 3) attn_rows_scores8_k4(3, qr, D, kf, ldk, j0, j1, sr, ldS, pfr);
            else if (n == 2) attn_rows_scores8_k4(2, qr, D, kf, ldk, j0, j1, sr, ldS, pfr);
            else attn_rows_scores8_k4(1, qr, D, kf, ldk, j0, j1, sr, ldS, pfr);
        }
        return;
    }
    if (D % 8 == 0 && (t == ATTN_KV_F16 || t == ATTN_KV_F32)) {
        for (int r = 0; r < R; r += 4)
            ATTN_RB_SWITCH_FLOAT(attn_rows_scores8_rb, R - r, t, q + (long)r * D, D, k, ldk, j0, j1, s + (long)r * ldS, ldS,
                            r == 0 ? pf : NULL);
        return;
    }
#endif
    (void)pf;
    for (int r = 0; r < R; r++)
        for (int j = j0; j < j1; j++) {
            float acc = 0.0f;
            for (int d = 0; d < D; d++) {
                const float kd = t == ATTN_KV_F16 ? simd_h2f(((const uint16_t *)k)[(long)j * ldk + d]) : ((const float *)k)[(long)j * ldk + d];
                acc += q[(long)r * D + d] * kd;
            }
            s[(long)r * ldS + j] = acc;
        }
#endif
}

/* w: scratch of 3 x (j1 - j0 + 16) floats (AVX2, a Q4_0 / Q8_0 V read in place: the
 * probabilities times the block's scales) */
static void attn_rows_pv(float *o, int Dv, int R, const float *p, int ldS, const void *v, int t, long ldv,
                         int j0, int j1, const float *alpha, const attn_pf *pf, float *w) {
#if ATTN_AVX512
    for (int r = 0; r < R; r += 4)
        ATTN_RB_SWITCH(attn_rows_pv_all, R - r, t, o + (long)r * Dv, Dv, p + (long)r * ldS, ldS, v, ldv, j0, j1, alpha + r,
                       r == 0 ? pf : NULL);
#else
#if ATTN_AVX2
    if (Dv % 8 == 0 && t == ATTN_KV_F32 && R > 4) {
        /* many rows of an f32 V (a converted block): 5 rows a group, 16 values a pass with the
         * values in registers (2 + 5 loads a 10 fmas; 3 rows x 32 values read by each fma
         * loaded 15 for 12: 0.94 of the verify's attention); a row's sums are the same
         * whatever its group */
        for (int r = 0; r < R; r += ATTN_ROWS_GROUP) {
            const int n = R - r < ATTN_ROWS_GROUP ? R - r : ATTN_ROWS_GROUP;
            float *or_ = o + (long)r * Dv;
            const float *pr = p + (long)r * ldS;
            const attn_pf *pfr = r == 0 ? pf : NULL;
            if (n >= 4) {
                for (int c0 = 0; c0 < Dv; c0 += 16) {
                    const attn_pf *pfc = c0 == 0 ? pfr : NULL;
                    const int nv = Dv - c0 >= 16 ? 2 : 1;
                    if (n == 5 && nv == 2) attn_rows_pv8_rb(5, ATTN_KV_F32, 2, or_, Dv, pr, ldS, v, ldv, c0, j0, j1, alpha + r, pfc);
                    else if (n == 5) attn_rows_pv8_rb(5, ATTN_KV_F32, 1, or_, Dv, pr, ldS, v, ldv, c0, j0, j1, alpha + r, pfc);
                    else if (nv == 2) attn_rows_pv8_rb(4, ATTN_KV_F32, 2, or_, Dv, pr, ldS, v, ldv, c0, j0, j1, alpha + r, pfc);
                    else attn_rows_pv8_rb(4, ATTN_KV_F32, 1, or_, Dv, pr, ldS, v, ldv, c0, j0, j1, alpha + r, pfc);
                }
            } else if (n == 3) attn_rows_pv8_all(3, ATTN_KV_F32, or_, Dv, pr, ldS, v, ldv, j0, j1, alpha + r, pfr);
            else if (n == 2) attn_rows_pv8_all(2, ATTN_KV_F32, or_, Dv, pr, ldS, v, ldv, j0, j1, alpha + r, pfr);
            else attn_rows_pv8_all(1, ATTN_KV_F32, or_, Dv, pr, ldS, v, ldv, j0, j1, alpha + r, pfr);
        }
        return;
    }
    if (Dv % 8 == 0 && (t == ATTN_KV_F16 || t == ATTN_KV_F32)) {
        for (int r = 0; r < R; r += 4)
            ATTN_RB_SWITCH_FLOAT(attn_rows_pv8_all, R - r, t, o + (long)r * Dv, Dv, p + (long)r * ldS, ldS, v, ldv, j0, j1,
                            alpha + r, r == 0 ? pf : NULL);
        return;
    }
    if (Dv % 32 == 0 && (t == ATTN_KV_Q4_0 || t == ATTN_KV_Q8_0) && w) {
        for (int r = 0; r < R; r += 3) {
            const int n = R - r < 3 ? R - r : 3;
            float *or_ = o + (long)r * Dv;
            const float *pr = p + (long)r * ldS;
            const uint8_t *vv = (const uint8_t *)v;
            const attn_pf *pfr = r == 0 ? pf : NULL;
#define ATTN_PV_Q8(RB, T) attn_rows_pv_q8_rb(RB, T, or_, Dv, pr, ldS, vv, ldv, j0, j1, alpha + r, w, pfr)
            if (t == ATTN_KV_Q4_0) {
                if (n == 3) ATTN_PV_Q8(3, ATTN_KV_Q4_0); else if (n == 2) ATTN_PV_Q8(2, ATTN_KV_Q4_0); else ATTN_PV_Q8(1, ATTN_KV_Q4_0);
            } else {
                if (n == 3) ATTN_PV_Q8(3, ATTN_KV_Q8_0); else if (n == 2) ATTN_PV_Q8(2, ATTN_KV_Q8_0); else ATTN_PV_Q8(1, ATTN_KV_Q8_0);
            }
#undef ATTN_PV_Q8
        }
        return;
    }
#endif
    (void)pf;
    (void)w;
    for (int r = 0; r < R; r++) {
        float *orow = o + (long)r * Dv;
        for (int cc = 0; cc < Dv; cc++) orow[cc] *= alpha[r];
        for (int j = j0; j < j1; j++) {
            const float pj = p[(long)r * ldS + j];
            for (int cc = 0; cc < Dv; cc++) {
                const float vj = t == ATTN_KV_F16 ? simd_h2f(((const uint16_t *)v)[(long)j * ldv + cc]) : ((const float *)v)[(long)j * ldv + cc];
                orow[cc] += pj * vj;
            }
        }
    }
#endif
}

/* Row r's scores s[0:ldS] (keys of one block; it sees keys [jlo, jhi]) -> probabilities
 * (0 elsewhere), online update of m and the per-lane sums l16 (16,); returns alpha. */
static inline float attn_rows_softmax(float *s, int ldS, int jlo, int jhi, float softcap, float *m, float *l16) {
    if (jhi < jlo) {  /* sees nothing here: unchanged */
        for (int j = 0; j < ldS; j++) s[j] = 0.0f;
        return 1.0f;
    }
#if ATTN_AVX512
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
#ifndef ATTN_SOFTMAX_NO_SPEC
    if (ldS == 32 && jlo == 0 && jhi == 31 && *m > -INFINITY) {
        /* a whole 32-key block: the probabilities against the running max are computed
         * while the block's max is reduced; if it does not raise the max (most blocks past
         * the first), they are the ones the general path below computes (alpha = 1), bit for
         * bit, without its max -> exp dependency */
        __m512 x0 = _mm512_loadu_ps(s), x1 = _mm512_loadu_ps(s + 16);
        if (softcap > 0.0f) {
            x0 = attn_softcap16(x0, softcap);
            x1 = attn_softcap16(x1, softcap);
        }
        const float mo = *m;
        const __m512 mm = _mm512_set1_ps(mo);
        const __m512 p0 = attn_exp2_16(_mm512_sub_ps(x0, mm)), p1 = attn_exp2_16(_mm512_sub_ps(x1, mm));
        if (!(_mm512_cmp_ps_mask(_mm512_max_ps(x0, x1), mm, _CMP_NLE_UQ))) {
            _mm512_storeu_ps(s, p0);
            _mm512_storeu_ps(s + 16, p1);
            _mm512_storeu_ps(l16, _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(l16), p0), p1));
            return 1.0f;
        }
        _mm512_storeu_ps(s, x0);  /* (softcapped) */
        _mm512_storeu_ps(s + 16, x1);
        softcap = 0.0f;
    }
#endif
    __m512 bm = ninf;
    for (int j = 0; j < ldS; j += 16) {
        const int a = jlo - j, b = jhi - j;  /* lanes [a, b] live */
        __mmask16 live = 0;
        if (b >= 0 && a <= 15) {
            const int lo = a > 0 ? a : 0, hi = b < 15 ? b : 15;
            live = (__mmask16)(((1u << (hi + 1)) - 1u) & ~((1u << lo) - 1u));
        }
        __m512 x = _mm512_loadu_ps(s + j);
        if (softcap > 0.0f) x = attn_softcap16(x, softcap);
        x = _mm512_mask_blend_ps(live, ninf, x);
        _mm512_storeu_ps(s + j, x);
        bm = _mm512_max_ps(bm, x);
    }
    const float mo = *m, bmax = _mm512_reduce_max_ps(bm);
    const float mn = mo > bmax ? mo : bmax;
    /* a block that does not raise the max (most of them): alpha = 2^0 = 1 without the call */
    const float alpha = mo == mn && mn > -INFINITY ? 1.0f : attn_exp2(mo - mn);  /* mo = -inf: 0 */
    const __m512 mm = _mm512_set1_ps(mn);
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(l16), _mm512_set1_ps(alpha));
    for (int j = 0; j < ldS; j += 16) {
        const __m512 p = attn_exp2_16(_mm512_sub_ps(_mm512_loadu_ps(s + j), mm));
        _mm512_storeu_ps(s + j, p);
        acc = _mm512_add_ps(acc, p);
    }
    _mm512_storeu_ps(l16, acc);
    *m = mn;
    return alpha;
#else
#if ATTN_AVX2
    {
        const __m256 ninf = _mm256_set1_ps(-INFINITY);
        __m256 bm = ninf;
        for (int j = 0; j < ldS; j += 8) {
            __m256 x = _mm256_loadu_ps(s + j);
            if (softcap > 0.0f) x = attn_softcap8(x, softcap);
            x = _mm256_blendv_ps(ninf, x, attn_range8(j, jlo, jhi));
            _mm256_storeu_ps(s + j, x);
            bm = _mm256_max_ps(bm, x);
        }
        const float mo = *m, bmax = simd_hmax_f32x8(bm);
        const float mn = mo > bmax ? mo : bmax;
        const float alpha = mo == mn && mn > -INFINITY ? 1.0f : attn_exp2(mo - mn);
        const __m256 mm = _mm256_set1_ps(mn), al = _mm256_set1_ps(alpha);
        __m256 acc0 = _mm256_mul_ps(_mm256_loadu_ps(l16), al), acc1 = _mm256_mul_ps(_mm256_loadu_ps(l16 + 8), al);
        for (int j = 0; j < ldS; j += 16) {  /* lanes j % 16 as the other paths */
            const __m256 p0 = attn_exp2_8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mm));
            const __m256 p1 = attn_exp2_8(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mm));
            _mm256_storeu_ps(s + j, p0);
            _mm256_storeu_ps(s + j + 8, p1);
            acc0 = _mm256_add_ps(acc0, p0);
            acc1 = _mm256_add_ps(acc1, p1);
        }
        _mm256_storeu_ps(l16, acc0);
        _mm256_storeu_ps(l16 + 8, acc1);
        *m = mn;
        return alpha;
    }
#endif
    float bm = -INFINITY;
    for (int j = 0; j < ldS; j++) {
        float x = s[j];
        if (softcap > 0.0f) x = attn_softcap1(x, softcap);
        if (j < jlo || j > jhi) x = -INFINITY;
        s[j] = x;
        bm = x > bm ? x : bm;
    }
    const float mo = *m, mn = mo > bm ? mo : bm;
    const float alpha = mo == mn && mn > -INFINITY ? 1.0f : attn_exp2(mo - mn);
    for (int i = 0; i < 16; i++) l16[i] *= alpha;
    for (int j = 0; j < ldS; j++) {
        s[j] = attn_exp2(s[j] - mn);
        l16[j % 16] += s[j];
    }
    *m = mn;
    return alpha;
#endif
}

/* ---- rows items in the lanes form: many rows per kv head, the rows kernel's bits ------------
 *
 * A verify step (speculative decoding) has tens of rows per kv head that must each get the
 * bits a one-token decode gets from the rows kernel. The rows kernel spends ~12 cycles per
 * row and key on them (one fma chain and a share of a 16 x 16 transpose-add per score); with
 * rows in lanes the same sums cost a few: lane l's fma chain over d = l, l + 16, .. becomes
 * a chain of broadcasts of k_j[d] against Q^T rows, and the 16 chains are added in
 * simd_hsum16x16's tree. The softmax keeps the rows kernel's statistics (per-row max, alpha
 * from exp2f, per-lane sums l16 added in key order), and P.V is the tile kernel's, whose
 * order (o * alpha, then p_j v_j in key order) is the rows kernel's. */

#ifndef ATTN_LANES_REM
/* rows past whole lane vectors that the rows kernel takes (more: one more vector). A lanes
 * vector costs about what 8 rows of the rows kernel cost (D = 64, f16) */
#define ATTN_LANES_REM 8
#endif
#ifndef ATTN_LANES_MIN_ROWS
/* rows of one kv head from which an item takes the lanes form (verify of 3 tokens x 3 heads:
 * rows in place 2.9 ms of attention a step, lanes 3.7; 5 x 3: lanes 4.0, in place 4.2) */
#define ATTN_LANES_MIN_ROWS 12
#endif
/* rows of one kv head that the rows kernel reads from f16 K/V in place (more are converted to
 * f32 once per block: with AVX-512 the conversion cost more than the rows' second pass over
 * the block from cache; a verify of 2 tokens' attention 3.1 -> 2.0 ms a step. AVX2, Zen 3,
 * against converting from 5 rows: verifies of 1-4 drafts (6-15 rows) 0.87 / 0.89 / 0.935 /
 * 0.97 of the time; with 4 rows' P.V 24 values a pass, 5-8 drafts (18-27 rows) 0.91-0.96
 * against converting from 17, 9-16 drafts (30-51 rows) 0.97-1.00) */
#if ATTN_AVX512
#define ATTN_ROWS_IN_PLACE 16
#elif ATTN_AVX2
#define ATTN_ROWS_IN_PLACE 32
#else
#define ATTN_ROWS_IN_PLACE 4
#endif
/* (attn_plan.pxd) a lone decode rows item over few keys goes out as two items of half its
 * heads each (0: one item; A/B) */
static int attn_split_heads = 1;
static inline int attn_set_split_heads(int on) { const int old = attn_split_heads; attn_split_heads = on; return old; }

/* 0: a decode rows item asks for the next block by its first kv head's pass only (benchmarks'
 * A/B: step._set_pf_spread) */
static int attn_pf_spread = 1;
static inline int attn_set_pf_spread(int on) { const int old = attn_pf_spread; attn_pf_spread = on; return old; }
/* tests and benchmarks move it (attention.pyx _set_lanes_min_rows); INT_MAX: never */
static int attn_lanes_min_rows = ATTN_LANES_MIN_ROWS;
static inline int attn_set_lanes_min_rows(int n) {
    const int old = attn_lanes_min_rows;
    attn_lanes_min_rows = n;
    return old;
}

#if ATTN_AVX512
/* x[u] = lane l of the rows kernel's fma chain for key u: sum_i q[16i + l] k_u[16i + l] */
#define ATTN_LANES_LEAF(x, l)                                                             \
    do {                                                                                  \
        for (int u = 0; u < NK; u++) x[u] = _mm512_setzero_ps();                          \
        for (int i = 0; i < ND; i++) {                                                    \
            const __m512 qv = _mm512_loadu_ps(qb + (16 * i + (l)) * 16);                  \
            for (int u = 0; u < NK; u++)                                                  \
                x[u] = _mm512_fmadd_ps(qv, _mm512_set1_ps(kr[u][16 * i + (l)]), x[u]);    \
        }                                                                                 \
    } while (0)

/* st[(j + u) * ldq + r] for NK keys from k (f32 rows ldk apart), the 16 lanes r of one row
 * vector whose Q^T is qb[d * 16 + r]: s = ((y0 + y4) + (y2 + y6)) + ((y1 + y5) + (y3 + y7)),
 * y_l = x_l + x_{l+8} (every address a constant offset from qb or a key row) */
static inline __attribute__((always_inline)) void attn_lanes_scores_nk(
        const int NK, const int ND, const float *qb, int ldq, const float *k, long ldk, float *st) {
    const float *kr[4];
    for (int u = 0; u < NK; u++) kr[u] = k + (long)u * ldk;
    __m512 x[4], x2[4], y[4], z[4], w0[4];
    ATTN_LANES_LEAF(x, 0); ATTN_LANES_LEAF(x2, 8);
    for (int u = 0; u < NK; u++) y[u] = _mm512_add_ps(x[u], x2[u]);
    ATTN_LANES_LEAF(x, 4); ATTN_LANES_LEAF(x2, 12);
    for (int u = 0; u < NK; u++) z[u] = _mm512_add_ps(y[u], _mm512_add_ps(x[u], x2[u]));
    ATTN_LANES_LEAF(x, 2); ATTN_LANES_LEAF(x2, 10);
    for (int u = 0; u < NK; u++) y[u] = _mm512_add_ps(x[u], x2[u]);
    ATTN_LANES_LEAF(x, 6); ATTN_LANES_LEAF(x2, 14);
    for (int u = 0; u < NK; u++) w0[u] = _mm512_add_ps(z[u], _mm512_add_ps(y[u], _mm512_add_ps(x[u], x2[u])));
    ATTN_LANES_LEAF(x, 1); ATTN_LANES_LEAF(x2, 9);
    for (int u = 0; u < NK; u++) y[u] = _mm512_add_ps(x[u], x2[u]);
    ATTN_LANES_LEAF(x, 5); ATTN_LANES_LEAF(x2, 13);
    for (int u = 0; u < NK; u++) z[u] = _mm512_add_ps(y[u], _mm512_add_ps(x[u], x2[u]));
    ATTN_LANES_LEAF(x, 3); ATTN_LANES_LEAF(x2, 11);
    for (int u = 0; u < NK; u++) y[u] = _mm512_add_ps(x[u], x2[u]);
    ATTN_LANES_LEAF(x, 7); ATTN_LANES_LEAF(x2, 15);
    for (int u = 0; u < NK; u++)
        _mm512_storeu_ps(st + (long)u * ldq,
                         _mm512_add_ps(w0[u], _mm512_add_ps(z[u], _mm512_add_ps(y[u], _mm512_add_ps(x[u], x2[u])))));
}

static inline __attribute__((always_inline)) void attn_lanes_scores_nd(
        const int ND, const float *qt, int ldq, int nv, const float *k, long ldk, int j0, int j1, float *st,
        const attn_pf *pfk, const attn_pf *pfv) {
    for (int v = 0; v < nv; v++) {
        const float *q = qt + (long)v * 16 * 16 * ND;
        float *o = st + 16 * v;
        int j = j0;
        for (; j + 4 <= j1; j += 4) {
            if (v == 0)
                for (int u = 0; u < 4; u++) { attn_pf_row(pfk, j + u); attn_pf_row(pfv, j + u); }
            attn_lanes_scores_nk(4, ND, q, ldq, k + (long)j * ldk, ldk, o + (long)j * ldq);
        }
        for (; j < j1; j++) {
            if (v == 0) { attn_pf_row(pfk, j); attn_pf_row(pfv, j); }
            attn_lanes_scores_nk(1, ND, q, ldq, k + (long)j * ldk, ldk, o + (long)j * ldq);
        }
    }
}

/* st[j * ldq + r] = q_r . k_j, keys [j0, j1), rows r < 16 * nv; qt: row vector v's Q^T at
 * qt + v * 16 * D, [d * 16 + lane] */
static void attn_lanes_scores(const float *qt, int ldq, int nv, int D, const float *k, long ldk, int j0, int j1,
                              float *st, const attn_pf *pfk, const attn_pf *pfv) {
    switch (D) {  /* the fma chains' length, a constant for the common head dims */
        case 64: attn_lanes_scores_nd(4, qt, ldq, nv, k, ldk, j0, j1, st, pfk, pfv); break;
        case 128: attn_lanes_scores_nd(8, qt, ldq, nv, k, ldk, j0, j1, st, pfk, pfv); break;
        case 32: attn_lanes_scores_nd(2, qt, ldq, nv, k, ldk, j0, j1, st, pfk, pfv); break;
        default: attn_lanes_scores_nd(D / 16, qt, ldq, nv, k, ldk, j0, j1, st, pfk, pfv); break;
    }
}

/* Scores st (keys [j0, j1) of a block whose first key is at position k0) -> probabilities,
 * rows r < 16*nv seeing keys [lo[r], hi[r]]: attn_rows_softmax's arithmetic per row, with
 * its per-lane sums as Lt[i * ldq + r] = l16 of row r, lane i. */
static void attn_lanes_softmax(float *st, int ldq, int nv, int j0, int j1, int k0, const int32_t *lo,
                               const int32_t *hi, float softcap, float *m, float *Lt, float *alpha) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int v = 0; v < nv; v++) {
        const __m512i lov = _mm512_loadu_si512((const void *)(lo + 16 * v));
        const __m512i hiv = _mm512_loadu_si512((const void *)(hi + 16 * v));
        __m512 bm = ninf;
        for (int j = j0; j < j1; j++) {
            float *s = st + (long)j * ldq + 16 * v;
            const __m512i kp = _mm512_set1_epi32(k0 + j);
            const __mmask16 live = _mm512_cmple_epi32_mask(lov, kp) & _mm512_cmple_epi32_mask(kp, hiv);
            __m512 x = _mm512_loadu_ps(s);
            if (softcap > 0.0f) x = attn_softcap16(x, softcap);
            x = _mm512_mask_blend_ps(live, ninf, x);
            _mm512_storeu_ps(s, x);
            bm = _mm512_max_ps(bm, x);
        }
        const __m512 mo = _mm512_loadu_ps(m + 16 * v);
        const __m512 mn = _mm512_max_ps(mo, bm);  /* mo > bmax ? mo : bmax */
        float mof[16], mnf[16];
        _mm512_storeu_ps(mof, mo);
        _mm512_storeu_ps(mnf, mn);
        /* a row that sees nothing here keeps mo (alpha 1, p 0: the rows kernel's early out) */
        for (int i = 0; i < 16; i++) alpha[16 * v + i] = mof[i] == mnf[i] ? 1.0f : attn_exp2(mof[i] - mnf[i]);
        const __m512 a = _mm512_loadu_ps(alpha + 16 * v);
        __m512 acc[16];
        for (int i = 0; i < 16; i++) acc[i] = _mm512_mul_ps(_mm512_loadu_ps(Lt + (long)i * ldq + 16 * v), a);
        for (int jb = j0 & ~15; jb < j1; jb += 16)
            for (int i = 0; i < 16; i++) {  /* key j goes to lane j % 16 */
                const int j = jb + i;
                if (j < j0 || j >= j1) continue;
                float *s = st + (long)j * ldq + 16 * v;
                const __m512 p = attn_exp2_16(_mm512_sub_ps(_mm512_loadu_ps(s), mn));
                _mm512_storeu_ps(s, p);
                acc[i] = _mm512_add_ps(acc[i], p);
            }
        for (int i = 0; i < 16; i++) _mm512_storeu_ps(Lt + (long)i * ldq + 16 * v, acc[i]);
        _mm512_storeu_ps(m + 16 * v, mn);
    }
}
#endif

static void attn_rows_item(const attn_ctx *c, const attn_item *it, float *buf) {
    const int D = c->D, Dv = c->Dv, bs = c->bs, G = c->G, KVH = c->KVH;
    const int nt = it->tok1 - it->tok0, R = nt * (it->h1 - it->h0);
    const int ldS = (bs + 15) & ~15;
    float *q = buf;                                   /* R x D */
    float *o = q + (long)ATTN_MAX_ROWS * D;           /* R x Dv */
    float *kf = o + (long)ATTN_MAX_ROWS * Dv;         /* bs x D */
    float *vf = kf + (long)bs * D;                    /* bs x Dv */
    float *s = vf + (long)bs * Dv;                    /* R x ldS */
    float *m = s + (long)ldS * ATTN_MAX_ROWS;
    float *alpha = m + ATTN_MAX_ROWS, *l16 = alpha + ATTN_MAX_ROWS;  /* R x 16 */
    int32_t *lo = (int32_t *)(l16 + 16 * ATTN_MAX_ROWS), *hi = lo + ATTN_MAX_ROWS;
    const int r16 = c->kv_type == ATTN_KV_F16;
    /* a quantized K: int8 scores (any row count; its keys in lanes take the lanes form's place) */
    const int q8 = attn_q8_scores(c->kv_type) && D % 32 == 0;
    const float qscale = c->scale * ATTN_LOG2E, cap = c->softcap * ATTN_LOG2E;  /* log2 units */
    int lo_all = INT_MAX, hi_all = -1;
    for (int r = 0; r < R; r++) {
        const int t = c->toks[it->tok0 + r % nt], h = it->h0 + r / nt;
        const float *src = c->q + ((long)t * c->H + h) * D;
        for (int d = 0; d < D; d++) q[(long)r * D + d] = (r16 ? simd_f16_round(src[d]) : src[d]) * qscale;
        hi[r] = c->q_pos[t];
        lo[r] = attn_key_lo(hi[r], c->window);
        lo_all = lo[r] < lo_all ? lo[r] : lo_all;
        hi_all = hi[r] > hi_all ? hi[r] : hi_all;
        m[r] = -INFINITY;
        for (int i = 0; i < 16; i++) l16[r * 16 + i] = 0.0f;
    }
    memset(o, 0, (size_t)R * Dv * sizeof(float));
    const int kv0 = it->h0 / G, kv1 = (it->h1 - 1) / G;
    const int32_t *table = c->tables + (long)it->seq * c->max_blocks;
#if ATTN_AVX512
    /* many rows of one kv head: the lanes form (same bits, rows in lanes) */
    const int lanes = kv0 == kv1 && R >= attn_lanes_min_rows && D % 16 == 0 && !q8;
#else
    const int lanes = 0;
#endif
    /* lanes: rows [0, rl) in ldq lanes (16 a vector, the last one padded); a few rows past
     * whole vectors (ATTN_LANES_REM) go through the rows kernel instead of a mostly empty
     * vector (the same bits either way) */
    int ldq = (R + 15) & ~15, rl = R;
    if (lanes && R > 16 && R % 16 <= ATTN_LANES_REM) {
        ldq = R - R % 16;
        rl = ldq;
    }
    float *qt = (float *)(hi + ATTN_MAX_ROWS) + 64;   /* (lanes) nv x D x 16: Q^T per row vector */
    float *Lt = l16;                                  /* 16 x ldq (lanes): l16 transposed */
    /* (q8) in qt's place: R rows of rounded q, their scales and offsets (<= 4 D bytes a row) */
    const int qrb = attn_q8_row_bytes(D), nbq = D / 32;
    float *dq = qt;
    int32_t *qcorr = (int32_t *)(dq + (long)ATTN_MAX_ROWS * nbq);
    int8_t *qb = (int8_t *)(qcorr + (long)ATTN_MAX_ROWS * nbq);
    if (q8)
        for (int r = 0; r < R; r++)
            attn_q8_prep(q + (long)r * D, D, c->kv_type, qb + (long)r * qrb, dq + (long)r * nbq, qcorr + (long)r * nbq);
    if (lanes) {
        for (int r = 0; r < ldq; r++) {
            float *dst = qt + (long)(r / 16) * 16 * D + r % 16;
            for (int d = 0; d < D; d++) dst[d * 16] = r < R ? q[(long)r * D + d] : 0.0f;
        }
        for (int r = R; r < ldq; r++) {  /* padding lanes see no key */
            lo[r] = INT_MAX;
            hi[r] = -1;
            m[r] = -INFINITY;
        }
        memset(Lt, 0, (size_t)16 * ldq * sizeof(float));
    }
    const long ks = (long)KVH * c->k_row, vs = (long)KVH * c->v_row;
    /* the item's kv heads are adjacent rows of each (token) slot: prefetch that span */
    const int pf_k = (kv1 - kv0 + 1) * c->k_row, pf_v = (kv1 - kv0 + 1) * c->v_row;
    /* rows that straddle lines (quantized): the next block's rows of all the item's kv heads
     * asked for once (below): spread over all the heads' passes where the item has every kv
     * head (its bytes of a block are then one K span and one V span), else by the first
     * head's pass */
    const int k_once = (c->k_row & 63) != 0, v_once = (c->v_row & 63) != 0;
    const int spread = attn_pf_spread && k_once && v_once && kv0 == 0 && kv1 == KVH - 1 && kv1 > kv0 && !lanes;
    /* (spread) a kv head's part of a block's K and V bytes, and a key's share of it in a block
     * of sp_nk keys: divided once an item and again only where a block's key count differs
     * (four 64-bit divisions a block and head were ~1% of a 32-sequence step) */
    const int sp_nh = kv1 - kv0 + 1;
    const long sp_ck = spread ? ((long)bs * ks + sp_nh - 1) / sp_nh : 0;
    const long sp_cv = spread ? ((long)bs * vs + sp_nh - 1) / sp_nh : 0;
    int sp_nk = 0, sp_perk = 0, sp_perv = 0, sp_lin = 0;
    /* the first blocks are cold (the weights of a step's other work evicted them): ask for
     * them all at once, then keep ATTN_PF_AHEAD blocks in flight */
    const long kg_stride = 16L * KVH * c->k_row;  /* (tiled K: a 16-key group's tiles) */
    for (int b = it->b0; b < it->b1 && b < it->b0 + ATTN_PF_AHEAD; b++)
        if (table[b] >= 0) {
            if (c->k_tiled)
                for (int g = 0; g < bs / 16; g++)
                    attn_pf_span(c->k + table[b] * c->k_bstride + g * kg_stride + 16L * kv0 * c->k_row, 16 * pf_k);
            else
                attn_prefetch_rows(c->k + table[b] * c->k_bstride + (long)kv0 * c->k_row, ks, bs, pf_k);
            attn_prefetch_rows(c->v + table[b] * c->v_bstride + (long)kv0 * c->v_row, vs, bs, pf_v);
        }
    for (int b = it->b0; b < it->b1; b++) {
        const int blk = table[b];
        if (blk < 0) continue;
        const int k0 = b * bs;
        int j0 = lo_all - k0, j1 = hi_all - k0 + 1;
        if (j0 < 0) j0 = 0;
        if (j1 > bs) j1 = bs;
        if (j1 <= j0) continue;
        if (spread && j1 - j0 != sp_nk) {
            sp_nk = j1 - j0;
            sp_perk = (int)((sp_ck + sp_nk - 1) / sp_nk);
            sp_perv = (int)((sp_cv + sp_nk - 1) / sp_nk);
            /* key j's share of a part is bytes p + j * share (the tiled K's 16-key stride is 16
             * shares): a line sweep where a share is at most a line and parts start on lines */
            sp_lin = attn_pf_lin_on && sp_perk <= 64 && sp_perv <= 64 && (sp_ck & 63) == 0 && (sp_cv & 63) == 0;
        }
        /* the block ATTN_PF_AHEAD on is asked for, row by row, while this one is computed
         * (by the first rows' pass over the keys: a block converted to f32 first is then
         * asked for over the scores of its first rows, not all at once) */
        const int bn = b + ATTN_PF_AHEAD, blk_n = bn < it->b1 ? table[bn] : -1;
        for (int kvh = kv0; kvh <= kv1; kvh++) {
            /* rows of this kv head: heads [ha, hb) */
            const int ha = kvh * G > it->h0 ? kvh * G : it->h0, hb = (kvh + 1) * G < it->h1 ? (kvh + 1) * G : it->h1;
            int ra = (ha - it->h0) * nt, rn = (hb - ha) * nt;
            const uint8_t *kb = c->k + blk * c->k_bstride + (long)kvh * c->k_row;
            const uint8_t *vb = c->v + blk * c->v_bstride + (long)kvh * c->v_row;
            const void *kp, *vp;
            int kt = ATTN_KV_F32;  /* how kp / vp are stored */
            long ldk, ldv;
            /* the next block's rows: rows that straddle lines of every kv head of the item
             * asked for by the first kv head's pass (they are adjacent: a line shared by two
             * heads' rows asked for once; attn_ab.py 8 sequences in cache: q4_0 0.98, q8_0
             * 0.94 of the time); whole-line rows (f16) by each head's pass (all of a block's
             * lines asked for in a third of it: 1.5x the time from memory) */
            attn_pf pfk = {NULL, ks, k_once ? pf_k : c->k_row}, pfv = {NULL, vs, v_once ? pf_v : c->v_row};
            if (c->k_tiled) {  /* the item's kv heads' tiles, key by key (attn_pf_tile_row) */
                pfk.stride = kg_stride;
                pfk.bytes = pf_k;
            }
            if (blk_n >= 0 && spread) {
                /* the next block's K and V bytes (each one span: the item has every kv head) in
                 * nh parts, part kvh - kv0 asked for over this head's keys */
                const int hi = kvh - kv0;
                pfk.p = c->k + blk_n * c->k_bstride + hi * sp_ck - (long)j0 * sp_perk;
                pfk.stride = c->k_tiled ? 16L * sp_perk : sp_perk;
                pfk.bytes = sp_perk;
                pfv.p = c->v + blk_n * c->v_bstride + hi * sp_cv - (long)j0 * sp_perv;
                pfv.stride = sp_perv;
                pfv.bytes = sp_perv;
                pfk.lin = pfv.lin = sp_lin;
            } else if (blk_n >= 0) {
                if (c->k_tiled) {
                    if (kvh == kv0) pfk.p = c->k + blk_n * c->k_bstride + 16L * kv0 * c->k_row;
                } else if (!k_once || kvh == kv0) pfk.p = c->k + blk_n * c->k_bstride + (long)kvh * c->k_row;
                if (!v_once || kvh == kv0) pfv.p = c->v + blk_n * c->v_bstride + (long)kvh * c->v_row;
            }
#if ATTN_AVX512
            if (lanes) {
                const float *kl = kf, *vl = vf;
                long ldkl = D, ldvl = Dv;
                if (c->kv_type == ATTN_KV_F32) {
                    kl = (const float *)kb; vl = (const float *)vb; ldkl = ks / 4; ldvl = vs / 4;
                } else {
                    attn_load_rows(kb, ks, c->kv_type, j0, j1, D, kf, D);
                    attn_load_rows(vb, vs, c->kv_type, j0, j1, Dv, vf, Dv);
                }
                attn_lanes_scores(qt, ldq, ldq / 16, D, kl, ldkl, j0, j1, s, blk_n >= 0 ? &pfk : NULL,
                                  blk_n >= 0 ? &pfv : NULL);
                attn_lanes_softmax(s, ldq, ldq / 16, j0, j1, k0, lo, hi, cap, m, Lt, alpha);
                attn_tile_pv(o, Dv, rl, s + (long)j0 * ldq, ldq, vl + (long)j0 * ldvl, ldvl, j1 - j0, alpha, NULL);
                if (rl == R) continue;
                /* the rows past the lanes: the rows kernel over the same f32 block (their scores
                 * at s + r * ldS, r >= rl, lie past the lanes' bs x ldq) */
                ra = rl;
                rn = R - rl;
                kp = kl; vp = vl; ldk = ldkl; ldv = ldvl;
                pfk.p = pfv.p = NULL;
            } else
#endif
            if (q8) {  /* scores read K as it is stored; V in place or converted once */
                if (c->k_tiled) {
                    kp = c->k + blk * c->k_bstride + 16L * kvh * c->k_row;
                    ldk = kg_stride;
                } else {
                    kp = kb;
                    ldk = ks;
                }
#if ATTN_AVX512
                if (rn <= ATTN_ROWS_IN_PLACE) {
                    vp = vb; ldv = vs; kt = c->kv_type;
                } else
#endif
#if ATTN_AVX2
                if (Dv % 32 == 0) {  /* (AVX2: the scales folded into the probabilities) */
                    vp = vb; ldv = vs; kt = c->kv_type;
                } else
#endif
                {
                    attn_load_rows(vb, vs, c->kv_type, j0, j1, Dv, vf, Dv);
                    vp = vf; ldv = Dv;
                }
            } else if (c->kv_type == ATTN_KV_F32) {
                kp = kb; vp = vb; ldk = ks / 4; ldv = vs / 4;
            } else if (r16 && rn <= ATTN_ROWS_IN_PLACE) {  /* few rows read f16 K/V in place; more convert once */
                kp = kb; vp = vb; ldk = ks / 2; ldv = vs / 2; kt = ATTN_KV_F16;
#if ATTN_AVX512
            } else if (rn <= ATTN_ROWS_IN_PLACE) {  /* quantized K/V too (rows of bytes; AVX-512 only) */
                kp = kb; vp = vb; ldk = ks; ldv = vs; kt = c->kv_type;
#endif
            } else {
                attn_load_rows(kb, ks, c->kv_type, j0, j1, D, kf, D);
                attn_load_rows(vb, vs, c->kv_type, j0, j1, Dv, vf, Dv);
                kp = kf; vp = vf; ldk = D; ldv = Dv;
            }
            if (q8)
                attn_rows_scores_q8(qb + (long)ra * qrb, qrb, dq + (long)ra * nbq, qcorr + (long)ra * nbq, rn, D,
                                    (const uint8_t *)kp, c->k_tiled ? ATTN_KV_Q4_0T : c->kv_type, ldk, j0, j1,
                                    s + (long)ra * ldS, ldS,
                                    pfk.p ? &pfk : NULL);
            else
                attn_rows_scores(q + (long)ra * D, rn, D, kp, kt, ldk, j0, j1, s + (long)ra * ldS, ldS,
                                 pfk.p ? &pfk : NULL);
            for (int r = ra; r < ra + rn; r++) {
                const int a = lo[r] - k0, z = hi[r] - k0;
                alpha[r] = attn_rows_softmax(s + (long)r * ldS, ldS, a > j0 ? a : j0, z < j1 - 1 ? z : j1 - 1,
                                             cap, m + r, l16 + 16 * r);
            }
            attn_rows_pv(o + (long)ra * Dv, Dv, rn, s + (long)ra * ldS, ldS, vp, kt, ldv, j0, j1, alpha + ra,
                         pfv.p ? &pfv : NULL, kf);
        }
    }
    for (int r = 0; r < R; r++) {
        float l = 0.0f;
#if ATTN_AVX512
        float l16r[16];
        if (lanes && r < rl)
            for (int i = 0; i < 16; i++) l16r[i] = Lt[(long)i * ldq + r];
        l = _mm512_reduce_add_ps(_mm512_loadu_ps(lanes && r < rl ? l16r : l16 + 16 * r));
#else
        for (int i = 0; i < 16; i++) l += l16[16 * r + i];
#endif
        attn_emit(c, c->toks[it->tok0 + r % nt], it->h0 + r / nt, o + (long)r * Dv, m[r], l, it->chunk);
    }
}

/* ---- prefill tile items on AMX-BF16 ------------------------------------------------------ */
#if ATTN_AVX512 && AB_BUILT
/* attn_tile_item with the scores and the P.V as bf16 tile products (f32 sums): on a CPU with
 * AMX-BF16 a prompt's attention is tile products, not 16-lane fmas (an f32 tile item ran at
 * ~0.85 of the fma peak, and the fmas were the whole of a long prompt's attention). The rows
 * and their softmax are the f32 item's (st: keys x rows, rows in lanes; the same online
 * softmax in log2 units, masks, softcap); what changes is the rounding of q, K, P and V to
 * bf16 before their products (simd_amx_bf16.h). Per 32-key block:
 *   scores  st^T = K Q^T:  A = 16 keys x 32 dims of K (rows as stored, converted), B = Q^T's
 *           pairs (dims 2p, 2p+1 of 16 rows; made once per item), C = 16 keys x 16 rows;
 *   P.V     O += P V:      A = 16 rows x 32 keys of P (st transposed, 16 x 16 at a time),
 *           B = V's pairs (keys 2p, 2p+1 of 16 values), C = 16 rows x 16 values of O, which
 *           stays in the item's o buffer (rescaled there by alpha when a row's max moved). */
/* The AMX item's running max is lazy: a row's reference moves only when a block's max passes
 * it by more than this (log2 units), so most blocks leave alpha at 1 and the O rows in memory
 * untouched (rescaling them was ~15% of an item). Any reference at or below the true max gives
 * the same softmax (o and l are both relative to it, and attn_emit passes it on with them);
 * the probabilities stay below 2^ATTN_AB_LAZY. */
#define ATTN_AB_LAZY 8.0f
static void attn_tile_item_ab(const attn_ctx *c, const attn_item *it, float *buf) {
    const int D = c->D, Dv = c->Dv, bs = c->bs, KVH = c->KVH, kvh = it->h0 / c->G;
    const int nt = it->tok1 - it->tok0, R = nt * (it->h1 - it->h0);
    const int nv = (R + 15) / 16, ldq = 16 * nv, ns = D / 32, ndv = Dv / 16;
    float *qt = buf;                                  /* D x ldq */
    float *o = qt + (long)ATTN_MAX_ROWS * D;          /* ldq x Dv */
    float *kf = o + (long)ATTN_MAX_ROWS * Dv;         /* bs x D */
    float *vf = kf + (long)bs * D;                    /* bs x Dv */
    float *st = vf + (long)bs * Dv;                   /* bs x ldq */
    float *m = st + (long)bs * ATTN_MAX_ROWS;
    float *l = m + ATTN_MAX_ROWS, *alpha = l + ATTN_MAX_ROWS;
    int32_t *qp = (int32_t *)(alpha + ATTN_MAX_ROWS);
    float *ab = buf + attn_ab_base(D, Dv, bs);
    ab += (16 - (((uintptr_t)ab >> 2) & 15)) & 15;   /* 64-byte boundary */
    uint16_t *qb = (uint16_t *)ab;                    /* nv x ns B tiles: q's bf16 */
    uint16_t *ql = qb + (long)ATTN_MAX_ROWS * D;      /* the same of q - bf16(q) */
    uint16_t *kb = ql + (long)ATTN_MAX_ROWS * D;      /* 32 keys x D: k's bf16 */
    uint16_t *kl = kb + 32L * D;                      /* k - bf16(k) */
    uint16_t *vb = kl + 32L * D;                      /* ndv B tiles (16 key pairs x 16 values) */
    uint16_t *vl = vb + 32L * Dv;                     /* the same of v - bf16(v) */
    uint16_t *pa = vl + 32L * Dv;                     /* nv A tiles (16 rows x 32 keys) */
    uint16_t *pl = pa + (long)ATTN_MAX_ROWS * 32;     /* the same of p - bf16(p) */
    const int r16 = c->kv_type == ATTN_KV_F16;
    const float qscale = c->scale * ATTN_LOG2E, cap = c->softcap * ATTN_LOG2E;  /* log2 units */
    int min_qp, max_qp, lo_all;
    attn_tile_rows_init(c, it, R, nt, ldq, m, l, qp, &min_qp, &max_qp, &lo_all);
    attn_tile_qt(c, it, R, nt, ldq, r16, qscale, qt);
    for (int rt = 0; rt < nv; rt++)
        for (int s = 0; s < ns; s++)
            for (int p = 0; p < 16; p++) {
                const __m512 q0 = _mm512_loadu_ps(qt + (long)(32 * s + 2 * p) * ldq + 16 * rt);
                const __m512 q1 = _mm512_loadu_ps(qt + (long)(32 * s + 2 * p + 1) * ldq + 16 * rt);
                _mm512_store_si512((void *)(qb + ((long)rt * ns + s) * 512 + p * 32), ab_pair16(q0, q1));
                _mm512_store_si512((void *)(ql + ((long)rt * ns + s) * 512 + p * 32),
                                   ab_pair16(_mm512_sub_ps(q0, ab_bf16_round(q0)), _mm512_sub_ps(q1, ab_bf16_round(q1))));
            }
    memset(o, 0, (size_t)ldq * Dv * sizeof(float));
    ab_config();
    const int32_t *table = c->tables + (long)it->seq * c->max_blocks;
    const long ks = (long)KVH * c->k_row, vs = (long)KVH * c->v_row;
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (int b = it->b0; b < it->b1; b++) {
        const int blk = table[b];
        if (blk < 0) continue;  /* freed (outside every window): never read */
        const int k0 = b * bs;
        int jlo, jhi;
        if (!attn_tile_block_keys(lo_all, max_qp, k0, bs, &jlo, &jhi)) continue;
        const int nk = jhi - jlo + 1, nkt = (nk + 15) / 16;
        const uint8_t *kbp = c->k + blk * c->k_bstride + (long)kvh * c->k_row;
        const uint8_t *vbp = c->v + blk * c->v_bstride + (long)kvh * c->v_row;
        const float *kp = NULL, *vp = NULL;
        long ldk = 0, ldv = 0;
        if (c->kv_type != ATTN_KV_F16) {  /* (f16: read in place below, f16 to bf16) */
            kp = attn_tile_block_k(c, blk, kvh, jlo, jhi, kf, &ldk);
            if (c->kv_type == ATTN_KV_F32) {
                vp = (const float *)(vbp + jlo * vs);
                ldv = vs / 4;
            } else {
                attn_load_rows(vbp, vs, c->kv_type, jlo, jhi + 1, Dv, vf, Dv);
                vp = vf + (long)jlo * Dv;
                ldv = Dv;
            }
        }
        attn_pf_pace pace = attn_tile_next_block(c, it, table, b, kvh);
        attn_pace_plan(&pace, 4);
        /* K rows to bf16 (keys past nk: zeros), V to pair tiles */
        const int f16 = c->kv_type == ATTN_KV_F16;
        const uint16_t *kh = (const uint16_t *)(kbp + jlo * ks), *vh = (const uint16_t *)(vbp + jlo * vs);
#define ATTN_AB_K(j, e) (f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kh + (j) * (ks / 2) + (e)))) \
                             : _mm512_loadu_ps(kp + (j) * ldk + (e)))
#define ATTN_AB_V(j, e) (f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vh + (j) * (vs / 2) + (e)))) \
                             : _mm512_loadu_ps(vp + (j) * ldv + (e)))
        for (int j = 0; j < 16 * nkt; j++)
            for (int s = 0; s < ns; s++) {
                __m512i w = _mm512_setzero_si512(), wl = w;
                if (j < nk) {
                    const __m512 a = ATTN_AB_K(j, 32 * s), b = ATTN_AB_K(j, 32 * s + 16);
                    w = (__m512i)_mm512_cvtne2ps_pbh(b, a);
                    wl = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, ab_bf16_round(b)), _mm512_sub_ps(a, ab_bf16_round(a)));
                }
                _mm512_store_si512((void *)(kb + (long)j * D + 32 * s), w);
                _mm512_store_si512((void *)(kl + (long)j * D + 32 * s), wl);
            }
        attn_pace_step(&pace);
        for (int dt = 0; dt < ndv; dt++)
            for (int p = 0; p < 16; p++) {
                const __m512 v0 = 2 * p < nk ? ATTN_AB_V(2 * p, 16 * dt) : zero;
                const __m512 v1 = 2 * p + 1 < nk ? ATTN_AB_V(2 * p + 1, 16 * dt) : zero;
                _mm512_store_si512((void *)(vb + (long)dt * 512 + p * 32), ab_pair16(v0, v1));
                _mm512_store_si512((void *)(vl + (long)dt * 512 + p * 32),
                                   ab_pair16(_mm512_sub_ps(v0, ab_bf16_round(v0)), _mm512_sub_ps(v1, ab_bf16_round(v1))));
            }
#undef ATTN_AB_K
#undef ATTN_AB_V
        /* scores: st[j][r], keys x rows */
        /* scores in three bf16 products, k q ~ kh qh + kh ql + kl qh: the high parts alone
         * (8 bits) moved an f32 model's logits 10x further from llama.cpp's (a score's
         * error is a probability's relative error); with the low parts a score is good to
         * ~16 bits. One key tile x two row tiles: C 0-1, A kh / kl 2-3, B 4-7. */
        for (int kt = 0; kt < nkt; kt++)
            for (int rt = 0; rt < nv; rt += 2) {
                const int tr = rt + 1 < nv;
                _tile_zero(0);
                if (tr) _tile_zero(1);
                for (int s = 0; s < ns; s++) {
                    const long o0 = ((long)rt * ns + s) * 512, o1 = o0 + (long)ns * 512;
                    _tile_loadd(2, kb + (long)kt * 16 * D + 32 * s, 2 * D);
                    _tile_loadd(3, kl + (long)kt * 16 * D + 32 * s, 2 * D);
                    _tile_loadd(4, qb + o0, 64);
                    _tile_loadd(5, ql + o0, 64);
                    _tile_dpbf16ps(0, 2, 4);
                    _tile_dpbf16ps(0, 2, 5);
                    _tile_dpbf16ps(0, 3, 4);
                    if (tr) {
                        _tile_loadd(6, qb + o1, 64);
                        _tile_loadd(7, ql + o1, 64);
                        _tile_dpbf16ps(1, 2, 6);
                        _tile_dpbf16ps(1, 2, 7);
                        _tile_dpbf16ps(1, 3, 6);
                    }
                }
                _tile_stored(0, st + (long)kt * 16 * ldq + 16 * rt, 4 * ldq);
                if (tr) _tile_stored(1, st + (long)kt * 16 * ldq + 16 * (rt + 1), 4 * ldq);
            }
        attn_pace_step(&pace);
        const int need_mask = !(k0 + jhi <= min_qp && (c->window <= 0 || max_qp - (k0 + jlo) < c->window));
        attn_tile_softmax(st, ldq, nv, R, nk, need_mask, qp, k0 + jlo, c->window, cap, m, l, alpha, NULL,
                          ATTN_AB_LAZY);
        attn_pace_step(&pace);
        /* P tiles (keys past nk: zeros) and O rescaled where a row's max moved */
        for (int rt = 0; rt < nv; rt++) {
            __m512 t0[16], t1[16];
            for (int j = 0; j < 16; j++) {
                t0[j] = j < nk ? _mm512_loadu_ps(st + (long)j * ldq + 16 * rt) : zero;
                t1[j] = 16 + j < nk ? _mm512_loadu_ps(st + (long)(16 + j) * ldq + 16 * rt) : zero;
            }
            attn_transpose16(t0);
            attn_transpose16(t1);
            for (int r = 0; r < 16; r++) {
                _mm512_store_si512((void *)(pa + (long)rt * 512 + r * 32), (__m512i)_mm512_cvtne2ps_pbh(t1[r], t0[r]));
                _mm512_store_si512((void *)(pl + (long)rt * 512 + r * 32),
                                   (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(t1[r], ab_bf16_round(t1[r])),
                                                                _mm512_sub_ps(t0[r], ab_bf16_round(t0[r]))));
            }
            const __m512 av = _mm512_loadu_ps(alpha + 16 * rt);
            unsigned moved = _mm512_cmp_ps_mask(av, one, _CMP_NEQ_UQ);
            while (moved) {
                const int r = __builtin_ctz(moved);
                moved &= moved - 1;
                const __m512 a = _mm512_set1_ps(alpha[16 * rt + r]);
                float *orow = o + (long)(16 * rt + r) * Dv;
                for (int d = 0; d < Dv; d += 16) _mm512_storeu_ps(orow + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), a));
            }
        }
        /* O += P V ~ ph vh + pl vh + ph vl (as the scores), O's tiles through the o buffer: one
         * row tile x two value tiles, C 0-1, A ph / pl 2-3, B 4-7 */
        for (int rt = 0; rt < nv; rt++) {
            _tile_loadd(2, pa + (long)rt * 512, 64);
            _tile_loadd(3, pl + (long)rt * 512, 64);
            for (int dt = 0; dt < ndv; dt += 2) {
                float *oc = o + (long)16 * rt * Dv + 16 * dt;
                _tile_loadd(0, oc, 4 * Dv);
                _tile_loadd(1, oc + 16, 4 * Dv);
                _tile_loadd(4, vb + (long)dt * 512, 64);
                _tile_loadd(5, vl + (long)dt * 512, 64);
                _tile_loadd(6, vb + (long)(dt + 1) * 512, 64);
                _tile_loadd(7, vl + (long)(dt + 1) * 512, 64);
                _tile_dpbf16ps(0, 2, 4);
                _tile_dpbf16ps(1, 2, 6);
                _tile_dpbf16ps(0, 3, 4);
                _tile_dpbf16ps(1, 3, 6);
                _tile_dpbf16ps(0, 2, 5);
                _tile_dpbf16ps(1, 2, 7);
                _tile_stored(0, oc, 4 * Dv);
                _tile_stored(1, oc + 16, 4 * Dv);
            }
        }
        attn_pace_rest(&pace);
    }
    _tile_release();
    for (int r = 0; r < R; r++)
        attn_emit(c, c->toks[it->tok0 + r % nt], it->h0 + r / nt, o + (long)r * Dv, m[r], l[r], it->chunk);
}

/* whether a tile item runs on AMX-BF16: the build and CPU have it, a block is 32 keys, heads
 * a whole number of tile steps, and enough rows to fill a tile's worth */
#define ATTN_AB_MIN_ROWS 16
static inline int attn_ab_item_ok(const attn_ctx *c, const attn_item *it) {
    const int R = (it->tok1 - it->tok0) * (it->h1 - it->h0);
    return ab_on && c->bs == 32 && c->D % 32 == 0 && c->Dv % 32 == 0 && R >= ATTN_AB_MIN_ROWS;
}
#else
static inline int attn_ab_item_ok(const attn_ctx *c, const attn_item *it) { (void)c; (void)it; return 0; }
static void attn_tile_item_ab(const attn_ctx *c, const attn_item *it, float *buf) { (void)c; (void)it; (void)buf; }
#endif

static void attn_run_item(const attn_ctx *c, const attn_item *it, float *buf) {
    if (it->kind == 2 && attn_ab_item_ok(c, it)) attn_tile_item_ab(c, it, buf);
    else if (it->kind != 1) attn_tile_item(c, it, buf);
    else attn_rows_item(c, it, buf);
}

#endif /* LLMCORE_SIMD_ATTENTION_H */
