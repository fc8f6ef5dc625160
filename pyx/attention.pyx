# cython: freethreading_compatible=True
"""Attention over the paged KV cache: the two kernels of an attention layer after its fused
q/k/v projection. ``qkv_post`` normalises and rotates q and k and writes k and v into their
cache slots; ``attention`` computes softmax(q k^T * scale) v over each sequence's blocks.

Called through llmcore/nn.py (and the fused path of llmcore/models/layers.py), which own
the API contract and the thread count. KV pools are bytes, shape (n_blocks, block_size *
n_kv_heads * row_nbytes): row (token t of a block, kv head h) starts at byte
(t * n_kv_heads + h) * row_nbytes of its block (formats in kv_rows.pxd). The micro-kernels
are in simd_attention.h.
"""
from cython.parallel cimport parallel, prange
from libc.math cimport INFINITY, expf, powf, tanhf
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

import numpy as np

from kv_rows cimport T_F16, load_row, store_row
from norms cimport rms_row
from rope cimport rope_apply, rope_cos_sin
from simd cimport simd_dot, simd_f16_round_row

cdef extern from "simd_attention.h" nogil:
    void attn_scores(const float *q, int ldq, int R, const float *kt, int D, int bs,
                     float scale, float *s, int ldS)
    void attn_prefetch_rows(const uint8_t *p, long stride, int n, int row_bytes)
    void attn_pv(float *acc, float f, const float *p, const float *v, int n, int Dv)
    float attn_max_sumexp(const float *s, int n, double *sum)
    void attn_probs(const float *s, float *p, int n, float m, float inv, int r16)
    int attn_scores_f16_rows(const float *q, int R, const uint16_t *k, long kstride, int n, int D,
                             float scale, float *s, int ldS, const uint8_t *pf, long pfstride, int pfbytes, int vd)
    float *attn_lane_scratch(size_t nfloats)
    int attn_have_pv_lanes(int Dv)
    void attn_pv_lanes_f16(float *accl, int R, int NL, const float *p, int ldp, const uint16_t *v,
                           long vstride, int n, int Dv, long pos0)
    void attn_pv_lanes_reduce(const float *accl, int R, int NL, int Dv, float *acc, int ldacc)
    int attn_pv_f16_rows(float *acc, int ldacc, int R, const float *p, int ldp, const uint16_t *v,
                         long vstride, int n, int Dv, const uint8_t *pf, long pfstride, int pfbytes)

# rows per attention work item (queries x heads of one kv head); K/V blocks are read once
# per tile. Partial-sum splits along the keys keep decode of a few long sequences parallel.
cdef enum:
    TILE_ROWS = 48
    SPLIT_MIN_ITEMS = 32
    SPLIT_MIN_BLOCKS = 8
    SMALL_R = 8
    MIN_PARALLEL_KV_BYTES = 256 * 1024
    PF_BLOCKS = 2  # K/V blocks prefetched ahead of the one being read


def qkv_post(const float[:, :] qkv, float[:, :, ::1] q_out, uint8_t[:, ::1] k_pool, uint8_t[:, ::1] v_pool,
             int kv_type, int block_size, int n_kv_heads, int k_row, int v_row, int Dv,
             const int32_t[:, ::1] block_tables, const int32_t[::1] seg_start, const int32_t[::1] positions,
             int n_rot, float base, bint neox, float freq_scale,
             const float[::1] q_norm, const float[::1] k_norm, float eps, int n_threads=1):
    """After the fused q/k/v projection, in one pass per token: q (and k) per-head RMS norm,
    rope on q and k (one cos/sin table per position), q written contiguous to q_out, k and v
    stored (quantized) into their block slots. Same arithmetic as rms_norm + rope + kv_store.
    Returns the number of tokens whose position maps to no block; then nothing is written.

    qkv : float32 (N, H*D + KVH*D + KVH*Dv), last axis contiguous: q, k, v of each token
    q_out : float32 (N, H, D), written
    k_pool, v_pool : uint8 (n_blocks, block_size * KVH * k_row / v_row), updated in place
    kv_type : kv_rows.F32, F16, Q8_0 or Q4_0; k_row, v_row: bytes of one row; Dv: v head dim
    block_tables : int32 (S, max_blocks); seg_start : int32 (S + 1,); positions : int32 (N,)
    n_rot, base, neox, freq_scale : rope (as rope.rope, no freq factors)
    q_norm, k_norm : float32 (D,) or None: per-head RMS norm weights (eps)
    n_threads : OpenMP threads over tokens (small inputs run on one)
    """
    cdef Py_ssize_t N = q_out.shape[0], i
    cdef int H = <int>q_out.shape[1], D = <int>q_out.shape[2], KVH = n_kv_heads
    cdef int S = <int>seg_start.shape[0] - 1, nb_seq = <int>block_tables.shape[1], nb = <int>k_pool.shape[0]
    cdef int h, p, s, bad = 0
    cdef Py_ssize_t r
    if N == 0:
        return 0
    if qkv.shape[0] != N or qkv.shape[1] != H * D + KVH * D + KVH * Dv or qkv.strides[1] != 4:
        raise ValueError("qkv_post: qkv must be (N, H*D + KVH*D + KVH*Dv) with a contiguous last axis")
    if positions.shape[0] != N or S <= 0 or seg_start[0] != 0 or seg_start[S] != N:
        raise ValueError("qkv_post: positions / seg_start do not match q")
    if n_rot > D or n_rot % 2:
        raise ValueError("qkv_post: n_rot must be even and <= head_dim")
    cdef int32_t *blk = <int32_t *>malloc(N * sizeof(int32_t))
    if blk == NULL:
        raise MemoryError()
    for s in range(S):
        if seg_start[s + 1] < seg_start[s]:
            free(blk)
            raise ValueError("qkv_post: seg_start must be non-decreasing")
        for r in range(seg_start[s], seg_start[s + 1]):
            p = positions[r]
            blk[r] = block_tables[s, p // block_size] if 0 <= p < nb_seq * block_size else -1
            if blk[r] < 0 or blk[r] >= nb:
                bad += 1
    if bad:
        free(blk)
        return bad
    cdef float theta_scale = powf(base, -2.0 / n_rot) if n_rot > 0 else 1.0
    cdef const float *qn = &q_norm[0] if q_norm is not None else NULL
    cdef const float *kn = &k_norm[0] if k_norm is not None else NULL
    cdef const float *src
    cdef float *qo
    cdef float *tmp = NULL
    cdef float *cs = NULL
    cdef Py_ssize_t qs = qkv.strides[0] // 4
    cdef const float *base_p = &qkv[0, 0]
    cdef float *qop = &q_out[0, 0, 0]
    cdef uint8_t *kp = &k_pool[0, 0]
    cdef uint8_t *vp = &v_pool[0, 0]
    cdef Py_ssize_t kbs = k_pool.strides[0], vbs = v_pool.strides[0]
    cdef int nt = n_threads if N * (H + KVH) * D >= 32768 and n_threads > 1 else 1
    with nogil, parallel(num_threads=nt):
        tmp = <float *>malloc((D + n_rot + 16) * sizeof(float))
        cs = tmp + D
        for i in prange(N, schedule='static'):
            src = base_p + i * qs
            p = positions[i]
            if n_rot > 0:
                rope_cos_sin(<float>p, n_rot, theta_scale, freq_scale, NULL, cs)
            qo = qop + i * H * D
            memcpy(qo, src, H * D * sizeof(float))
            for h in range(H):
                if qn != NULL:
                    rms_row(qo + h * D, NULL, qn, eps, qo + h * D, D)
                if n_rot > 0:
                    rope_apply(qo + h * D, n_rot, neox, cs)
            for h in range(KVH):
                memcpy(tmp, src + H * D + h * D, D * sizeof(float))
                if kn != NULL:
                    rms_row(tmp, NULL, kn, eps, tmp, D)
                if n_rot > 0:
                    rope_apply(tmp, n_rot, neox, cs)
                store_row(tmp, kv_type, kp + blk[i] * kbs + ((p % block_size) * KVH + h) * k_row, D)
                store_row(src + H * D + KVH * D + h * Dv, kv_type,
                          vp + blk[i] * vbs + ((p % block_size) * KVH + h) * v_row, Dv)
        free(tmp)
    free(blk)
    return 0


# ---- attention ---------------------------------------------------------------------------
#
# Exact softmax in two passes, like ggml with flash attention off: scores of a row for all
# its keys first (scaled after the dot product, soft-capped, masked), then the probabilities
# p = exp(s - max) * (1 / sum) -- rounded to f16 for an F16 cache, as ggml's V matmul
# converts them -- and P.V. For an F16 cache the query is rounded to f16 too (the f32
# operand of ggml's f16 K.Q matmul). Work items are (sequence, kv head, query tile, key
# split); a split item stores its scores in a shared arena, the row max / sum are combined
# over the splits, then each split accumulates its part of P.V and the parts are summed.

ctypedef struct AttnArgs:
    const float *q          # (N, H, D)
    float *out              # (N, H, Dv)
    const uint8_t *k        # pools, bytes
    const uint8_t *v
    Py_ssize_t k_bstride    # bytes per block
    Py_ssize_t v_bstride
    int k_row, v_row        # bytes per (token, kv head) row
    int kv_type, bs, KVH, H, G, D, Dv
    const int32_t *tables   # (S, max_blocks)
    int max_blocks
    const int32_t *q_pos    # (N,)
    float scale, softcap
    int window
    const float *sinks      # (H,) or NULL
    float *partial          # per split slot: R_max * Dv acc, R_max max, R_max sum
    float *arena            # split slots' scores
    const int64_t *slot_off # (n_slots,) offset of a slot's scores in arena
    float *gstat            # per group: R_max max, R_max 1/sum
    const int32_t *slot_grp # (n_slots,) group of a slot
    int R_max
    Py_ssize_t loc_len      # per-thread scores buffer (floats) for unsplit items
    int vd                  # 1-token batch: llama.cpp's vec_dot_f16 summation order, else tinyBLAS's


cdef inline void _row_range(const AttnArgs *a, int qp, int k0, int *jlo, int *jhi) noexcept nogil:
    cdef int lo = (qp - a.window + 1 - k0) if a.window > 0 else 0
    cdef int hi = qp - k0
    if lo < 0:
        lo = 0
    if hi > a.bs - 1:
        hi = a.bs - 1
    jlo[0] = lo
    jhi[0] = hi


cdef inline void _fill_ninf(float *Sb, int R, int ldS, int j0, int j1) noexcept nogil:
    cdef int rr, j
    for rr in range(R):
        for j in range(j0, j1):
            Sb[rr * ldS + j] = -INFINITY


cdef inline void _scores_block(const AttnArgs *a, const float *Qt, int R, int blk, int kvh, int lo, int hi,
                               float *tmp, float *Kt, float *Sb, int ldS) noexcept nogil:
    """Scores of keys lo..hi of one block (R < SMALL_R: dots; else: Kt filled for attn_scores)."""
    cdef int j, rr, c, D = a.D, bs = a.bs
    cdef const uint8_t *row
    for j in range(lo, hi + 1):
        row = a.k + blk * a.k_bstride + (<Py_ssize_t>j * a.KVH + kvh) * a.k_row
        load_row(row, a.kv_type, tmp, D)
        if R < SMALL_R:
            for rr in range(R):
                Sb[rr * ldS + j] = simd_dot(Qt + rr * D, tmp, D) * a.scale
        else:
            for c in range(D):
                Kt[c * bs + j] = tmp[c]


cdef void _item_scores(const AttnArgs *a, const int32_t *it, float *buf, float *S, int ldS) noexcept nogil:
    """Scores of the item's rows for keys [kb0*bs, kb1*bs): S[rr*ldS + j - kb0*bs], -inf where
    masked. buf: per-thread scratch (Qt, Kt, tmp)."""
    cdef int s = it[0], kvh = it[1], t0 = it[2], t1 = it[3], kb0 = it[4], kb1 = it[5]
    cdef int G = a.G, D = a.D, bs = a.bs, R = (t1 - t0) * G
    cdef float *Qt = buf
    cdef float *Kt = Qt + a.R_max * D
    cdef float *tmp = Kt + D * bs
    cdef float *Sb
    cdef int rr, t, h, j, b, blk, k0, jlo, jhi, lo_all, hi_all, nxt, c
    cdef bint fast
    cdef const uint8_t *pf = NULL
    cdef const int32_t *table = a.tables + <Py_ssize_t>s * a.max_blocks
    cdef const uint8_t *row
    cdef float sc = a.softcap
    for rr in range(R):
        t = t0 + rr // G
        h = kvh * G + rr % G
        if a.kv_type == T_F16:
            simd_f16_round_row(a.q + (<Py_ssize_t>t * a.H + h) * D, Qt + rr * D, D)
        else:
            memcpy(Qt + rr * D, a.q + (<Py_ssize_t>t * a.H + h) * D, D * sizeof(float))
    for b in range(kb0, kb1):
        Sb = S + (b - kb0) * bs
        blk = table[b]
        if blk < 0:
            _fill_ninf(Sb, R, ldS, 0, bs)
            continue  # freed block (outside every window): never read
        k0 = b * bs
        fast = R < SMALL_R and a.kv_type == T_F16
        for c in range(1 if b == kb0 else PF_BLOCKS, PF_BLOCKS + 1):  # PF_BLOCKS blocks ahead
            nxt = table[b + c] if b + c < kb1 else -1
            pf = NULL
            if nxt >= 0:
                pf = a.k + nxt * a.k_bstride + kvh * a.k_row
                if not fast or c < PF_BLOCKS:
                    attn_prefetch_rows(pf, a.KVH * a.k_row, bs, a.k_row)
                    pf = NULL
        lo_all = bs
        hi_all = -1
        for t in range(t0, t1):
            _row_range(a, a.q_pos[t], k0, &jlo, &jhi)
            if jhi >= jlo:
                if jlo < lo_all:
                    lo_all = jlo
                if jhi > hi_all:
                    hi_all = jhi
        if hi_all < lo_all:
            _fill_ninf(Sb, R, ldS, 0, bs)
            continue
        # f16 keys read in place, for every R: each score is a 16-lane fma chain over the head
        # dim reduced in _mm512_reduce_add_ps order, the order of llama.cpp's f16 K.Q matmul
        # (tinyBLAS), so scores (and the near-ties of the f16-rounded probabilities) are
        # bit-identical to llama.cpp's in prefill as in decode
        if (a.kv_type == T_F16 and attn_scores_f16_rows(
                Qt, R, <const uint16_t *>(a.k + blk * a.k_bstride + (<Py_ssize_t>lo_all * a.KVH + kvh) * a.k_row),
                a.KVH * (a.k_row // 2), hi_all - lo_all + 1, D, a.scale, Sb + lo_all, ldS,
                pf, a.KVH * a.k_row, a.k_row, a.vd)):
            pass
        else:
            _scores_block(a, Qt, R, blk, kvh, lo_all, hi_all, tmp, Kt, Sb, ldS)
            if R >= SMALL_R:
                attn_scores(Qt, D, R, Kt, D, bs, a.scale, Sb, ldS)
        for rr in range(R):
            _row_range(a, a.q_pos[t0 + rr // G], k0, &jlo, &jhi)
            if jhi < jlo:
                _fill_ninf(Sb + rr * ldS, 1, ldS, 0, bs)
                continue
            _fill_ninf(Sb + rr * ldS, 1, ldS, 0, jlo)
            _fill_ninf(Sb + rr * ldS, 1, ldS, jhi + 1, bs)
            if sc > 0:
                for j in range(jlo, jhi + 1):
                    Sb[rr * ldS + j] = sc * tanhf(Sb[rr * ldS + j] / sc)


cdef void _item_pv(const AttnArgs *a, const int32_t *it, float *buf, float *S, int ldS,
                   const float *M, const float *inv, float *acc) noexcept nogil:
    """acc[rr*Dv:...] = sum_j p[rr, j] v_j over the item's keys; p from S (overwritten)."""
    cdef int s = it[0], kvh = it[1], t0 = it[2], t1 = it[3], kb0 = it[4], kb1 = it[5]
    cdef int G = a.G, Dv = a.Dv, bs = a.bs, R = (t1 - t0) * G
    cdef float *Vb = buf + a.R_max * a.D + a.D * bs + a.D + a.Dv
    cdef float *Sb
    cdef int rr, j, b, blk, nxt, lo, hi, c
    cdef bint fast
    cdef const uint8_t *pf = NULL
    cdef int r16 = a.kv_type == T_F16
    cdef const int32_t *table = a.tables + <Py_ssize_t>s * a.max_blocks
    cdef Py_ssize_t n = (kb1 - kb0) * bs
    # f16 V: per-lane partial sums in llama.cpp's order (see attn_pv_lanes_f16), combined at the end
    cdef int NL = 64 if a.vd else 16
    cdef float *accl = NULL
    if r16 and attn_have_pv_lanes(Dv):
        accl = attn_lane_scratch(<size_t>R * NL * Dv)
    for rr in range(R):
        for j in range(Dv):
            acc[rr * Dv + j] = 0.0
        if M[rr] == -INFINITY:
            for j in range(n):
                S[rr * ldS + j] = 0.0
        else:
            attn_probs(S + rr * ldS, S + rr * ldS, <int>n, M[rr], inv[rr], r16)
    for b in range(kb0, kb1):
        blk = table[b]
        if blk < 0:
            continue
        fast = R < SMALL_R and r16
        for c in range(1 if b == kb0 else PF_BLOCKS, PF_BLOCKS + 1):
            nxt = table[b + c] if b + c < kb1 else -1
            pf = NULL
            if nxt >= 0:
                pf = a.v + nxt * a.v_bstride + kvh * a.v_row
                if not fast or c < PF_BLOCKS:
                    attn_prefetch_rows(pf, a.KVH * a.v_row, bs, a.v_row)
                    pf = NULL
        Sb = S + (b - kb0) * bs
        # keys of this block with a non-zero probability in some row
        lo = bs
        hi = -1
        for rr in range(R):
            j = 0
            while j < lo and Sb[rr * ldS + j] == 0.0:
                j += 1
            if j < lo:
                lo = j
            j = bs - 1
            while j > hi and Sb[rr * ldS + j] == 0.0:
                j -= 1
            if j > hi:
                hi = j
        if hi < lo:
            continue
        if accl != NULL:
            attn_pv_lanes_f16(accl, R, NL, Sb + lo, ldS,
                            <const uint16_t *>(a.v + blk * a.v_bstride + (<Py_ssize_t>lo * a.KVH + kvh) * a.v_row),
                            a.KVH * (a.v_row // 2), hi - lo + 1, Dv, <long>b * bs + lo)
            continue
        if (fast and attn_pv_f16_rows(
                acc, Dv, R, Sb + lo, ldS,
                <const uint16_t *>(a.v + blk * a.v_bstride + (<Py_ssize_t>lo * a.KVH + kvh) * a.v_row),
                a.KVH * (a.v_row // 2), hi - lo + 1, Dv, pf, a.KVH * a.v_row, a.v_row)):
            continue  # decode: f16 values read in place
        for j in range(lo, hi + 1):
            load_row(a.v + blk * a.v_bstride + (<Py_ssize_t>j * a.KVH + kvh) * a.v_row, a.kv_type,
                      Vb + j * Dv, Dv)
        for rr in range(R):
            attn_pv(acc + rr * Dv, 1.0, Sb + rr * ldS + lo, Vb + lo * Dv, hi - lo + 1, Dv)
    if accl != NULL:
        attn_pv_lanes_reduce(accl, R, NL, Dv, acc, Dv)


cdef inline void _softmax_stats(const AttnArgs *a, int h, float m, double l, float *M, float *inv) noexcept nogil:
    """Row max M and 1/sum over all keys (and the sink of head h, if any)."""
    cdef float sk
    if a.sinks != NULL:
        sk = a.sinks[h]
        if sk > m:
            l = l * expf(m - sk) if m != -INFINITY else 0.0
            m = sk
        l = l + expf(sk - m)
    M[0] = m
    inv[0] = <float>(1.0 / <double>l) if l > 0 else 0.0


cdef void _run_item(const AttnArgs *a, const int32_t *it, float *buf, float *S) noexcept nogil:
    """An unsplit item, start to end: scores, softmax, P.V, written to out."""
    cdef int t0 = it[2], t1 = it[3], kvh = it[1], G = a.G, R = (t1 - t0) * G, rr, t, h
    cdef int ldS = (it[5] - it[4]) * a.bs
    cdef float *acc = buf + a.R_max * a.D + a.D * a.bs + a.D + a.Dv + a.bs * a.Dv
    cdef float *M = acc + a.R_max * a.Dv
    cdef float *inv = M + a.R_max
    cdef double l
    _item_scores(a, it, buf, S, ldS)
    for rr in range(R):
        h = kvh * G + rr % G
        M[rr] = attn_max_sumexp(S + rr * ldS, ldS, &l)
        _softmax_stats(a, h, M[rr], l, M + rr, inv + rr)
    _item_pv(a, it, buf, S, ldS, M, inv, acc)
    for rr in range(R):
        t = t0 + rr // G
        h = kvh * G + rr % G
        memcpy(a.out + (<Py_ssize_t>t * a.H + h) * a.Dv, acc + rr * a.Dv, a.Dv * sizeof(float))


cdef void _split_scores(const AttnArgs *a, const int32_t *it, float *buf) noexcept nogil:
    cdef int slot = it[6], R = (it[3] - it[2]) * a.G, rr
    cdef int ldS = (it[5] - it[4]) * a.bs
    cdef float *S = a.arena + a.slot_off[slot]
    cdef float *st = a.partial + <Py_ssize_t>slot * a.R_max * (a.Dv + 2) + a.R_max * a.Dv
    cdef double l
    _item_scores(a, it, buf, S, ldS)
    for rr in range(R):
        st[rr] = attn_max_sumexp(S + rr * ldS, ldS, &l)
        st[a.R_max + rr] = <float>l


cdef void _split_stats(const AttnArgs *a, const int32_t *grp, int gi) noexcept nogil:
    """Combine the splits' (max, sum) of group gi = [kvh, t0, t1, slot0, n]."""
    cdef int kvh = grp[0], slot0 = grp[3], ns = grp[4], R = (grp[2] - grp[1]) * a.G, rr, k
    cdef Py_ssize_t stride = <Py_ssize_t>a.R_max * (a.Dv + 2)
    cdef float m, l, mk
    cdef const float *st
    cdef float *gs = a.gstat + <Py_ssize_t>gi * 2 * a.R_max
    for rr in range(R):
        m = -INFINITY
        for k in range(ns):
            mk = a.partial[(slot0 + k) * stride + a.R_max * a.Dv + rr]
            if mk > m:
                m = mk
        l = 0.0
        if m != -INFINITY:
            for k in range(ns):
                st = a.partial + (slot0 + k) * stride + a.R_max * a.Dv
                if st[rr] != -INFINITY:
                    l = l + st[a.R_max + rr] * expf(st[rr] - m)
        _softmax_stats(a, kvh * a.G + rr % a.G, m, l, gs + rr, gs + a.R_max + rr)


cdef void _split_pv(const AttnArgs *a, const int32_t *it, float *buf) noexcept nogil:
    cdef int slot = it[6]
    cdef int ldS = (it[5] - it[4]) * a.bs
    cdef const float *gs = a.gstat + <Py_ssize_t>a.slot_grp[slot] * 2 * a.R_max
    _item_pv(a, it, buf, a.arena + a.slot_off[slot], ldS, gs, gs + a.R_max,
             a.partial + <Py_ssize_t>slot * a.R_max * (a.Dv + 2))


cdef void _split_sum(const AttnArgs *a, const int32_t *grp) noexcept nogil:
    cdef int kvh = grp[0], t0 = grp[1], t1 = grp[2], slot0 = grp[3], ns = grp[4]
    cdef int G = a.G, Dv = a.Dv, R = (t1 - t0) * G, rr, k, c, t, h
    cdef Py_ssize_t stride = <Py_ssize_t>a.R_max * (Dv + 2)
    cdef float *dst
    for rr in range(R):
        t = t0 + rr // G
        h = kvh * G + rr % G
        dst = a.out + (<Py_ssize_t>t * a.H + h) * Dv
        memcpy(dst, a.partial + slot0 * stride + rr * Dv, Dv * sizeof(float))
        for k in range(1, ns):
            for c in range(Dv):
                dst[c] = dst[c] + a.partial[(slot0 + k) * stride + rr * Dv + c]


def attention(const float[:, :, ::1] q, const uint8_t[:, ::1] k_pool, const uint8_t[:, ::1] v_pool,
              int kv_type, int block_size, int n_kv_heads, int k_row, int v_row, int Dv,
              const int32_t[:, ::1] block_tables, const int32_t[::1] seg_start, const int32_t[::1] q_pos,
              float scale, int window, float softcap, const float[::1] sinks, float[:, :, ::1] out,
              int n_threads=1):
    """out = softmax(q k^T * scale, masked) v for each query row, over its sequence's blocks.

    q : float32 (N, H, D); rows seg_start[s]:seg_start[s+1] belong to sequence s
    k_pool, v_pool : uint8 (n_blocks, block_size * KVH * k_row / v_row)
    kv_type : kv_rows.F32, F16, Q8_0 or Q4_0; k_row, v_row: bytes of one row; Dv: v head dim
    block_tables : int32 (S, max_blocks), -1 for freed blocks (never read)
    seg_start : int32 (S + 1,), non-decreasing from 0 to N
    q_pos : int32 (N,): query i sees keys j <= q_pos[i] (and q_pos[i] - j < window if window)
    softcap : > 0: scores become softcap * tanh(score / softcap)
    sinks : float32 (H,) or None: an extra logit per head in the softmax, with no value
    out : float32 (N, H, Dv), written; a query that sees no key gets zeros
    n_threads : OpenMP threads over work items; results do not depend on it
    """
    cdef int N = <int>q.shape[0], H = <int>q.shape[1], D = <int>q.shape[2]
    cdef int S = <int>seg_start.shape[0] - 1, bs = block_size
    cdef int G = H // n_kv_heads
    cdef Py_ssize_t x, y
    # checks (cheap C loops; nn.py leaves these to the kernel)
    if S != block_tables.shape[0] or seg_start[0] != 0 or seg_start[S] != N:
        raise ValueError("seg_start must be non-decreasing from 0 to N with one entry per block table + 1")
    for x in range(S):
        if seg_start[x + 1] < seg_start[x]:
            raise ValueError("seg_start must be non-decreasing from 0 to N with one entry per block table + 1")
    for x in range(N):
        if q_pos[x] < 0 or q_pos[x] >= block_tables.shape[1] * bs:
            raise ValueError("q_pos outside the range covered by the block tables")
    for x in range(block_tables.shape[0]):
        for y in range(block_tables.shape[1]):
            if block_tables[x, y] >= k_pool.shape[0]:
                raise ValueError("block id out of range of the pool")
    if N == 0 or S <= 0:
        return
    cdef AttnArgs a
    a.q = &q[0, 0, 0]
    a.out = &out[0, 0, 0]
    a.k = &k_pool[0, 0] if k_pool.shape[0] > 0 else NULL
    a.v = &v_pool[0, 0] if v_pool.shape[0] > 0 else NULL
    a.k_bstride = k_pool.strides[0]
    a.v_bstride = v_pool.strides[0]
    a.k_row = k_row
    a.v_row = v_row
    a.kv_type = kv_type
    a.bs = bs
    a.KVH = n_kv_heads
    a.H = H
    a.G = G
    a.D = D
    a.Dv = Dv
    a.tables = &block_tables[0, 0] if block_tables.shape[1] > 0 else NULL
    a.max_blocks = <int>block_tables.shape[1]
    a.q_pos = &q_pos[0]
    a.scale = scale
    a.softcap = softcap
    a.window = window
    a.sinks = &sinks[0] if sinks is not None else NULL
    cdef int T = TILE_ROWS // G if G < TILE_ROWS else 1
    a.R_max = T * G
    a.vd = 1 if N == 1 else 0

    # ---- work items: (seq, kvh, tile, key split). The split count depends only on the
    # shapes, never on the thread count, so results are identical for any n_threads.
    cdef int s, r0, r1, t0, t1, t, lo, hi, qp, kb0, kb1, nb, kvh, k, ns, n_tiles = 0
    cdef int max_items = 0
    for s in range(S):
        r0 = seg_start[s]
        r1 = seg_start[s + 1]
        if r1 > r0:
            n_tiles += (r1 - r0 + T - 1) // T
    cdef int base_items = n_tiles * n_kv_heads
    cdef int want = (SPLIT_MIN_ITEMS + base_items - 1) // base_items if base_items > 0 else 1
    max_items = base_items * (want if want > 1 else 1)
    it_np = np.empty((max(1, max_items), 7), dtype=np.int32)
    gr_np = np.empty((max(1, base_items), 5), dtype=np.int32)
    so_np = np.empty(max(1, max_items), dtype=np.int64)
    sg_np = np.empty(max(1, max_items), dtype=np.int32)
    cdef int32_t[:, ::1] it_arr = it_np
    cdef int32_t[:, ::1] gr_arr = gr_np
    cdef int64_t[::1] slot_off = so_np
    cdef int32_t[::1] slot_grp = sg_np
    cdef Py_ssize_t n_items = 0, n_groups = 0, i, loc_len = 0, arena_len = 0, ln
    cdef int n_slots = 0, slot
    for s in range(S):
        r0 = seg_start[s]
        r1 = seg_start[s + 1]
        t0 = r0
        while t0 < r1:
            t1 = t0 + T if t0 + T < r1 else r1
            lo = 1 << 30
            hi = -1
            for t in range(t0, t1):
                qp = q_pos[t]
                if qp > hi:
                    hi = qp
                qp = qp - window + 1 if window > 0 else 0
                if qp < lo:
                    lo = qp
            if lo < 0:
                lo = 0
            kb0 = lo // bs
            kb1 = hi // bs + 1
            if kb1 > a.max_blocks:
                kb1 = a.max_blocks
            nb = kb1 - kb0
            ns = min(want, nb // SPLIT_MIN_BLOCKS) if want > 1 else 1
            if ns < 1:
                ns = 1
            if ns == 1:
                for kvh in range(n_kv_heads):
                    it_arr[n_items, 0] = s
                    it_arr[n_items, 1] = kvh
                    it_arr[n_items, 2] = t0
                    it_arr[n_items, 3] = t1
                    it_arr[n_items, 4] = kb0
                    it_arr[n_items, 5] = kb1
                    it_arr[n_items, 6] = -1
                    n_items += 1
                    ln = <Py_ssize_t>a.R_max * nb * bs
                    if ln > loc_len:
                        loc_len = ln
            else:
                # one group (kv head) owns slots slot0..slot0+ns-1; items run split by split
                # with the kv heads innermost, so the heads of one key range (interleaved in
                # the same cache pages) are read back to back
                for kvh in range(n_kv_heads):
                    gr_arr[n_groups + kvh, 0] = kvh
                    gr_arr[n_groups + kvh, 1] = t0
                    gr_arr[n_groups + kvh, 2] = t1
                    gr_arr[n_groups + kvh, 3] = n_slots + kvh * ns
                    gr_arr[n_groups + kvh, 4] = ns
                for k in range(ns):
                    for kvh in range(n_kv_heads):
                        slot = n_slots + kvh * ns + k
                        it_arr[n_items, 0] = s
                        it_arr[n_items, 1] = kvh
                        it_arr[n_items, 2] = t0
                        it_arr[n_items, 3] = t1
                        it_arr[n_items, 4] = kb0 + nb * k // ns
                        it_arr[n_items, 5] = kb0 + nb * (k + 1) // ns
                        it_arr[n_items, 6] = slot
                        slot_off[slot] = arena_len
                        slot_grp[slot] = <int32_t>(n_groups + kvh)
                        arena_len += <Py_ssize_t>((t1 - t0) * G) * (it_arr[n_items, 5] - it_arr[n_items, 4]) * bs
                        n_items += 1
                n_slots += ns * n_kv_heads
                n_groups += n_kv_heads
            t0 = t1
    a.loc_len = loc_len
    cdef float[::1] pv, ar, gs
    if n_slots > 0:
        partial = np.empty(n_slots * a.R_max * (Dv + 2), dtype=np.float32)
        arena = np.empty(max(1, arena_len), dtype=np.float32)
        gstat = np.empty(n_groups * 2 * a.R_max, dtype=np.float32)
        pv = partial
        ar = arena
        gs = gstat
        a.partial = &pv[0]
        a.arena = &ar[0]
        a.gstat = &gs[0]
        a.slot_off = &slot_off[0]
        a.slot_grp = &slot_grp[0]
    # per-thread scratch: Qt, Kt, tmp (D + Dv), Vb, acc, M, inv, then the local scores
    cdef Py_ssize_t fixed = (<Py_ssize_t>a.R_max * (D + Dv + 2) + <Py_ssize_t>D * bs
                             + <Py_ssize_t>bs * Dv + D + Dv + 64)
    cdef Py_ssize_t buf_len = fixed + loc_len
    cdef float *buf = NULL
    cdef int nt = n_threads if n_threads > 0 else 1
    # a small decode (few short sequences) is not worth waking the other threads
    cdef Py_ssize_t kv_bytes = 0
    for i in range(n_items):
        kv_bytes += <Py_ssize_t>(it_arr[i, 5] - it_arr[i, 4]) * bs * (k_row + v_row)
    if N * H <= 64 and kv_bytes < MIN_PARALLEL_KV_BYTES:
        nt = 1
    if nt > n_items:
        nt = <int>n_items
    if nt < 1:
        nt = 1
    with nogil, parallel(num_threads=nt):
        buf = <float *>malloc(buf_len * sizeof(float))
        for i in prange(n_items, schedule='dynamic'):
            if it_arr[i, 6] < 0:
                _run_item(&a, &it_arr[i, 0], buf, buf + fixed)
            else:
                _split_scores(&a, &it_arr[i, 0], buf)
        free(buf)
    if n_groups == 0:
        return
    nt = n_threads if n_threads > 0 else 1
    with nogil, parallel(num_threads=nt):
        buf = <float *>malloc(fixed * sizeof(float))
        for i in prange(n_groups, schedule='static'):
            _split_stats(&a, &gr_arr[i, 0], <int>i)
        for i in prange(n_items, schedule='dynamic'):
            if it_arr[i, 6] >= 0:
                _split_pv(&a, &it_arr[i, 0], buf)
        for i in prange(n_groups, schedule='static'):
            _split_sum(&a, &gr_arr[i, 0])
        free(buf)
