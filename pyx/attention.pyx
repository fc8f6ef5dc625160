# cython: freethreading_compatible=True
"""Attention over the paged KV cache: the two kernels of an attention layer after its fused
q/k/v projection. ``qkv_post`` normalises and rotates q and k and writes k and v into their
cache slots; ``attention`` computes softmax(q k^T * scale) v over each sequence's blocks,
blocked (flash-style): each K/V block is read once per work item of up to 96 query rows
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

from kv_rows cimport T_F16, T_F32, T_Q4_0, T_Q4_0_TILES, T_Q8_0, kv_tiles_ok, store_slot
from norms cimport rms_row
from rope cimport rope_apply, rope_cos_sin
from simd cimport simd_alloc

from attn_plan cimport (ATTN_KV_F16, ATTN_KV_F32, ATTN_KV_Q4_0, ATTN_KV_Q8_0, ATTN_MAX_BS, attn_ctx, attn_item,
                       attn_merge, attn_plan, attn_plan_build, attn_plan_ctx, attn_plan_free, attn_run_item,
                       attn_scratch_floats, attn_set_lanes_min_rows, attn_set_pv_scales_first,
                       attn_set_split_heads, SPLIT_HEADS_MAX_KEYS as _SPLIT_HEADS_MAX_KEYS)
from amx_bf16 cimport ab_env_on, ab_init

if (ATTN_KV_F32, ATTN_KV_F16, ATTN_KV_Q8_0, ATTN_KV_Q4_0) != (T_F32, T_F16, T_Q8_0, T_Q4_0):
    raise ImportError("simd_attention.h and kv_rows.pxd disagree on the KV type codes")

# keys up to which a lone decode item of one kv head goes out as two items of half the heads
SPLIT_HEADS_MAX_KEYS = _SPLIT_HEADS_MAX_KEYS


# A prompt's tile items (more than ROWS_MAX_QG query rows of a kv head) on AMX-BF16 tiles where
# the CPU has them: scores and P.V as products of bf16 high and low parts (~16-bit), not the
# f32 kernels' bits (simd_attention.h attn_tile_item_ab); off with LLMCORE_NO_AMX_BF16=1 or
# LLMCORE_NO_AMX=1
AMX_BF16 = bool(ab_init(ab_env_on()))


def _set_amx_bf16(int on):
    """Tests and benchmarks: whether tile items run on AMX-BF16 (on: where the CPU and the
    kernel allow it). Returns whether they now do."""
    return bool(ab_init(on))


cdef enum:
    # a small decode (few short sequences) is not worth waking the other threads
    MIN_PARALLEL_KV_BYTES = 256 * 1024


def qkv_post(const float[:, :] qkv, float[:, :, ::1] q_out, uint8_t[:, ::1] k_pool, uint8_t[:, ::1] v_pool,
             int kv_type, int block_size, int n_kv_heads, int k_row, int v_row, int Dv,
             const int32_t[:, ::1] block_tables, const int32_t[::1] seg_start, const int32_t[::1] positions,
             int n_rot, float base, bint neox, float freq_scale,
             const float[::1] q_norm, const float[::1] k_norm, float eps, int n_threads=1,
             const float[:, ::1] cs_table=None, bint k_tiled=False):
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
    cs_table : float32 (N, n_rot) or None: the tokens' cos/sin tables (rope.cos_sin_table with
        these positions and rope parameters: the same values), shared by a step's layers
    """
    if k_tiled and not kv_tiles_ok(kv_type == T_Q4_0, block_size, <int>q_out.shape[2]):
        raise ValueError("qkv_post: a tiled K pool is Q4_0 with block_size % 16 == 0 and head_dim % 32 == 0, <= 1024")
    cdef int k_code = T_Q4_0_TILES if k_tiled else kv_type
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
    if cs_table is not None and (cs_table.shape[0] != N or cs_table.shape[1] != n_rot):
        raise ValueError("qkv_post: cs_table must be (N, n_rot)")
    cdef const float *cst = &cs_table[0, 0] if cs_table is not None and n_rot > 0 else NULL
    cdef const float *csp
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
            csp = cst + i * n_rot
            if cst == NULL and n_rot > 0:
                rope_cos_sin(<float>p, n_rot, theta_scale, freq_scale, NULL, cs)
                csp = cs
            qo = qop + i * H * D
            memcpy(qo, src, H * D * sizeof(float))
            for h in range(H):
                if qn != NULL:
                    rms_row(qo + h * D, NULL, qn, eps, qo + h * D, D)
                if n_rot > 0:
                    rope_apply(qo + h * D, n_rot, neox, csp)
            for h in range(KVH):
                memcpy(tmp, src + H * D + h * D, D * sizeof(float))
                if kn != NULL:
                    rms_row(tmp, NULL, kn, eps, tmp, D)
                if n_rot > 0:
                    rope_apply(tmp, n_rot, neox, csp)
                store_slot(tmp, k_code, kp + blk[i] * kbs, p % block_size, h, KVH, k_row, D)
                store_slot(src + H * D + KVH * D + h * Dv, kv_type, vp + blk[i] * vbs, p % block_size, h, KVH,
                           v_row, Dv)
        free(tmp)
    free(blk)
    return 0


def _set_lanes_min_rows(int n):
    """Rows of one kv head from which a rows item of this module's calls takes the lanes form
    (simd_attention.h; same bits as the rows kernel): tests and benchmarks compare the two.
    Returns the previous value."""
    return attn_set_lanes_min_rows(n)


def _set_pv_scales_first(int on):
    """Whether decode P.V over a Q4_0 or Q8_0 V converts the block scales of an item's keys first
    (simd_attention.h attn_block_scales; the same bits: tests compare the two). Returns the
    previous value."""
    return attn_set_pv_scales_first(on)


def _set_split_heads(int on):
    """Whether a lone decode rows item over few keys goes out as two items of half its heads
    each (attn_plan.pxd SPLIT_HEADS_MAX_KEYS; the same bits): tests compare the two. Returns
    the previous value."""
    return attn_set_split_heads(on)


# ---- attention (the plan: attn_plan.pxd) --------------------------------------------------

def _plan_items(const int32_t[:, ::1] block_tables, const int32_t[::1] seg_start, const int32_t[::1] q_pos,
                int H, int KVH, int block_size, int window=0, const uint8_t[::1] decode_seqs=None):
    """Tests: the work items attention() plans for these rows, costliest first, as tuples
    (kind, seq, h0, h1, tok0, tok1, b0, b1, chunk); kind 1 rows (decode), else tiles."""
    cdef int S = <int>seg_start.shape[0] - 1, MB = <int>block_tables.shape[1]
    cdef attn_plan pl
    if attn_plan_build(&pl, <int>q_pos.shape[0], H, KVH, 0, block_size, 0, 0,
                       &block_tables[0, 0] if MB > 0 else NULL, S, MB, &seg_start[0], &q_pos[0], window,
                       &decode_seqs[0] if decode_seqs is not None else NULL) != 0:
        raise MemoryError()
    cdef long i
    cdef attn_item it
    out = []
    for i in range(pl.n_items):
        it = pl.items[i]
        out.append((it.kind, it.seq, it.h0, it.h1, it.tok0, it.tok1, it.b0, it.b1, it.chunk))
    attn_plan_free(&pl)
    return out


def attention(const float[:, :, ::1] q, const uint8_t[:, ::1] k_pool, const uint8_t[:, ::1] v_pool,
              int kv_type, int block_size, int n_kv_heads, int k_row, int v_row, int Dv,
              const int32_t[:, ::1] block_tables, const int32_t[::1] seg_start, const int32_t[::1] q_pos,
              float scale, int window, float softcap, const float[::1] sinks, float[:, :, ::1] out,
              int n_threads=1, const uint8_t[::1] decode_seqs=None, bint k_tiled=False):
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
    k_tiled : the Q4_0 K pool stores 16-key tiles (simd_kv_rows.h; block_size % 16 == 0)
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
    if k_tiled and not kv_tiles_ok(kv_type == ATTN_KV_Q4_0, bs, D):
        raise ValueError("a tiled K pool is Q4_0 with block_size % 16 == 0 and head_dim % 32 == 0, <= 1024")
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
    c.k_tiled = 1 if k_tiled else 0

    cdef attn_plan pl
    if attn_plan_build(&pl, N, H, KVH, Dv, bs, k_row, v_row, &block_tables[0, 0] if MB > 0 else NULL, S, MB,
                       &seg_start[0], &q_pos[0], window,
                       &decode_seqs[0] if decode_seqs is not None else NULL) != 0:
        raise MemoryError()
    attn_plan_ctx(&pl, &c, N)

    # ---- run ------------------------------------------------------------------------------
    cdef long buf_len = attn_scratch_floats(D, Dv, bs)
    cdef float *buf = NULL
    cdef long i
    cdef int nt = n_threads if n_threads > 0 else 1
    if N * H <= 64 and pl.kv_bytes < MIN_PARALLEL_KV_BYTES:
        nt = 1
    if nt > pl.n_items:
        nt = <int>pl.n_items
    if nt < 1:
        nt = 1
    with nogil, parallel(num_threads=nt):
        buf = <float *>simd_alloc(buf_len * sizeof(float))
        for i in prange(pl.n_items, schedule='dynamic'):
            attn_run_item(&c, &pl.items[i], buf)
        free(buf)
    if pl.n_merge:
        with nogil:
            for x in prange(<Py_ssize_t>N * H, num_threads=nt, schedule='static'):
                if c.nparts[x // H] > 1:
                    attn_merge(&c, <int>(x // H), <int>(x % H))
    attn_plan_free(&pl)
