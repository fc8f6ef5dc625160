# cython: freethreading_compatible=True
"""Attention over the paged KV cache: the two kernels of an attention layer after its fused
q/k/v projection. ``qkv_post`` normalises and rotates q and k and writes k and v into their
cache slots; ``attention`` computes softmax(q k^T * scale) v over each sequence's blocks,
blocked (flash-style): each K/V block is read once per work item of up to 48 query rows
with an online softmax.

Called through llmcore/nn.py (and the fused path of llmcore/models/layers.py), which own
the API contract and the thread count. KV pools are bytes, shape (n_blocks, block_size *
n_kv_heads * row_nbytes): row (token t of a block, kv head h) starts at byte
(t * n_kv_heads + h) * row_nbytes of its block (formats in kv_rows.pxd). The work items
(single-threaded) are in simd_attention.h; this module plans them and runs them in parallel.
"""
from cython.parallel cimport parallel, prange
from libc.math cimport INFINITY, expf, powf, tanhf
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcmp, memcpy

import numpy as np

from kv_rows cimport T_F16, T_F32, T_Q4_0, T_Q8_0, store_row
from norms cimport rms_row
from rope cimport rope_apply, rope_cos_sin

cdef extern from "simd_attention.h" nogil:
    int ATTN_KV_F32, ATTN_KV_F16, ATTN_KV_Q8_0, ATTN_KV_Q4_0
    int ATTN_TILE_ROWS, ATTN_MAX_ROWS, ATTN_MAX_BS
    ctypedef struct attn_ctx:
        const float *q
        float *out
        const uint8_t *k
        const uint8_t *v
        long k_bstride, v_bstride
        int k_row, v_row
        int kv_type, bs, KVH, H, G, D, Dv
        const int32_t *tables
        int max_blocks
        const int32_t *q_pos
        float scale, softcap
        int window
        const float *sinks
        const int32_t *toks
        const int32_t *slot_base
        const int32_t *chunk0
        const int32_t *nparts
        float *partial
    ctypedef struct attn_item:
        int32_t kind, seq, h0, h1, tok0, tok1, b0, b1, chunk
    long attn_scratch_floats(int D, int Dv, int bs)
    void attn_run_item(const attn_ctx *c, const attn_item *it, float *buf)
    void attn_merge(const attn_ctx *c, int t, int h)

if (ATTN_KV_F32, ATTN_KV_F16, ATTN_KV_Q8_0, ATTN_KV_Q4_0) != (T_F32, T_F16, T_Q8_0, T_Q4_0):
    raise ImportError("simd_attention.h and kv_rows.pxd disagree on the KV type codes")

cdef enum:
    # a sequence with at most this many query rows per kv head (query tokens x GQA group)
    # takes the rows kernel (decode); more take the tile kernel (prefill). Decodes that
    # share blocks take the tile kernel there when together they have this many rows.
    ROWS_MAX_QG = 16
    # rows items cover chunks of this many keys at fixed positions (0, CHUNK_KEYS, ...), so
    # a sequence's result does not depend on the batch it is decoded in
    CHUNK_KEYS = 1024
    # tile items are split along the keys when a call has fewer items than this
    SPLIT_MIN_ITEMS = 32
    SPLIT_MIN_BLOCKS = 8
    MIN_PARALLEL_KV_BYTES = 256 * 1024


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
# Work items (simd_attention.h): a set of query rows of one kv head (tokens x heads of its
# group) and a range of K/V blocks. Prefill tokens of a sequence form tiles of up to 96 rows
# over the keys the tile sees (split along the keys, at block boundaries, when the call has
# few items). Decode tokens (few rows) form items per fixed key chunk; decode sequences whose
# blocks in a chunk are the same (a shared prefix) are one item, so each shared block is read
# once per step for all of them (with the rows kernel while they are few: each sequence gets
# the bits it gets alone; with the tile kernel when they have 16 or more rows per kv head).
# A row covered by several items ends as partials (o, m, l), merged in chunk order. Items
# depend on the shapes and tables only, never on the thread count. Sequences marked in
# decode_seqs (speculative decoding's verify segments) take rows items whatever their row
# count, never tiles: each token gets the bits a one-token decode at its position gets.

cdef int _cmp_cost(const void *a, const void *b) noexcept nogil:
    """qsort: costlier items first (rows x blocks), ties in plan order."""
    cdef const attn_item *x = <const attn_item *>a
    cdef const attn_item *y = <const attn_item *>b
    cdef long cx = <long>(x.tok1 - x.tok0) * (x.h1 - x.h0) * (x.b1 - x.b0)
    cdef long cy = <long>(y.tok1 - y.tok0) * (y.h1 - y.h0) * (y.b1 - y.b0)
    if cx != cy:
        return -1 if cx > cy else 1
    return -1 if x.chunk < y.chunk else (1 if x.chunk > y.chunk else 0)


cdef inline int _key_lo(int qp, int window) noexcept nogil:
    cdef int lo = qp - window + 1 if window > 0 else 0
    return lo if lo > 0 else 0


cdef inline uint64_t _hash_ids(const int32_t *ids, int n) noexcept nogil:
    cdef uint64_t h = 1469598103934665603ULL
    cdef int i
    for i in range(n):
        h = (h ^ <uint32_t>ids[i]) * 1099511628211ULL
    return h


cdef inline void _rows_item(attn_item *it, int seq, int h0, int h1, long tok0, long tok1, int b0, int b1,
                            int chunk) noexcept nogil:
    it.kind = 1
    it.seq = seq
    it.h0 = h0
    it.h1 = h1
    it.tok0 = <int32_t>tok0
    it.tok1 = <int32_t>tok1
    it.b0 = b0
    it.b1 = b1
    it.chunk = chunk


def attention(const float[:, :, ::1] q, const uint8_t[:, ::1] k_pool, const uint8_t[:, ::1] v_pool,
              int kv_type, int block_size, int n_kv_heads, int k_row, int v_row, int Dv,
              const int32_t[:, ::1] block_tables, const int32_t[::1] seg_start, const int32_t[::1] q_pos,
              float scale, int window, float softcap, const float[::1] sinks, float[:, :, ::1] out,
              int n_threads=1, const uint8_t[::1] decode_seqs=None):
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
    decode_seqs : uint8 (S,) or None: sequences marked take the rows (decode) kernel whatever
        their row count, so each of their tokens gets the bits it gets decoded alone after the
        tokens before it (speculative decoding's verify segments)
    """
    cdef int N = <int>q.shape[0], H = <int>q.shape[1], D = <int>q.shape[2]
    cdef int S = <int>seg_start.shape[0] - 1, bs = block_size, KVH = n_kv_heads
    cdef int MB = <int>block_tables.shape[1]
    cdef Py_ssize_t x, y
    # checks (cheap C loops; nn.py leaves these to the kernel)
    if S != block_tables.shape[0] or S < 0 or seg_start[0] != 0 or seg_start[S] != N:
        raise ValueError("seg_start must be non-decreasing from 0 to N with one entry per block table + 1")
    for x in range(S):
        if seg_start[x + 1] < seg_start[x]:
            raise ValueError("seg_start must be non-decreasing from 0 to N with one entry per block table + 1")
    for x in range(N):
        if q_pos[x] < 0 or q_pos[x] >= MB * bs:
            raise ValueError("q_pos outside the range covered by the block tables")
    for x in range(block_tables.shape[0]):
        for y in range(MB):
            if block_tables[x, y] >= k_pool.shape[0]:
                raise ValueError("block id out of range of the pool")
    if KVH <= 0 or H % KVH:
        raise ValueError("n_heads must be a multiple of n_kv_heads")
    if bs <= 0 or bs > ATTN_MAX_BS:
        raise ValueError(f"block_size must be in 1..{ATTN_MAX_BS}")
    if decode_seqs is not None and decode_seqs.shape[0] != S:
        raise ValueError("decode_seqs must have one entry per sequence")
    if N == 0 or S <= 0:
        return
    cdef int G = H // KVH
    cdef attn_ctx c
    c.q = &q[0, 0, 0]
    c.out = &out[0, 0, 0]
    c.k = &k_pool[0, 0] if k_pool.shape[0] > 0 else NULL
    c.v = &v_pool[0, 0] if v_pool.shape[0] > 0 else NULL
    c.k_bstride = k_pool.strides[0]
    c.v_bstride = v_pool.strides[0]
    c.k_row = k_row
    c.v_row = v_row
    c.kv_type = kv_type
    c.bs = bs
    c.KVH = KVH
    c.H = H
    c.G = G
    c.D = D
    c.Dv = Dv
    c.tables = &block_tables[0, 0] if MB > 0 else NULL
    c.max_blocks = MB
    c.q_pos = &q_pos[0]
    c.scale = scale
    c.softcap = softcap
    c.window = window
    c.sinks = &sinks[0] if sinks is not None else NULL

    # ---- the plan ------------------------------------------------------------------------
    # rows of an item: T tokens x Gi heads; a group larger than an item takes head chunks
    cdef int Gi = G if G <= ATTN_MAX_ROWS else ATTN_MAX_ROWS
    cdef int n_gc = (G + Gi - 1) // Gi
    cdef int T_tile = ATTN_TILE_ROWS // Gi if Gi <= ATTN_TILE_ROWS else 1
    cdef int T_rows = ATTN_MAX_ROWS // Gi if Gi <= ATTN_MAX_ROWS else 1
    cdef int CH = CHUNK_KEYS // bs if bs < CHUNK_KEYS else 1
    cdef int s, r0, r1, t, qp, qmin, qmax, kb_lo, kb_hi, nq, k, ns, nb, gc, kvh, g0, g1, b0, b1, ch
    cdef int *seq_lo = <int *>malloc(5 * max(S, 1) * sizeof(int))
    if seq_lo == NULL:
        raise MemoryError()
    cdef int *seq_hi = seq_lo + S
    cdef int *seq_rows = seq_hi + S  # > 0: rows kernel
    cdef const uint8_t *dec = &decode_seqs[0] if decode_seqs is not None else NULL
    cdef int *seq_c0 = seq_rows + S
    cdef int *seq_c1 = seq_c0 + S
    cdef long max_items = 0, max_toks = 0, n_tile_base = 0, n_row_items = 0
    cdef int c_max = -1
    for s in range(S):
        r0 = seg_start[s]
        r1 = seg_start[s + 1]
        nq = r1 - r0
        seq_rows[s] = 0
        seq_lo[s] = 0
        seq_hi[s] = -1
        if nq == 0:
            continue
        qmin = q_pos[r0]
        qmax = q_pos[r0]
        for t in range(r0, r1):
            qp = q_pos[t]
            qmin = qp if qp < qmin else qmin
            qmax = qp if qp > qmax else qmax
        seq_lo[s] = _key_lo(qmin, window) // bs
        seq_hi[s] = qmax // bs
        # 2: rows kernel asked for (decode numerics), 1: few rows
        seq_rows[s] = 2 if dec != NULL and dec[s] else (1 if nq * G <= ROWS_MAX_QG else 0)
        if seq_rows[s]:
            seq_c0[s] = seq_lo[s] // CH
            seq_c1[s] = seq_hi[s] // CH
            if seq_c1[s] > c_max:
                c_max = seq_c1[s]
            max_toks += <long>nq * (seq_c1[s] - seq_c0[s] + 1)
            n_row_items += (<long>(nq + T_rows - 1) // T_rows) * (seq_c1[s] - seq_c0[s] + 1) * n_gc * KVH
        else:
            n_tile_base += (<long>(nq + T_tile - 1) // T_tile) * n_gc * KVH
            max_toks += nq
    # split tile items along the keys when there are few items in all
    cdef long base_items = n_tile_base + n_row_items
    cdef int want = <int>((SPLIT_MIN_ITEMS + base_items - 1) // base_items) if 0 < base_items < SPLIT_MIN_ITEMS else 1
    max_items = n_tile_base * want + n_row_items
    cdef attn_item *items = <attn_item *>malloc(max(max_items, 1) * sizeof(attn_item))
    cdef int32_t *toks = <int32_t *>malloc(max(max_toks, 1) * sizeof(int32_t))
    cdef int32_t *tinfo = <int32_t *>malloc(3 * max(N, 1) * sizeof(int32_t))
    # rows-kernel grouping, per chunk: group representative, its block range and ids' hash
    cdef int *grp_rep = <int *>malloc(5 * max(S, 1) * sizeof(int))
    cdef uint64_t *grp_hash = <uint64_t *>malloc(max(S, 1) * sizeof(uint64_t))
    cdef int *mem_next = <int *>malloc(max(S, 1) * sizeof(int))
    if items == NULL or toks == NULL or tinfo == NULL or grp_rep == NULL or grp_hash == NULL or mem_next == NULL:
        free(seq_lo); free(items); free(toks); free(tinfo); free(grp_rep); free(grp_hash); free(mem_next)
        raise MemoryError()
    cdef int *grp_b0 = grp_rep + S
    cdef int *grp_b1 = grp_b0 + S
    cdef int *grp_last = grp_b1 + S
    cdef int *grp_exact = grp_last + S  # a member asked for decode numerics
    cdef int32_t *slot_base = tinfo
    cdef int32_t *chunk0 = tinfo + N
    cdef int32_t *nparts = tinfo + 2 * N
    cdef long n_items = 0, n_toks = 0, n_slots = 0, tk0, tk, i, kv_bytes = 0
    cdef int n_grp, gi, m, found
    cdef uint64_t hsh
    cdef attn_item *it
    for t in range(N):
        nparts[t] = 1
        slot_base[t] = 0
        chunk0[t] = 0
    # tile items
    for s in range(S):
        if seq_rows[s] or seg_start[s + 1] == seg_start[s]:
            continue
        r0 = seg_start[s]
        r1 = seg_start[s + 1]
        t = r0
        while t < r1:
            tk0 = n_toks
            qmin = q_pos[t]
            qmax = q_pos[t]
            for k in range(t, min(t + T_tile, r1)):
                toks[n_toks] = k
                n_toks += 1
                qmin = q_pos[k] if q_pos[k] < qmin else qmin
                qmax = q_pos[k] if q_pos[k] > qmax else qmax
            b0 = _key_lo(qmin, window) // bs
            b1 = qmax // bs + 1
            if b1 > MB:
                b1 = MB
            nb = b1 - b0
            ns = min(want, nb // SPLIT_MIN_BLOCKS) if want > 1 else 1
            if ns < 1:
                ns = 1
            for tk in range(tk0, n_toks):
                nparts[toks[tk]] = ns
                chunk0[toks[tk]] = 0
                slot_base[toks[tk]] = <int32_t>n_slots
                if ns > 1:
                    n_slots += ns
            for k in range(ns):
                for kvh in range(KVH):
                    for gc in range(n_gc):
                        it = &items[n_items]
                        it.kind = 0
                        it.seq = s
                        it.h0 = kvh * G + gc * Gi
                        it.h1 = kvh * G + min(G, (gc + 1) * Gi)
                        it.tok0 = <int32_t>tk0
                        it.tok1 = <int32_t>n_toks
                        it.b0 = b0 + nb * k // ns
                        it.b1 = b0 + nb * (k + 1) // ns
                        it.chunk = k
                        n_items += 1
            t += T_tile
    # rows items: chunk by chunk, sequences with the same blocks in the chunk grouped
    for s in range(S):
        if not seq_rows[s]:
            continue
        ns = seq_c1[s] - seq_c0[s] + 1
        for t in range(seg_start[s], seg_start[s + 1]):
            nparts[t] = ns
            chunk0[t] = seq_c0[s]
            slot_base[t] = <int32_t>n_slots
            if ns > 1:
                n_slots += ns
    for ch in range(c_max + 1):
        n_grp = 0
        for s in range(S):
            if not seq_rows[s] or ch < seq_c0[s] or ch > seq_c1[s]:
                continue
            b0 = max(seq_lo[s], ch * CH)
            b1 = min(seq_hi[s], ch * CH + CH - 1) + 1
            if b1 > MB:
                b1 = MB
            hsh = _hash_ids(&block_tables[s, 0] + b0, b1 - b0) if b1 > b0 else 0
            found = -1
            for gi in range(n_grp):
                if (grp_hash[gi] == hsh and grp_b0[gi] == b0 and grp_b1[gi] == b1
                        and memcmp(&block_tables[grp_rep[gi], 0] + b0, &block_tables[s, 0] + b0,
                                   (b1 - b0) * sizeof(int32_t)) == 0):
                    found = gi
                    break
            mem_next[s] = -1
            if found < 0:
                grp_rep[n_grp] = s
                grp_b0[n_grp] = b0
                grp_b1[n_grp] = b1
                grp_hash[n_grp] = hsh
                grp_last[n_grp] = s
                grp_exact[n_grp] = seq_rows[s] == 2
                n_grp += 1
            else:
                mem_next[grp_last[found]] = s
                grp_last[found] = s
                if seq_rows[s] == 2:
                    grp_exact[found] = 1
        for gi in range(n_grp):
            # the group's tokens, member by member, in items of T_rows tokens
            tk0 = n_toks
            m = grp_rep[gi]
            while m >= 0:
                for t in range(seg_start[m], seg_start[m + 1]):
                    toks[n_toks] = t
                    n_toks += 1
                m = mem_next[m]
            # many rows per kv head (decodes sharing these blocks, none asking for decode
            # numerics): tile items (rows in lanes); else all heads in one rows item when
            # they fit (each block read front to back once), else rows items per kv head
            if (n_toks - tk0) * Gi >= ROWS_MAX_QG and not grp_exact[gi]:
                tk = tk0
                while tk < n_toks:
                    for kvh in range(KVH):
                        for gc in range(n_gc):
                            _rows_item(&items[n_items], grp_rep[gi], kvh * G + gc * Gi,
                                       kvh * G + min(G, (gc + 1) * Gi), tk, min(tk + T_tile, n_toks),
                                       grp_b0[gi], grp_b1[gi], ch)
                            items[n_items].kind = 0
                            n_items += 1
                    tk += T_tile
            elif (n_toks - tk0) * H <= ATTN_MAX_ROWS:
                _rows_item(&items[n_items], grp_rep[gi], 0, H, tk0, n_toks, grp_b0[gi], grp_b1[gi], ch)
                n_items += 1
            else:
                tk = tk0
                while tk < n_toks:
                    for kvh in range(KVH):
                        for gc in range(n_gc):
                            _rows_item(&items[n_items], grp_rep[gi], kvh * G + gc * Gi,
                                       kvh * G + min(G, (gc + 1) * Gi), tk, min(tk + T_rows, n_toks),
                                       grp_b0[gi], grp_b1[gi], ch)
                            n_items += 1
                    tk += T_rows
            kv_bytes += <long>(grp_b1[gi] - grp_b0[gi]) * bs * (k_row + v_row) * KVH
    free(seq_lo)
    free(grp_rep)
    free(grp_hash)
    free(mem_next)
    for i in range(n_items):
        if items[i].kind == 0 and items[i].h0 % G == 0:
            kv_bytes += <long>(items[i].b1 - items[i].b0) * bs * (k_row + v_row)
    qsort(items, n_items, sizeof(attn_item), _cmp_cost)
    c.toks = toks
    c.slot_base = slot_base
    c.chunk0 = chunk0
    c.nparts = nparts
    c.partial = <float *>malloc(max(n_slots * H * (Dv + 2), 1) * sizeof(float))
    if c.partial == NULL:
        free(items); free(toks); free(tinfo)
        raise MemoryError()

    # ---- run ------------------------------------------------------------------------------
    cdef long buf_len = attn_scratch_floats(D, Dv, bs)
    cdef float *buf = NULL
    cdef int nt = n_threads if n_threads > 0 else 1
    # a small decode (few short sequences) is not worth waking the other threads
    if N * H <= 64 and kv_bytes < MIN_PARALLEL_KV_BYTES:
        nt = 1
    if nt > n_items:
        nt = <int>n_items
    if nt < 1:
        nt = 1
    cdef long n_merge = 0
    for t in range(N):
        if nparts[t] > 1:
            n_merge += 1
    with nogil, parallel(num_threads=nt):
        buf = <float *>malloc(buf_len * sizeof(float))
        for i in prange(n_items, schedule='dynamic'):
            attn_run_item(&c, &items[i], buf)
        free(buf)
    if n_merge:
        with nogil:
            for x in prange(<Py_ssize_t>N * H, num_threads=nt, schedule='static'):
                if nparts[x // H] > 1:
                    attn_merge(&c, <int>(x // H), <int>(x % H))
    free(c.partial)
    free(items)
    free(toks)
    free(tinfo)
