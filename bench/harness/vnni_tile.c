/* What a block of the decode matmul's token tile costs on this CPU, in L1 (an exploration,
 * not the engine's code; simd_quants.h's lq_kernel_vnni_tile_nt is the real kernel):
 * 8 tokens x 16 output rows x one 32-value Q4 block: 64 vpdpbusd against broadcast
 * activation dwords, then the float epilogue (convert, scale product, fma) and the Q4_1
 * min term (one more fma a token).
 *
 *     gcc -O3 -march=native bench/harness/vnni_tile.c -o /tmp/vnni_tile && /tmp/vnni_tile
 *
 * Needs AVX-512 VNNI. Prints TSC ticks per block-tile for each variant and its share of the
 * vpdpbusd-only bound measured first (12 independent chains, operands in registers), and
 * the rate of a vpdpbusd whose broadcast is the instruction's memory operand ({1to16})
 * against a separate vpbroadcastd load. The last variant models a Q4_1 min term summed in integers
 * (int16 mins of two blocks against the tokens' int16 block sums, one vpdpwssd a token a
 * block pair) instead of an fma a token a block. bench/RESULTS.md (session 29) has the figures. */
#include <stdint.h>
#include <stdio.h>
#include <x86intrin.h>

#define IT 5000000L
#define U _Pragma("GCC unroll 64")

static int32_t rec[80] __attribute__((aligned(64)));   /* a[8][8] dwords, dA[8], sA[8] */
static uint8_t wb[320] __attribute__((aligned(64)));   /* 256 B nibbles, f16 d[16], f16 m[16] */

enum { EPI = 1, MIN = 2, SPLIT = 4, IMIN = 8 };

/* one block-tile: f[t] += the block's dot products of token t, as the variant says */
static inline __attribute__((always_inline)) void block_tile(const int mode, __m512 *f, const int32_t *a,
                                                              const uint8_t *blk, __m512i *accm, const int odd) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i acc[8];
    if (mode & SPLIT) {  /* chunks 0-3 and 4-7 in two chains a token, summed once */
        __m512i a0[8], a1[8];
        U for (int t = 0; t < 8; t++) a0[t] = a1[t] = _mm512_setzero_si512();
        U for (int c = 0; c < 4; c++) {
            const __m512i v = _mm512_loadu_si512(blk + 64 * c);
            const __m512i wl = _mm512_and_si512(v, m4), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            U for (int t = 0; t < 8; t++) a0[t] = _mm512_dpbusd_epi32(a0[t], wl, _mm512_set1_epi32(a[c * 8 + t]));
            U for (int t = 0; t < 8; t++) a1[t] = _mm512_dpbusd_epi32(a1[t], wh, _mm512_set1_epi32(a[(c + 4) * 8 + t]));
        }
        U for (int t = 0; t < 8; t++) acc[t] = _mm512_add_epi32(a0[t], a1[t]);
    } else {  /* the kernel's order: the 8 chunks unpacked, one chain of 8 a token */
        __m512i w[8];
        U for (int c = 0; c < 4; c++) {
            const __m512i v = _mm512_loadu_si512(blk + 64 * c);
            w[c] = _mm512_and_si512(v, m4);
            w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        U for (int t = 0; t < 8; t++) acc[t] = _mm512_setzero_si512();
        U for (int c = 0; c < 8; c++) U for (int t = 0; t < 8; t++)
            acc[t] = _mm512_dpbusd_epi32(acc[t], w[c], _mm512_set1_epi32(a[c * 8 + t]));
    }
    const float *dA = (const float *)(a + 64), *sA = (const float *)(a + 72);
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 256)));
    if (mode & EPI) {
        U for (int t = 0; t < 8; t++)
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_mul_ps(dv, _mm512_set1_ps(dA[t])), f[t]);
    } else {  /* keep the sums live without float work */
        U for (int t = 0; t < 8; t++) f[t] = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(f[t]), acc[t]));
    }
    if ((mode & IMIN) && odd) {  /* the min term in integers: int16 mins of 2 blocks x their int16 sums */
        const __m512i mp = _mm512_loadu_si512(blk + 256);
        U for (int t = 0; t < 8; t++) accm[t] = _mm512_dpwssd_epi32(accm[t], mp, _mm512_set1_epi32(a[72 + t]));
    }
    if (mode & MIN) {
        const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 288)));
        U for (int t = 0; t < 8; t++) f[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sA[t]), f[t]);
    }
}

static double run(const int mode) {
    __m512 f[8];
    __m512i accm[8];
    for (int t = 0; t < 8; t++) { f[t] = _mm512_setzero_ps(); accm[t] = _mm512_setzero_si512(); }
    const unsigned long long t0 = __rdtsc();
    for (long it = 0; it < IT; it += 2) {  /* two block-tiles an iteration (IMIN: a pair of blocks) */
        const int32_t *a = rec;
        const uint8_t *b = wb;
        __asm__ volatile("" : "+r"(a), "+r"(b));
        block_tile(mode, f, a, b, accm, 0);
        __asm__ volatile("" : "+r"(a), "+r"(b));  /* (not the same loads twice to the compiler) */
        block_tile(mode, f, a, b, accm, 1);
    }
    const double t = (__rdtsc() - t0) / (double)IT;
    for (int i = 0; i < 8; i++) __asm__ volatile("" ::"v"(accm[i]));
    float s = 0;
    for (int i = 0; i < 8; i++) s += f[i][0];
    __asm__ volatile("" ::"x"(s));
    return t;
}

int main(void) {
    for (int i = 0; i < 64; i++) rec[i] = i * 0x01020304;
    for (int i = 64; i < 80; i++) ((float *)rec)[i] = 0.001f;
    for (int i = 0; i < 320; i++) wb[i] = (uint8_t)(i * 7);
    for (int i = 256; i < 320; i += 2) { wb[i] = 0; wb[i + 1] = 0x1c; }  /* f16 scales ~0.004 */
    /* the bound: vpdpbusd alone, 12 chains, register operands */
    __m512i x = _mm512_set1_epi32(0x01010101), acc[12];
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i);
    unsigned long long t0 = __rdtsc();
    for (long it = 0; it < 4 * IT; it++) {
        __asm__ volatile("" : "+v"(x));
        U for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], x, x);
    }
    const double dp_tick = 12.0 / ((__rdtsc() - t0) / (double)(4 * IT));
    for (int i = 0; i < 12; i++) __asm__ volatile("" ::"v"(acc[i]));
    /* a broadcast as the memory operand against a separate load */
    double sep, emb;
    {
        __m512i a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm512_set1_epi32(i);
        t0 = __rdtsc();
        for (long it = 0; it < IT; it++) {
            const int32_t *b = rec;
            __asm__ volatile("" : "+v"(x), "+r"(b));
            U for (int c = 0; c < 8; c++) U for (int i = 0; i < 8; i++)
                a[i] = _mm512_dpbusd_epi32(a[i], x, _mm512_set1_epi32(b[c * 8 + i]));
        }
        sep = 64.0 / ((__rdtsc() - t0) / (double)IT);
        for (int i = 0; i < 8; i++) __asm__ volatile("" ::"v"(a[i]));
        t0 = __rdtsc();
        for (long it = 0; it < IT; it++) {
            const int32_t *b = rec;
            __asm__ volatile("" : "+v"(x), "+r"(b));
            U for (int c = 0; c < 8; c++) U for (int i = 0; i < 8; i++)
                __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(a[i]) : "v"(x), "m"(b[c * 8 + i]));
        }
        emb = 64.0 / ((__rdtsc() - t0) / (double)IT);
        for (int i = 0; i < 8; i++) __asm__ volatile("" ::"v"(a[i]));
    }
    printf("vpdpbusd a TSC tick: registers %.2f | vpbroadcastd load + register %.2f | {1to16} memory operand %.2f\n",
           dp_tick, sep, emb);
    const double bound = 64.0 / dp_tick;
    static const struct { int mode; const char *what; } V[] = {
        {0, "dot products only"},
        {EPI, "+ convert, scale product, fma (Q4_0 / Q8_0 epilogue)"},
        {EPI | MIN, "+ the min term's fma (Q4_1, the engine's kernel)"},
        {SPLIT, "two chains a token, dot products only"},
        {SPLIT | EPI | MIN, "two chains a token, Q4_1"},
        {EPI | IMIN, "Q4_1 with the min term in integers (vpdpwssd, 2 blocks)"},
    };
    for (int rep = 0; rep < 2; rep++)
        for (unsigned i = 0; i < sizeof V / sizeof V[0]; i++) {
            const double t = run(V[i].mode);
            printf("%-56s %6.2f ticks a block-tile (%.2f of the vpdpbusd bound)\n", V[i].what, t, bound / t);
        }
    return 0;
}
