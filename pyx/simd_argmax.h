/* The first maximum of logits rows, found while a decode step's head writes them.
 *
 * Greedy decoding needs only each row's argmax. A pass over the finished (m, n_vocab) logits
 * reads them back from L3 or memory (np.argmax: 0.8 ms of a 32-sequence SmolLM2 step, 3.7%);
 * here each head work item folds the rows it has just written (still in L1) into a running
 * maximum per logits row and thread, 16 lanes wide (lane l sees rows = l mod 16 of each
 * 16-row piece), and the step merges the threads' lanes at the end.
 *
 * Ties and order: a thread visits a logits row's vocabulary rows in increasing order (the
 * head's items go out in increasing order), a lane keeps a value only when it is strictly
 * greater, and the merges take the smaller row among equal maxima: the result is
 * np.argmax's, the first maximum. NaN never compares greater; a row that holds one, or
 * nothing above -inf, comes out as -1 (amax_row) for the caller to ask np.argmax (the
 * first NaN, or row 0).
 */
#ifndef LLMCORE_SIMD_ARGMAX_H
#define LLMCORE_SIMD_ARGMAX_H

#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* one logits row's running maximum for one thread (a cache line of values, one of rows) */
typedef struct {
    float v[16];      /* lane maxima */
    int32_t r[16];    /* the row of each lane's maximum (INT32_MAX: none yet) */
    int32_t nan;      /* a NaN was seen */
    int32_t _pad[15];
} amax_lanes;

static inline void amax_init(amax_lanes *a) {
    for (int l = 0; l < 16; l++) {
        a->v[l] = -INFINITY;
        a->r[l] = INT32_MAX;
    }
    a->nan = 0;
}

/* Fold rows [r0, r1) of one logits row y (indexed by vocabulary row) into a. Calls for one
 * (a, y) must come with increasing r0 (then ties keep the first row). */
static inline void amax_update(amax_lanes *a, const float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
#if defined(__AVX512F__)
    __m512 v = _mm512_loadu_ps(a->v);
    __m512i ri = _mm512_loadu_si512((const void *)a->r);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 un = 0;
    for (; r < r1; r += 16) {
        const __mmask16 m = r1 - r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (r1 - r)) - 1u);
        const __m512 x = _mm512_maskz_loadu_ps(m, y + r);
        const __mmask16 gt = _mm512_mask_cmp_ps_mask(m, x, v, _CMP_GT_OQ);
        un |= _mm512_mask_cmp_ps_mask(m, x, x, _CMP_UNORD_Q);
        v = _mm512_mask_mov_ps(v, gt, x);
        ri = _mm512_mask_mov_epi32(ri, gt, _mm512_add_epi32(_mm512_set1_epi32((int32_t)r), iota));
    }
    _mm512_storeu_ps(a->v, v);
    _mm512_storeu_si512((void *)a->r, ri);
    if (un) a->nan = 1;
#elif defined(__AVX2__)
    __m256 v0 = _mm256_loadu_ps(a->v), v1 = _mm256_loadu_ps(a->v + 8);
    __m256i i0 = _mm256_loadu_si256((const __m256i *)a->r), i1 = _mm256_loadu_si256((const __m256i *)(a->r + 8));
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int un = 0;
    for (; r + 16 <= r1; r += 16) {
        const __m256 x0 = _mm256_loadu_ps(y + r), x1 = _mm256_loadu_ps(y + r + 8);
        const __m256 g0 = _mm256_cmp_ps(x0, v0, _CMP_GT_OQ), g1 = _mm256_cmp_ps(x1, v1, _CMP_GT_OQ);
        un |= _mm256_movemask_ps(_mm256_cmp_ps(x0, x0, _CMP_UNORD_Q)) | _mm256_movemask_ps(_mm256_cmp_ps(x1, x1, _CMP_UNORD_Q));
        v0 = _mm256_blendv_ps(v0, x0, g0);
        v1 = _mm256_blendv_ps(v1, x1, g1);
        i0 = _mm256_blendv_epi8(i0, _mm256_add_epi32(_mm256_set1_epi32((int32_t)r), iota), _mm256_castps_si256(g0));
        i1 = _mm256_blendv_epi8(i1, _mm256_add_epi32(_mm256_set1_epi32((int32_t)(r + 8)), iota), _mm256_castps_si256(g1));
    }
    _mm256_storeu_ps(a->v, v0);
    _mm256_storeu_ps(a->v + 8, v1);
    _mm256_storeu_si256((__m256i *)a->r, i0);
    _mm256_storeu_si256((__m256i *)(a->r + 8), i1);
    if (un) a->nan = 1;
    for (int64_t e = r; e < r1; e++) {  /* the last piece's rows into their lanes */
        const int l = (int)(e - r);
        if (y[e] > a->v[l]) { a->v[l] = y[e]; a->r[l] = (int32_t)e; }
        else if (y[e] != y[e]) a->nan = 1;
    }
    r = r1;
#endif
    for (; r < r1; r++) {  /* plain C: lane 0 only */
        if (y[r] > a->v[0]) { a->v[0] = y[r]; a->r[0] = (int32_t)r; }
        else if (y[r] != y[r]) a->nan = 1;
    }
}

/* Merge b into a (lane by lane: the greater value, the smaller row among equals). */
static inline void amax_merge(amax_lanes *a, const amax_lanes *b) {
    for (int l = 0; l < 16; l++)
        if (b->v[l] > a->v[l] || (b->v[l] == a->v[l] && b->r[l] < a->r[l])) {
            a->v[l] = b->v[l];
            a->r[l] = b->r[l];
        }
    a->nan |= b->nan;
}

/* The first maximum's row over a's lanes; -1 when a saw a NaN (or no row at all). */
static inline int64_t amax_row(const amax_lanes *a) {
    int best = -1;
    for (int l = 0; l < 16; l++) {
        if (a->r[l] == INT32_MAX) continue;
        if (best < 0 || a->v[l] > a->v[best] || (a->v[l] == a->v[best] && a->r[l] < a->r[best])) best = l;
    }
    return a->nan || best < 0 ? -1 : (int64_t)a->r[best];
}

#endif /* LLMCORE_SIMD_ARGMAX_H */
