# cython: language_level=3
"""A decode step of a whole stack of pre-norm attention blocks in one parallel region.

A decode step of a small model is a few hundred short operations (SmolLM2: 30 layers x a
norm, three matmuls of 0.2-1 MB, rope, attention, ...). Run one kernel call each, every
call opens a parallel region (a futex wake-up of the other threads, tens of microseconds
on a shared machine) or, to avoid that, runs on one thread: either way generation stays
far from the memory bandwidth. Here the whole step runs in one region, as a sequence of
phases (team.h): each phase is a set of work items that any thread takes, and a thread
moves on once every item of the phase is done (spinning briefly, then sleeping). The work
items are the ones the standalone kernels use (simd_quants.h, simd_kquants.h,
simd_attention.h), so a token gets the same numbers either way. A thread that another
process deschedules holds no work back: when it runs again it finds the phases it missed
done and skips them, so two threads are never slower than the one that runs.

    prog = Program(n_layer, n_embd, out_norm, out_eps, head, n_vocab)
    prog.set_layer(i, ...)                     # once per layer, at load
    prog.add_plan(kv_type, block_size, ...)    # attention geometry of each (pool, window)
    prog.run(x, positions, seg_start, tables, kv, logit_rows, logits, decode_seqs, n_threads)

A layer is ``x += post_norm?(wo(attention(rope(q_norm?(q)), rope(k_norm?(k)), v)))`` on
``attn_norm(x)``, then ``x += post_norm?(down(act(gate(h)) * up(h)))`` on ``ffn_norm(x)``;
the head is ``out_norm`` and a matmul for the rows whose logits are wanted. Weights are
the packed layouts of quants.pyx (legacy quants repacked, float types in place) and
kquants.pyx (K-quants, repacked or in the GGUF layout); llmcore/models/decode_step.py
builds the program from a model's blocks and falls back to the layer-by-layer path for
anything else.

Phases of a layer (items in brackets):

    q/k/v matmul [row groups]   q/k norms, rope, K/V store [token]
    attention [plan items]      merge of split rows [token]
    quantize the attention output [token]   wo matmul [row groups]
    residual, post norm, ffn norm, quantize [token]   gate/up matmul [row groups]
    act(gate) * up, quantize [token]   down matmul [row groups]
    residual, post norm, the next layer's norm (or out_norm), quantize [token]

then the head matmul. Matmul items go out in chunks of consecutive row groups (each thread
streams contiguous weights). A step of many tokens gives each thread a share of them
(team.h's shares): the token phases, the matmul items (a row group for a share's tokens)
and the attention items (by their first token) go to the share's thread first, so the rows
a thread quantizes, multiplies and normalizes stay in its core's cache. Results never
depend on the thread count: every output element is computed by one work item with fixed
arithmetic.
"""
import os

import numpy as np

from cython.parallel cimport parallel
from libc.math cimport powf
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from attn_plan cimport (attn_ctx, attn_item, attn_merge, attn_plan, attn_plan_build, attn_plan_ctx, attn_plan_free,
                        attn_run_item, attn_scratch_floats, attn_set_lanes_min_rows,
                        attn_set_pf_lin, attn_set_pf_spread, attn_set_pv_scales_first, attn_set_split_heads)
from amx_bf16 cimport ab_env_on, ab_init
from kv_rows cimport T_Q4_0, T_Q4_0_TILES, kv_tiles_ok, store_slot
from norms cimport rms_row
from rope cimport rope_apply, rope_cos_sin
from simd cimport simd_alloc

cdef extern from "team.h" nogil:
    ctypedef struct team_t:
        long spin_ns
    ctypedef struct team_phase_t:
        int64_t next
    void team_init(team_t *t, long spin_ns)
    int team_region_size()
    int team_thread()
    long team_now_ns()
    enum: TEAM_MAX_SHARES
    int64_t team_phase_take(team_phase_t *p, int64_t chunk)
    int team_share_take(team_phase_t *p, const int64_t *lo, int n, int me, int guided, int64_t *i0, int64_t *i1)
    void team_phase_done(team_phase_t *p, int64_t *mine, int64_t total)
    void team_phase_wait(const team_t *t, team_phase_t *p, int64_t total)
    void team_flag_set(int *flag)

cdef extern from "simd_argmax.h" nogil:
    ctypedef struct amax_lanes:
        int32_t nan
    void amax_init(amax_lanes *a)
    void amax_update(amax_lanes *a, const float *y, int64_t r0, int64_t r1)
    void amax_merge(amax_lanes *a, const amax_lanes *b)
    int64_t amax_row(const amax_lanes *a)


cdef extern from "simd.h" nogil:
    int simd_pf_dist

cdef extern from "simd_quants.h" nogil:
    int lq_set_pf_mode(int mode)
    ctypedef struct lq_packed:
        int type
        int fmt
        int has_m
        float moff
        int64_t rows, cols, nb, ngroups, qbytes, blk_bytes
        const uint8_t *data
    int LQ_FMT_NONE
    int LQ_FMT_BF16
    int64_t lq_init_packed(lq_packed *p, int type, int64_t rows, int64_t cols, const uint8_t *data)
    void lq_quant_row_q8(const float *x, int64_t K, int8_t *q, float *d, float *s, float moff)
    int LQ_TT
    int64_t lq_tile_bytes(int64_t nb)
    void lq_quant_row_tile(const float *x, int64_t K, int t, float moff, uint8_t *rec)
    void lq_quant_blocks_tile(const float *x, int64_t b0, int64_t m, int64_t nb, int t, float moff, uint8_t *rec)
    int lq_step_tiles_ok(const lq_packed *P, int64_t n)
    int lq_step_tiles_min
    int lq_pf_spread
    int lq_tile_pf_dist
    void lq_group_tiles(const lq_packed *P, int64_t g, const uint8_t *rec, int64_t n, float *y, int64_t R)
    void lq_float_rows_ld(const lq_packed *P, int64_t r0, int64_t r1, const float *x, float *y, int64_t n,
                          int64_t ldy)
    int64_t lq_tile_tokens(const lq_packed *P, int portable)
    void lq_group_rows_ld(const lq_packed *P, int64_t g, const int8_t *qa, const float *da, const float *sa,
                          int64_t n, int64_t tt, float *y, int64_t R, int portable)
    int lq_pair_ok(const lq_packed *P0, const lq_packed *P1)
    void lq_group_pair(const lq_packed *P0, int64_t g0, const int8_t *qa0, const float *da0, const float *sa0,
                       float *y0, int64_t rows0, const lq_packed *P1, int64_t g1, const int8_t *qa1,
                       const float *da1, const float *sa1, float *y1, int64_t rows1, int64_t n, int64_t ldy)

cdef extern from "simd_kquants.h" nogil:
    int kq_set_pf_mode(int mode)
    ctypedef struct kq_q8k:
        float d
        int8_t qs[256]
        int16_t bsums[16]
    ctypedef struct kq_act:
        const kq_q8k *q8k
        const int8_t *aq
        const float *ad
        const int32_t *as_ "as"
        int no_amx
    int kq_block_size(int t)
    void kq_quantize_q8k(const float *x, int64_t k, kq_q8k *y)
    void kq_rp_group(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g, const kq_act *act,
                     int64_t tok0, int64_t n, float *Y, int64_t ldy)
    void kq_rp_group_pair(int t, int64_t k, const uint8_t *P0, int64_t rows0, int64_t g0, const kq_act *act0,
                          float *Y0, const uint8_t *P1, int64_t rows1, int64_t g1, const kq_act *act1, float *Y1,
                          int64_t tok0, int64_t n, int64_t ldy)
    void kq_matmul_rows(int t, const uint8_t *W, int64_t row_stride, int64_t r0, int64_t r1,
                        int64_t nb, const kq_q8k *A, int64_t n, float *Y, int64_t ldy)

cdef extern from "simd_activations.h" nogil:
    void act_silu_row(const float *g, const float *u, float *y, int n)
    void act_gelu_row(const float *g, const float *u, float *y, int n)

cdef enum:
    W_LQ = 0       # quants.pyx, repacked16 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
    W_FLOAT = 1    # quants.pyx, F32 / F16 / BF16 in place
    W_KQ = 2       # kquants.pyx, repacked16 (Q4_K, Q5_K, Q6_K)
    W_KQRAW = 3    # kquants.pyx, the GGUF layout (Q2_K .. Q6_K)
    MAX_PARTS = 3
    MAX_PLANS = 4
    MAX_ROPES = 4
    FLOAT_ROWS = 16   # output rows per work item of a float weight
    KQ_ROWS = 8       # ... of a K-quant weight in the GGUF layout
    QK_K = 256
    QK8 = 32
    MAX_TOKENS = 128  # the largest step run here (llmcore.models.decode_step)
    # chunks of a matmul per thread: few keep each thread's weight stream long (measured:
    # 1-2 per thread beat 4 on an idle machine), more than one lets the other threads
    # take a descheduled thread's share
    MM_CHUNKS = 2
    # steps of fewer tokens read a matmul chunk as two weight streams (_linear_items_paired;
    # from 8 tokens the tile records' kernels run, bound by their arithmetic)
    PAIR_MAX_TOKENS = 8


def _cpu_vendor():
    """The CPU's vendor string (/proc/cpuinfo's vendor_id), or "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def default_share_min(vendor=None):
    """The default of set_share_min for a CPU vendor (default: this machine's).

    Token shares keep a thread's rows in its core at the price of every thread streaming
    every weight of the step's matmuls for its own tokens. Measured (SmolLM2, 600-token
    contexts, 2 threads, alternated in one process): on a Zen 5 (AMD; each core's L3 reads
    fast, cross-CCD line transfers slow) 32 sequences' steps 0.94x the time with shares from
    8 tokens a thread, 16 sequences' 0.98x; on a Xeon with AMX (Intel; a mesh L3 that a core
    reads slowly) 1.04-1.05x the time with shares at 16 and 32 sequences, the head and
    gate/up matmuls longer: there (and on other vendors' CPUs, unmeasured) a step goes
    without token shares; its row phases and attention still go by half-tile row shares."""
    return 8 if (_cpu_vendor() if vendor is None else vendor) == "AuthenticAMD" else 0


def default_tiles_min(vendor=None):
    """The default of set_tiles_min for a CPU vendor (default: this machine's).

    A step's legacy-quant matmuls read their inputs as row-major rows (a pointer per token)
    or as 8-token tile records (one pointer; a partial tile computes its tokens rounded up to
    2, 4 or 8). Measured (SmolLM2, 600-token contexts, 2 threads): on a Zen, 4 tokens were
    slower in a tile (3.5 -> 4.1 ms), so tiles start at 8 tokens there; on a Xeon with AMX
    tiles were faster from 2 tokens (2 sequences' steps 4.9 -> 4.2 ms, 3: 6.6 -> 5.7, 4:
    8.2 -> 5.6; one token reads two weight streams side by side, which a tile does not), so
    they start at 2 there and on other vendors' CPUs (unmeasured)."""
    return 8 if (_cpu_vendor() if vendor is None else vendor) == "AuthenticAMD" else 2


def set_tiles_min(int n):
    """Steps of n tokens or more read tile records in their legacy-quant matmuls (the same
    bits either way; benchmarks and tests). Returns the previous value."""
    global lq_step_tiles_min
    cdef int old = lq_step_tiles_min
    lq_step_tiles_min = max(1, n)
    return old


set_tiles_min(int(os.environ.get("LLMCORE_STEP_TILES_MIN", default_tiles_min())))

# The step's one-token kernels and K-quant tiles ask for their weights 4 KB ahead (simd.h's
# default is 2 KB), a part of each block with each chunk (lq_pf_mode, kq_pf_mode): Xeon with
# AMX, alternated in one process, two threads: a SmolLM2 decode step 0.93x the time at 4 KB,
# gemma-3-270m 0.98x (8 KB: 0.93x / 1.01x; 6 KB as 4 KB; 8 sequences 0.98-0.99x).
simd_pf_dist = 4096

# a step of this many tokens or more per thread (and logits for every one) gives each
# thread a share of the tokens (team_share_take); 0 turns shares off ($LLMCORE_STEP_SHARE_MIN
# overrides default_share_min's choice)
cdef int _share_min = int(os.environ.get("LLMCORE_STEP_SHARE_MIN", default_share_min()))

# a waiting thread spins this long before it sleeps (team.h)
cdef long _spin_ns = int(float(os.environ.get("LLMCORE_STEP_SPIN_US", "50")) * 1000)
TOKENS_MAX = MAX_TOKENS


# A prompt's tile items (more than ROWS_MAX_QG query rows of a kv head) on AMX-BF16 tiles where
# the CPU has them: scores and P.V as products of bf16 high and low parts (~16-bit), not the
# f32 kernels' bits (simd_attention.h attn_tile_item_ab); off with LLMCORE_NO_AMX_BF16=1 or
# LLMCORE_NO_AMX=1
AMX_BF16 = bool(ab_init(ab_env_on()))


def _set_amx_bf16(int on):
    """attention._set_amx_bf16 for the fused steps' attention (tile items of short prompts).
    Returns whether tile items now run on AMX-BF16."""
    return bool(ab_init(on))


def _set_pf_spread(int on):
    """Whether decode attention asks for the next K/V block over every kv head's pass
    (simd_attention.h attn_pf_spread; A/B in benchmarks). Returns the previous value."""
    return attn_set_pf_spread(on)


cdef amax_lanes *_amax_new(int n_threads, int64_t m) except NULL:
    """Running maxima for m logits rows and each of n_threads threads (thread th's row t at
    th * m + t), initialized; free() them."""
    cdef amax_lanes *a = <amax_lanes *>simd_alloc(n_threads * m * sizeof(amax_lanes))
    cdef int64_t i
    if a == NULL:
        raise MemoryError()
    for i in range(n_threads * m):
        amax_init(&a[i])
    return a


cdef void _amax_rows(amax_lanes *a, int n_threads, int64_t m, int64_t *out) noexcept nogil:
    """The threads' maxima merged into the first's; out[t]: row t's argmax (-1: a NaN or
    only -inf, for np.argmax to decide)."""
    cdef int64_t t
    cdef int th
    for t in range(m):
        for th in range(1, n_threads):
            amax_merge(&a[t], &a[th * m + t])
        out[t] = amax_row(&a[t])


def _argmax_pieces(const float[:, ::1] y, const int64_t[::1] cuts, int n_threads):
    """Tests: each row's argmax as the head finds it (simd_argmax.h), the vocabulary cut
    into the pieces [cuts[i], cuts[i + 1]) (work items) and piece i folded in by simulated
    thread i % n_threads, then the threads merged. -1 for a row holding a NaN or only -inf."""
    cdef int64_t m = y.shape[0], t, j
    out = np.empty(m, np.int64)
    cdef int64_t[::1] o = out
    cdef amax_lanes *a = _amax_new(n_threads, m)
    try:
        for j in range(cuts.shape[0] - 1):
            for t in range(m):
                amax_update(&a[(j % n_threads) * m + t], &y[t, 0], cuts[j], cuts[j + 1])
        if m > 0:
            _amax_rows(a, n_threads, m, &o[0])
    finally:
        free(a)
    return out


def _set_pv_scales_first(int on):
    """Whether decode P.V over a Q4_0 or Q8_0 V converts the block scales of an item's keys first
    (simd_attention.h attn_block_scales; the same bits; A/B in benchmarks). Returns the previous
    value."""
    return attn_set_pv_scales_first(on)


def _set_pf_lin(int on):
    """Whether decode attention's spread prefetch parts go as one prefetch a new line
    (simd_attention.h attn_pf_lin; A/B in benchmarks). Returns the previous value."""
    return attn_set_pf_lin(on)


def _set_split_heads(int on):
    """Whether a lone decode rows item over few keys goes out as two items of half its heads
    each (attn_plan.pxd SPLIT_HEADS_MAX_KEYS; the same bits; A/B in benchmarks). Returns the
    previous value."""
    return attn_set_split_heads(on)


def _set_kq_pf_mode(int mode):
    """(A/B) How the repacked K-quant kernels ask for their weights ahead: 1 a slice with each
    chunk into L2 (default), 2 the same into L1, 0 a whole tile at its start. Returns the
    previous setting."""
    return kq_set_pf_mode(mode)


def _set_lq_pf_mode(int mode):
    """(A/B) How the one- to few-token legacy-quant kernels ask for a block ahead: 1 a part with
    each chunk (default), 0 the whole block at its start. Returns the previous setting."""
    return lq_set_pf_mode(mode)


def _set_pf_dist(int nbytes):
    """(A/B) Bytes the step's streaming kernels ask for ahead (simd.h's simd_pf_dist in this
    module). Returns the previous setting."""
    global simd_pf_dist
    cdef int old = simd_pf_dist
    simd_pf_dist = nbytes
    return old


def _set_tile_pf_dist(int nbytes):
    """Benchmarks: how far ahead (bytes) a one-tile matmul pass (2-8 tokens) asks for its
    weights (the same bits at any distance). Returns the previous value."""
    global lq_tile_pf_dist
    cdef int old = lq_tile_pf_dist
    lq_tile_pf_dist = nbytes
    return old


def _set_mm_pf_spread(int on):
    """Whether a step's tile matmul passes ask for the next row group a slice each
    (simd_quants.h lq_tile_pfd; A/B in benchmarks). Returns the previous value."""
    global lq_pf_spread
    cdef int old = lq_pf_spread
    lq_pf_spread = on
    return old


def _set_lanes_min_rows(int n):
    """attention._set_lanes_min_rows for the fused steps' attention (benchmarks compare the
    two forms of a rows item). Returns the previous value."""
    return attn_set_lanes_min_rows(n)


# without token shares, a step's row phases still give each thread a share of half tiles
# (LQ_TT / 2 tokens: their tile-record lines are their own) when there are two or more
cdef int _row_shares_on = int(os.environ.get("LLMCORE_STEP_ROW_SHARES", "1"))


# attention items quantize their output rows' blocks for the output projection themselves
# (no row phase between attention and wo) where no row is split over items
cdef int _wo_fuse_on = int(os.environ.get("LLMCORE_STEP_WO_FUSE", "1"))


def _set_wo_fuse(int on):
    """Whether attention items quantize their rows for wo (_attn_item_out) where the step
    allows it (benchmarks compare the two). Returns the previous value."""
    global _wo_fuse_on
    cdef int old = _wo_fuse_on
    _wo_fuse_on = on
    return old


# ... and the attention items go by the same shares (a thread quantizes for wo the rows it
# attended)
cdef int _attn_row_shares_on = int(os.environ.get("LLMCORE_STEP_ATTN_ROW_SHARES", "1"))


def _set_attn_row_shares(int on):
    """Whether the attention items of a step with row shares but no token shares go to the
    threads by the same half tiles (benchmarks compare the two). Returns the previous value."""
    global _attn_row_shares_on
    cdef int old = _attn_row_shares_on
    _attn_row_shares_on = on
    return old


def _set_row_shares(int on):
    """Whether the row phases of a step without token shares go by half-tile shares
    (benchmarks compare the two). Returns the previous value."""
    global _row_shares_on
    cdef int old = _row_shares_on
    _row_shares_on = on
    return old


def set_share_min(int tokens):
    """Tokens per thread from which a step's row and matmul items go by token shares
    (team_share_take; 0: never). Returns the previous value (benchmarks compare the two)."""
    global _share_min
    cdef int old = _share_min
    _share_min = tokens
    return old


def set_spin_us(double us):
    """How long a thread waiting at a barrier spins before it sleeps (microseconds; the
    default is $LLMCORE_STEP_SPIN_US or 50). Returns the previous value."""
    global _spin_ns
    cdef double old = _spin_ns / 1000.0
    _spin_ns = <long>(us * 1000)
    return old


cdef struct weight_t:
    int kind
    lq_packed lq          # W_LQ, W_FLOAT
    int type              # ggml type
    const uint8_t *data
    int64_t rows, cols, row_stride, n_items, tt


cdef struct linear_t:
    int n_parts
    weight_t part[3]
    int64_t col0[3]       # part p writes output columns [col0[p], col0[p] + rows)
    int64_t item0[4]      # first work item of each part (item0[n_parts] = all items)
    int64_t out_features, in_features
    const float *bias     # (out_features,) or NULL


cdef struct acts_t:       # one part's input rows, quantized as its kernel wants them
    uint8_t *rec          # W_LQ, many rows: tile records (LQ_TT rows each), else NULL
    int8_t *qa
    float *da
    float *sa
    kq_q8k *q8k
    kq_act kact
    const float *xf       # W_FLOAT: the float rows themselves


cdef struct layer_t:
    const float *attn_norm
    const float *attn_post
    const float *ffn_norm
    const float *ffn_post
    float attn_eps, attn_post_eps, ffn_eps, ffn_post_eps
    int has_attn_post, has_ffn_post
    linear_t qkv, wo, gate_up, down
    int act               # 0 SiLU, 1 GELU
    int64_t n_ff
    int wo_ok             # attention items may quantize their rows for wo themselves
    int H, KVH, D, Dv, n_rot, neox, rope_id, plan_id
    const float *q_norm
    const float *k_norm
    float qk_eps
    float scale, softcap
    const float *sinks
    # set per run: this layer's K/V pools
    uint8_t *k_pool
    uint8_t *v_pool
    long k_bstride, v_bstride


cdef struct plan_geom_t:  # the attention geometry shared by the layers of one (pool, window)
    int kv_type, bs, k_row, v_row, H, KVH, D, Dv, window, k_tiled


cdef struct rope_cfg_t:
    int n_rot
    float base, freq_scale


cdef struct step_t:
    int n, d, S, n_logits, n_layers
    const int32_t *pos
    const int32_t *seg_start
    const int64_t *logit_rows
    float *logits
    int64_t n_vocab
    attn_plan pl[4]
    attn_ctx ctx[4]
    int32_t *blk[4]       # (n,) block id of each token in each plan's tables
    float *rope[4]        # (n, n_rot) cos/sin of each token for each rope config
    int n_rot[4]
    const float *x_in     # (n, d) the embeddings
    # shared buffers
    float *x
    float *h
    float *t
    float *act
    float *y_qkv
    float *y_wo
    float *y_gu
    float *y_down
    float *q
    float *o
    acts_t acts[3]
    long attn_buf
    team_t team
    team_phase_t *ph      # the step's phases, in order (zeroed)
    int failed            # a thread could not get its scratch
    double *prof          # (N_PHASES,) ns thread 0 spent up to the end of each phase, or NULL
    amax_lanes *amax      # (threads, n_logits) running maxima of the logits rows, or NULL


# ---- weights ---------------------------------------------------------------------------
cdef inline void _item_rows(const weight_t *w, int64_t it, int64_t *r0, int64_t *r1) noexcept nogil:
    cdef int64_t per = KQ_ROWS if w.kind == W_KQRAW else (FLOAT_ROWS if w.kind == W_FLOAT else 16)
    r0[0] = it * per
    r1[0] = r0[0] + per if r0[0] + per < w.rows else w.rows


cdef inline int64_t _act_bytes(const weight_t *w, int64_t n) noexcept nogil:
    """Bytes of one part's quantized input for n rows (64-byte multiples)."""
    cdef int64_t K = w.cols
    cdef int64_t b
    if w.kind == W_LQ:  # row-major, or (lq_step_tiles_ok) tile records
        b = ((n * K + 63) // 64) * 64 + 2 * (((n * (K // QK8) * 4) + 63) // 64) * 64
        return max(b, ((n + LQ_TT - 1) // LQ_TT) * lq_tile_bytes(K // QK8))
    if w.kind == W_KQ or w.kind == W_KQRAW:
        return ((n * (K // QK_K) * sizeof(kq_q8k) + 63) // 64) * 64
    return 0


cdef inline void _acts_at(const weight_t *w, int64_t n, uint8_t *buf, const float *x, acts_t *a) noexcept nogil:
    """Lay out one part's activation buffer (from _act_bytes(w, n) bytes at buf) for the
    input rows x (which a float weight reads as they are)."""
    cdef int64_t K = w.cols
    a.rec = NULL
    a.qa = NULL
    a.da = NULL
    a.sa = NULL
    a.q8k = NULL
    a.xf = x
    if w.kind == W_LQ and lq_step_tiles_ok(&w.lq, n):
        a.rec = buf  # ceil(n / LQ_TT) tiles of nb records
    elif w.kind == W_LQ:
        a.qa = <int8_t *>buf
        a.da = <float *>(buf + ((n * K + 63) // 64) * 64)
        a.sa = a.da + ((n * (K // QK8) * 4 + 63) // 64) * 16
    elif w.kind == W_KQ or w.kind == W_KQRAW:
        a.q8k = <kq_q8k *>buf
        a.kact.q8k = a.q8k
        a.kact.aq = NULL
        a.kact.ad = NULL
        a.kact.as_ = NULL
        a.kact.no_amx = 1


cdef inline uint8_t *_tile_rec(const weight_t *w, uint8_t *rec, int64_t r) noexcept nogil:
    """The tile records (lq_quant_tile's layout) of the tile holding input row r."""
    return rec + (r // LQ_TT) * lq_tile_bytes(w.cols // QK8)


cdef inline void _quant_rows(const weight_t *w, const float *x, int64_t r0, int64_t r1, acts_t *a) noexcept nogil:
    """Rows [r0, r1) of x (row stride w.cols) quantized into a."""
    cdef int64_t K = w.cols, nb = K // QK8, r
    if w.kind == W_LQ and a.rec != NULL:
        for r in range(r0, r1):
            lq_quant_row_tile(x + r * K, K, <int>(r % LQ_TT), w.lq.moff, _tile_rec(w, a.rec, r))
    elif w.kind == W_LQ:
        for r in range(r0, r1):
            lq_quant_row_q8(x + r * K, K, a.qa + r * K, a.da + r * nb, a.sa + r * nb, w.lq.moff)
    elif w.kind == W_KQ or w.kind == W_KQRAW:
        for r in range(r0, r1):
            kq_quantize_q8k(x + r * K, K, a.q8k + r * (K // QK_K))


cdef inline void _mm_item(const weight_t *w, int64_t it, const acts_t *a, int64_t n, float *y,
                          int64_t ldy) noexcept nogil:
    """Work item `it` of y (n, ldy) += ... (output columns of this part start at y)."""
    cdef int64_t r0, r1
    if w.kind == W_LQ and a.rec != NULL:
        lq_group_tiles(&w.lq, it, a.rec, n, y, ldy)
    elif w.kind == W_LQ:
        lq_group_rows_ld(&w.lq, it, a.qa, a.da, a.sa, n, w.tt, y, ldy, 0)
    elif w.kind == W_KQ:
        kq_rp_group(w.type, w.data, w.cols, w.rows, it, &a.kact, 0, n, y, ldy)
    elif w.kind == W_KQRAW:
        _item_rows(w, it, &r0, &r1)
        kq_matmul_rows(w.type, w.data, w.row_stride, r0, r1, w.cols // QK_K, a.q8k, n, y, ldy)
    else:
        _item_rows(w, it, &r0, &r1)
        lq_float_rows_ld(&w.lq, r0, r1, a.xf, y, n, ldy)


cdef inline void _quant_linear(const linear_t *L, const float *x, int64_t r0, int64_t r1, acts_t *acts) noexcept nogil:
    cdef int p
    for p in range(L.n_parts):
        _quant_rows(&L.part[p], x, r0, r1, &acts[p])


# ---- the step ----------------------------------------------------------------------------
PHASES = ("qkv", "rope+kv store", "attention", "attn_output", "ffn gate+up", "ffn down", "head")
cdef enum:
    P_QKV = 0
    P_POST = 1
    P_ATTN = 2
    P_WO = 3
    P_GU = 4
    P_DOWN = 5
    P_HEAD = 6
    N_PHASES = 7


cdef inline void _mark(step_t *S, int tid, int phase, long *t0) noexcept nogil:
    """Profiling (Program.run(prof=...)): thread 0's time since the last mark, to `phase`
    (each phase ends at its barrier, so the row operations before a matmul count to it)."""
    cdef long now
    if S.prof != NULL and tid == 0:
        now = team_now_ns()
        S.prof[phase] += now - t0[0]
        t0[0] = now

cdef inline void _rows_item(const linear_t *L, const float *x, int64_t r, acts_t *acts) noexcept nogil:
    """Row r of x quantized for every part of L."""
    _quant_linear(L, x, r, r + 1, acts)


cdef inline int _deal_shares(int64_t n, int64_t unit, int nt, int64_t *lo) noexcept nogil:
    """lo[0..nt]: n tokens dealt to nt shares in whole units of `unit` tokens, in order;
    returns nt."""
    cdef int64_t nunit = (n + unit - 1) // unit
    cdef int s
    for s in range(nt + 1):
        lo[s] = unit * ((s * nunit) // nt)
        if lo[s] > n:
            lo[s] = n
    return nt


cdef inline int _token_shares(const step_t *S, int nt, int64_t *tlo) noexcept nogil:
    """Token shares of the step (team_share_take): tlo[0..nt] bounds in whole tiles, one share
    a thread; returns nt, or 0 (no shares: too few tokens, or logits for only some rows, whose
    head rows are numbered otherwise)."""
    if _share_min <= 0 or nt < 2 or nt > TEAM_MAX_SHARES or S.n < <int64_t>_share_min * nt or S.n_logits != S.n:
        return 0
    return _deal_shares(S.n, LQ_TT, nt, tlo)


cdef inline int _row_shares(const step_t *S, int nt, int nsh, const int64_t *tlo, int64_t *rlo) noexcept nogil:
    """Shares of the row phases (team_share_take): the token shares (nsh > 0), else (more than
    one half tile of rows and logits for every one) half tiles dealt out in order, so that a
    thread quantizes into tile-record lines no other thread writes (lq_quant_row_tile);
    returns the number of shares, or 0 (rows go one at a time)."""
    cdef int s
    if nsh > 0:
        for s in range(nsh + 1):
            rlo[s] = tlo[s]
        return nsh
    if not _row_shares_on or nt < 2 or nt > TEAM_MAX_SHARES or S.n <= LQ_TT // 2 or S.n_logits != S.n:
        return 0
    return _deal_shares(S.n, LQ_TT // 2, nt, rlo)


cdef int _attn_shares(const attn_plan *pl, int nsh, const int64_t *tlo, int64_t *alo, int32_t *perm) noexcept nogil:
    """perm: a plan's items in share order (an item's share: its first token's), the plan's
    order (costlier first) kept within a share; alo[0..nsh]: the shares' bounds. Returns 0
    when some item has no share (cannot happen: the items then go out in plan order)."""
    cdef int64_t i, m = 0, t
    cdef int s
    for s in range(nsh):
        alo[s] = m
        for i in range(pl.n_items):
            t = pl.toks[pl.items[i].tok0]
            if tlo[s] <= t < tlo[s + 1]:
                perm[m] = <int32_t>i
                m += 1
    alo[nsh] = m
    return m == pl.n_items


cdef inline bint _take_rows(team_phase_t *ph, int64_t total, int nsh, const int64_t *tlo, int tid,
                            int64_t *c0, int64_t *c1) noexcept nogil:
    """The next rows [c0, c1) of a row phase (total rows) for thread tid: its token share
    first (nsh > 0, the rows are the step's tokens), else one row at a time from all."""
    if nsh > 0:
        return team_share_take(ph, tlo, nsh, tid, 1, c0, c1)
    c0[0] = team_phase_take(ph, 1)
    if c0[0] >= total:
        return 0
    c1[0] = c0[0] + 1
    return 1


cdef void _thread_main(const layer_t *layers, const linear_t *head, const float *out_norm, float out_eps,
                       step_t *S) noexcept nogil:
    """One thread's part of the step: every phase's items that it takes (team.h phases)."""
    cdef int tid = team_thread(), nt = team_region_size()
    cdef int n = S.n, d = S.d, i, l, j, hh, H, KVH, D, Dv
    cdef int64_t r, it, i0, i1, total, chunk, F, ldq, pos, blk, c0, c1
    cdef int64_t tlo[TEAM_MAX_SHARES + 1]  # (shares) token share bounds, whole tiles
    cdef int nsh = _token_shares(S, nt, tlo)
    cdef int64_t rlo[TEAM_MAX_SHARES + 1]  # (row shares) the row phases' share bounds
    cdef int rsh = _row_shares(S, nt, nsh, tlo, rlo)
    cdef int ash = rsh if nsh > 0 or _attn_row_shares_on else 0  # attention's shares (rlo)
    # (shares) each plan's items by share, in this thread's scratch at aoff[plan] (-1: a plan
    # no layer uses), the share bounds, and whether they are set (-1: not yet; 0: plan order)
    cdef int64_t aoff[MAX_PLANS]
    cdef int32_t *aperm[MAX_PLANS]
    cdef int64_t alo[MAX_PLANS][TEAM_MAX_SHARES + 1]
    cdef int ashared[MAX_PLANS]
    cdef int awhole[MAX_PLANS]  # (per plan) _items_whole_blocks, -1 until asked
    cdef int64_t nperm = 0
    cdef bint by_share
    for i in range(MAX_PLANS):
        aoff[i] = -1
        ashared[i] = -1
        awhole[i] = -1
    if ash > 0:
        for l in range(S.n_layers):
            if aoff[layers[l].plan_id] < 0:
                aoff[layers[l].plan_id] = nperm
                nperm += S.pl[layers[l].plan_id].n_items
    cdef int k = 0  # the next phase
    cdef int64_t mine = 0  # items this thread did in the current phase (team_phase_done)
    cdef team_phase_t *ph
    cdef acts_t acts[3]
    cdef bint wq
    cdef const layer_t *L
    cdef const layer_t *Ln
    cdef const linear_t *lin
    cdef attn_ctx c
    cdef const attn_ctx *kvc  # the layer's plan geometry (its K/V stores)
    cdef const attn_plan *pl
    cdef const float *src
    cdef const float *yr
    cdef const float *cs
    cdef const float *w_next
    cdef float eps_next
    cdef float *qo
    cdef float *tmp
    cdef long t_mark = team_now_ns() if S.prof != NULL else 0
    # attention scratch, then (shares) the plans' item orders
    cdef float *abuf = <float *>simd_alloc((S.attn_buf + 16) * sizeof(float) + nperm * sizeof(int32_t))
    if abuf == NULL:
        team_flag_set(&S.failed)
        return
    for i in range(MAX_PLANS):
        aperm[i] = <int32_t *>(abuf + S.attn_buf + 16) + aoff[i] if aoff[i] >= 0 else NULL
    for l in range(S.n_layers):
        L = &layers[l]
        H = L.H
        KVH = L.KVH
        D = L.D
        Dv = L.Dv
        F = L.n_ff
        # ---- (layer 0) h = attn_norm(x), quantized for the q/k/v projection
        if l == 0:
            ph = &S.ph[k]
            k += 1
            _lay_acts(&L.qkv, n, S, S.h, acts)
            while _take_rows(ph, n, rsh, rlo, tid, &c0, &c1):
                for i0 in range(c0, c1):
                    rms_row(S.x + i0 * d, NULL, L.attn_norm, L.attn_eps, S.h + i0 * d, d)
                    _rows_item(&L.qkv, S.h, i0, acts)
                mine += c1 - c0
            team_phase_done(ph, &mine, n)
            team_phase_wait(&S.team, ph, n)
        # ---- q/k/v projection
        _lay_acts(&L.qkv, n, S, S.h, acts)
        _linear_phase(&S.ph[k], &S.team, &L.qkv, acts, n, S.y_qkv, nt, nsh, tlo, tid, NULL)
        k += 1
        _mark(S, tid, P_QKV, &t_mark)
        # ---- q/k norms, rope, K/V store: an item a token (its q heads, then its kv heads;
        # a head alone is too little work for the atomic that hands it out)
        ldq = L.qkv.out_features
        ph = &S.ph[k]
        k += 1
        while _take_rows(ph, n, rsh, rlo, tid, &c0, &c1):
            for it in range(c0, c1):
                i = <int>it
                src = S.y_qkv + i * ldq
                cs = S.rope[L.rope_id] + i * L.n_rot if L.n_rot > 0 else NULL
                for j in range(H):
                    qo = S.q + (<int64_t>i * H + j) * D
                    memcpy(qo, src + j * D, D * sizeof(float))
                    if L.q_norm != NULL:
                        rms_row(qo, NULL, L.q_norm, L.qk_eps, qo, D)
                    if L.n_rot > 0:
                        rope_apply(qo, L.n_rot, L.neox, cs)
                pos = S.pos[i]
                blk = S.blk[L.plan_id][i]
                for hh in range(KVH):
                    tmp = abuf  # D floats of this thread's own
                    memcpy(tmp, src + H * D + hh * D, D * sizeof(float))
                    if L.k_norm != NULL:
                        rms_row(tmp, NULL, L.k_norm, L.qk_eps, tmp, D)
                    if L.n_rot > 0:
                        rope_apply(tmp, L.n_rot, L.neox, cs)
                    kvc = &S.ctx[L.plan_id]
                    store_slot(tmp, T_Q4_0_TILES if kvc.k_tiled else kvc.kv_type, L.k_pool + blk * L.k_bstride,
                               <int>(pos % kvc.bs), hh, KVH, kvc.k_row, D)
                    store_slot(src + H * D + KVH * D + hh * Dv, kvc.kv_type, L.v_pool + blk * L.v_bstride,
                               <int>(pos % kvc.bs), hh, KVH, kvc.v_row, Dv)
            mine += c1 - c0
        team_phase_done(ph, &mine, n)
        team_phase_wait(&S.team, ph, n)
        _mark(S, tid, P_POST, &t_mark)
        # ---- attention items, then the merge of rows split over key chunks
        c = S.ctx[L.plan_id]
        c.k = L.k_pool
        c.v = L.v_pool
        c.k_bstride = L.k_bstride
        c.v_bstride = L.v_bstride
        c.scale = L.scale
        c.softcap = L.softcap
        c.sinks = L.sinks
        pl = &S.pl[L.plan_id]
        ph = &S.ph[k]
        k += 1
        if ash > 0 and ashared[L.plan_id] < 0:
            ashared[L.plan_id] = _attn_shares(pl, ash, rlo, &alo[L.plan_id][0], aperm[L.plan_id])
        by_share = ash > 0 and ashared[L.plan_id] == 1
        if L.wo_ok and _wo_fuse_on and awhole[L.plan_id] < 0:
            awhole[L.plan_id] = _items_whole_blocks(pl, Dv)
        wq = L.wo_ok and _wo_fuse_on and awhole[L.plan_id] == 1
        if wq:  # each item quantizes its rows for wo
            _lay_acts(&L.wo, n, S, S.o, acts)
        while by_share and team_share_take(ph, &alo[L.plan_id][0], ash, tid, 0, &c0, &c1):
            for it in range(c0, c1):
                attn_run_item(&c, &pl.items[aperm[L.plan_id][it]], abuf)
                if wq:
                    _attn_item_out(L, pl, &pl.items[aperm[L.plan_id][it]], S.o, acts)
            mine += c1 - c0
        while not by_share:
            it = team_phase_take(ph, 1)
            if it >= pl.n_items:
                break
            attn_run_item(&c, &pl.items[it], abuf)
            if wq:
                _attn_item_out(L, pl, &pl.items[it], S.o, acts)
            mine += 1
        team_phase_done(ph, &mine, pl.n_items)
        team_phase_wait(&S.team, ph, pl.n_items)
        ph = &S.ph[k]
        k += 1
        total = <int64_t>n * H if pl.n_merge else 0
        while True:
            it = team_phase_take(ph, H)
            if it >= total:
                break
            if c.nparts[it // H] > 1:
                for hh in range(H):
                    attn_merge(&c, <int>(it // H), hh)
            mine += H
        team_phase_done(ph, &mine, total)
        team_phase_wait(&S.team, ph, total)
        _mark(S, tid, P_ATTN, &t_mark)
        # ---- output projection (its input quantized by the attention items, or here)
        if not wq:
            ph = &S.ph[k]
            k += 1
            _lay_acts(&L.wo, n, S, S.o, acts)
            while _take_rows(ph, n, rsh, rlo, tid, &c0, &c1):
                for i0 in range(c0, c1):
                    _rows_item(&L.wo, S.o, i0, acts)
                mine += c1 - c0
            team_phase_done(ph, &mine, n)
            team_phase_wait(&S.team, ph, n)
        _linear_phase(&S.ph[k], &S.team, &L.wo, acts, n, S.y_wo, nt, nsh, tlo, tid, NULL)
        k += 1
        _mark(S, tid, P_WO, &t_mark)
        # ---- x += post_norm?(wo); h = ffn_norm(x), quantized for gate/up
        ph = &S.ph[k]
        k += 1
        _lay_acts(&L.gate_up, n, S, S.h, acts)
        while _take_rows(ph, n, rsh, rlo, tid, &c0, &c1):
            for r in range(c0, c1):
                yr = S.y_wo + r * d
                if L.has_attn_post:
                    rms_row(<float *>yr, NULL, L.attn_post, L.attn_post_eps, S.t + r * d, d)
                    yr = S.t + r * d
                rms_row(S.x + r * d, yr, L.ffn_norm, L.ffn_eps, S.h + r * d, d)
                _rows_item(&L.gate_up, S.h, r, acts)
            mine += c1 - c0
        team_phase_done(ph, &mine, n)
        team_phase_wait(&S.team, ph, n)
        _linear_phase(&S.ph[k], &S.team, &L.gate_up, acts, n, S.y_gu, nt, nsh, tlo, tid, NULL)
        k += 1
        _mark(S, tid, P_GU, &t_mark)
        # ---- act(gate) * up, quantized for down
        ph = &S.ph[k]
        k += 1
        _lay_acts(&L.down, n, S, S.act, acts)
        while _take_rows(ph, n, rsh, rlo, tid, &c0, &c1):
            for r in range(c0, c1):
                if L.act == 0:
                    act_silu_row(S.y_gu + r * 2 * F, S.y_gu + r * 2 * F + F, S.act + r * F, <int>F)
                else:
                    act_gelu_row(S.y_gu + r * 2 * F, S.y_gu + r * 2 * F + F, S.act + r * F, <int>F)
                _rows_item(&L.down, S.act, r, acts)
            mine += c1 - c0
        team_phase_done(ph, &mine, n)
        team_phase_wait(&S.team, ph, n)
        _linear_phase(&S.ph[k], &S.team, &L.down, acts, n, S.y_down, nt, nsh, tlo, tid, NULL)
        k += 1
        _mark(S, tid, P_DOWN, &t_mark)
        # ---- x += post_norm?(down); h = the next norm of x, quantized for the next matmul:
        # the next layer's attn_norm and q/k/v, or after the last layer out_norm and the
        # head, for the logit rows only (their h rows in logit order)
        if l + 1 < S.n_layers:
            Ln = &layers[l + 1]
            lin = &Ln.qkv
            w_next = Ln.attn_norm
            eps_next = Ln.attn_eps
            total = n
        else:
            lin = head
            w_next = out_norm
            eps_next = out_eps
            total = S.n_logits
        ph = &S.ph[k]
        k += 1
        _lay_acts(lin, total, S, S.h, acts)
        while _take_rows(ph, total, rsh, rlo, tid, &c0, &c1):
            for i0 in range(c0, c1):
                r = i0 if l + 1 < S.n_layers else S.logit_rows[i0]
                yr = S.y_down + r * d
                if L.has_ffn_post:
                    rms_row(<float *>yr, NULL, L.ffn_post, L.ffn_post_eps, S.t + r * d, d)
                    yr = S.t + r * d
                rms_row(S.x + r * d, yr, w_next, eps_next, S.h + i0 * d, d)
                _rows_item(lin, S.h, i0, acts)
            mine += c1 - c0
        team_phase_done(ph, &mine, total)
        team_phase_wait(&S.team, ph, total)
    # ---- head
    _lay_acts(head, S.n_logits, S, S.h, acts)
    _linear_phase(&S.ph[k], &S.team, head, acts, S.n_logits, S.logits, nt, nsh, tlo, tid,
                  S.amax + tid * S.n_logits if S.amax != NULL else NULL)
    k += 1
    _mark(S, tid, P_HEAD, &t_mark)
    free(abuf)


cdef inline int _part_of(const linear_t *L, int64_t it) noexcept nogil:
    """The part of L holding work item `it` (over all parts)."""
    cdef int p = 0
    while it >= L.item0[p + 1]:
        p += 1
    return p


cdef inline void _add_bias(const linear_t *L, int p, int64_t it, int64_t n, float *y) noexcept nogil:
    """y (n, out_features) += L's bias over the output rows of item `it` of part p."""
    cdef int64_t r0, r1, t, r
    cdef float *yp = y + L.col0[p]
    _item_rows(&L.part[p], it - L.item0[p], &r0, &r1)
    for t in range(n):
        for r in range(r0, r1):
            yp[t * L.out_features + r] += L.bias[L.col0[p] + r]


cdef inline void _linear_item(const linear_t *L, const acts_t *acts, int64_t n, float *y, int64_t it) noexcept nogil:
    """Work item `it` (over all parts) of y (n, out_features) = x @ W.T (+ bias)."""
    cdef int p = _part_of(L, it)
    _mm_item(&L.part[p], it - L.item0[p], &acts[p], n, y + L.col0[p], L.out_features)
    if L.bias != NULL:
        _add_bias(L, p, it, n, y)


cdef bint _pair_on = 1  # A/B switch (_set_pair): few-token chunks read as two streams


def _set_pair(bint on):
    """Benchmarks and tests: matmul chunks of row-major steps (1 to 7 tokens) read as two
    weight streams (default) or one (the same bits). Returns the previous setting."""
    global _pair_on
    cdef bint old = _pair_on
    _pair_on = on
    return old


cdef inline void _linear_items_paired(const linear_t *L, const acts_t *acts, int64_t n, float *y, int64_t i0,
                                      int64_t i1) noexcept nogil:
    """Items [i0, i1) of a matmul of n row-major rows (a step of 1 to 7 tokens): the first
    half's item j beside the second half's item j where both are row groups of repacked
    weights of one format and width (one part or two: lq_group_pair, kq_rp_group_pair; a core
    reads two weight streams faster than one), else one by one (_linear_item). The same bits
    either way."""
    cdef int64_t h = (i1 - i0) // 2, j, a, b
    cdef int p, q
    cdef const weight_t *wa
    cdef const weight_t *wb
    for j in range(h):
        a = i0 + j
        b = i0 + h + j
        p = _part_of(L, a)
        q = _part_of(L, b)
        wa = &L.part[p]
        wb = &L.part[q]
        if (wa.kind == W_LQ and wb.kind == W_LQ and acts[p].rec == NULL and acts[q].rec == NULL
                and lq_pair_ok(&wa.lq, &wb.lq)):
            lq_group_pair(&wa.lq, a - L.item0[p], acts[p].qa, acts[p].da, acts[p].sa, y + L.col0[p], wa.rows,
                          &wb.lq, b - L.item0[q], acts[q].qa, acts[q].da, acts[q].sa, y + L.col0[q], wb.rows,
                          n, L.out_features)
        elif wa.kind == W_KQ and wb.kind == W_KQ and wa.type == wb.type and wa.cols == wb.cols:
            kq_rp_group_pair(wa.type, wa.cols, wa.data, wa.rows, a - L.item0[p], &acts[p].kact, y + L.col0[p],
                             wb.data, wb.rows, b - L.item0[q], &acts[q].kact, y + L.col0[q], 0, n, L.out_features)
        else:
            _linear_item(L, acts, n, y, a)
            _linear_item(L, acts, n, y, b)
            continue
        if L.bias != NULL:
            _add_bias(L, p, a, n, y)
            _add_bias(L, q, b, n, y)
    if (i1 - i0) % 2:
        _linear_item(L, acts, n, y, i1 - 1)


cdef int _items_whole_blocks(const attn_plan *pl, int Dv) noexcept nogil:
    """Whether every item of pl writes whole 32-value blocks of whole rows (no row split over
    key chunks; its heads' columns start and end on block bounds): _attn_item_out's case."""
    cdef long i
    if pl.n_merge:
        return 0
    for i in range(pl.n_items):
        if (<int64_t>pl.items[i].h0 * Dv) % QK8 or (<int64_t>pl.items[i].h1 * Dv) % QK8:
            return 0
    return 1


cdef inline void _attn_item_out(const layer_t *L, const attn_plan *pl, const attn_item *item, const float *o,
                                acts_t *wacts) noexcept nogil:
    """The rows an attention item wrote (its tokens' heads h0..h1 of o), quantized as their
    blocks of wo's input: a block's quantization is its own, so the same bits as the row
    phase's (the rows are whole: no token is split over items)."""
    cdef const weight_t *w = &L.wo.part[0]
    cdef int64_t K = w.cols, nb = K // QK8, c0 = <int64_t>item.h0 * L.Dv, b0 = c0 // QK8
    cdef int64_t m = (<int64_t>(item.h1 - item.h0) * L.Dv) // QK8, r
    cdef int i
    for i in range(item.tok0, item.tok1):
        r = pl.toks[i]
        if wacts.rec != NULL:
            lq_quant_blocks_tile(o + r * K + c0, b0, m, nb, <int>(r % LQ_TT), w.lq.moff, _tile_rec(w, wacts.rec, r))
        else:
            lq_quant_row_q8(o + r * K + c0, m * QK8, wacts.qa + r * K + c0, wacts.da + r * nb + b0,
                            wacts.sa + r * nb + b0, w.lq.moff)


cdef void _amax_items(const linear_t *L, amax_lanes *am, int64_t t0, int64_t t1, const float *y, int64_t i0,
                      int64_t i1) noexcept nogil:
    """Fold the output rows of items [i0, i1) of y (n, out_features) into the running maxima
    am[t] of rows t0 <= t < t1 (simd_argmax.h: while they are in cache)."""
    cdef int64_t it = i0, e, r0, r1, ra, rb, t
    cdef int p
    while it < i1:
        p = _part_of(L, it)
        e = L.item0[p + 1] if L.item0[p + 1] < i1 else i1
        _item_rows(&L.part[p], it - L.item0[p], &r0, &ra)
        _item_rows(&L.part[p], e - 1 - L.item0[p], &rb, &r1)
        for t in range(t0, t1):
            amax_update(&am[t], y + t * L.out_features, L.col0[p] + r0, L.col0[p] + r1)
        it = e


cdef void _linear_phase(team_phase_t *ph, const team_t *team, const linear_t *L, const acts_t *acts, int64_t n,
                        float *y, int nt, int nsh, const int64_t *tlo, int tid, amax_lanes *am) noexcept nogil:
    """A matmul as one phase: chunks of consecutive work items (a few per thread, so each
    streams contiguous weights), taken by whichever thread is free. With token shares (nsh,
    tile records in every part) an item is a row group for one share's tokens, and a thread
    takes its own share's first (team_share_take): the tile records it reads are the ones it
    wrote (the same sums: a token's are its own). am (the head, when the caller wants each
    row's argmax): this thread's running maxima of the n output rows, updated item by item
    (a thread's items come in increasing order, as amax_update needs)."""
    cdef int64_t total = L.item0[L.n_parts], chunk, i0, i1, it, mine = 0
    cdef int64_t mlo[TEAM_MAX_SHARES + 1]
    cdef acts_t sacts[MAX_PARTS]
    cdef int p, sh = -1, s
    if nsh > 0:
        for p in range(L.n_parts):
            if acts[p].rec == NULL:
                nsh = 0
    if nsh > 0:
        for s in range(nsh + 1):
            mlo[s] = s * total
        while team_share_take(ph, mlo, nsh, tid, 1, &i0, &i1):
            for it in range(i0, i1):
                s = <int>(it // total)
                if s != sh:  # the share's tile records
                    sh = s
                    for p in range(L.n_parts):
                        sacts[p] = acts[p]
                        sacts[p].rec = _tile_rec(&L.part[p], acts[p].rec, tlo[s])
                _linear_item(L, sacts, tlo[s + 1] - tlo[s], y + tlo[s] * L.out_features, it - s * total)
                if am != NULL:
                    _amax_items(L, am, tlo[s], tlo[s + 1], y, it - s * total, it - s * total + 1)
            mine += i1 - i0
        team_phase_done(ph, &mine, nsh * total)
        team_phase_wait(team, ph, nsh * total)
        return
    chunk = total // (MM_CHUNKS * nt)
    if chunk < 1:
        chunk = 1
    while True:
        i0 = team_phase_take(ph, chunk)
        if i0 >= total:
            break
        i1 = i0 + chunk if i0 + chunk < total else total
        if n < PAIR_MAX_TOKENS and _pair_on:
            _linear_items_paired(L, acts, n, y, i0, i1)
        else:
            for it in range(i0, i1):
                _linear_item(L, acts, n, y, it)
        if am != NULL:
            _amax_items(L, am, 0, n, y, i0, i1)
        mine += i1 - i0
    team_phase_done(ph, &mine, total)
    team_phase_wait(team, ph, total)


cdef inline void _lay_acts(const linear_t *L, int64_t n, step_t *S, const float *x, acts_t *acts) noexcept nogil:
    """Point acts at the shared quantized-input buffers, laid out for L's parts and the
    input rows x."""
    cdef int p
    for p in range(L.n_parts):
        _acts_at(&L.part[p], n, <uint8_t *>S.acts[p].qa, x, &acts[p])


# ---- the program -------------------------------------------------------------------------
def weight_kind(packed, str module):
    """The fused kernel for a packed weight of kernel module `module`, or None."""
    layout = packed.layout
    if module == "quants":
        return W_LQ if layout == "repacked16" else W_FLOAT
    if module == "kquants" and packed.ggml_type != 39:  # MXFP4 quantizes its input otherwise
        return W_KQ if layout == "repacked16" else W_KQRAW
    return None


cdef class Program:
    """A model's decode step (see the module docstring). Holds references to every array
    whose memory it points into."""

    cdef layer_t *layers
    cdef linear_t head
    cdef int n_layers, n_embd, n_plans, n_ropes
    cdef int64_t n_vocab, max_out, max_k, max_parts_bytes
    cdef const float *out_norm
    cdef float out_eps
    cdef plan_geom_t plans[4]
    cdef rope_cfg_t ropes[4]
    cdef list keep
    cdef list pool_arrays
    cdef int64_t plan_blocks[4]
    cdef readonly int ready, pools_set

    def __cinit__(self, int n_layers, int n_embd, out_norm, float out_eps, head_parts, int64_t n_vocab):
        self.layers = <layer_t *>malloc(max(n_layers, 1) * sizeof(layer_t))
        if self.layers == NULL:
            raise MemoryError()
        self.n_layers = n_layers
        self.n_embd = n_embd
        self.n_vocab = n_vocab
        self.keep = []
        self.max_out = 0
        self.max_k = n_embd
        self.n_plans = 0
        self.n_ropes = 0
        self.ready = 0
        self.out_norm = self._f32(out_norm, n_embd)
        self.out_eps = out_eps
        self._linear(&self.head, head_parts, None, n_embd)
        self.max_out = 0  # the head writes the logits: the layers' outputs size the buffers
        if self.head.out_features != n_vocab:
            raise ValueError("Program: the head's rows are not the vocabulary")

    def __dealloc__(self):
        free(self.layers)

    cdef const float *_f32(self, arr, int64_t size) except? NULL:
        """A float32 (size,) array's data (kept alive), or NULL for None."""
        if arr is None:
            return NULL
        a = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
        if a.shape[0] != size:
            raise ValueError(f"Program: expected {size} values, got {a.shape[0]}")
        self.keep.append(a)
        return <const float *><size_t>a.ctypes.data

    cdef int _linear(self, linear_t *L, list parts, bias, int64_t in_features) except -1:
        """parts: [(packed, kernel module name)], their outputs side by side."""
        cdef int p, kind
        cdef weight_t *w
        cdef int64_t col = 0
        if not 1 <= len(parts) <= MAX_PARTS:
            raise ValueError("Program: a linear has 1 to 3 parts")
        L.n_parts = len(parts)
        L.item0[0] = 0
        for p, (pk, module) in enumerate(parts):
            k = weight_kind(pk, module)
            if k is None:
                raise ValueError(f"Program: no fused kernel for {module} type {pk.ggml_type} ({pk.layout})")
            kind = k
            if pk.cols != in_features:
                raise ValueError("Program: the parts of a linear read inputs of different sizes")
            w = &L.part[p]
            w.kind = kind
            w.type = pk.ggml_type
            w.rows = pk.rows
            w.cols = pk.cols
            self.keep.append(pk)
            buf = pk.buf if kind != W_KQRAW else pk.raw
            self.keep.append(buf)
            w.data = <const uint8_t *><size_t>buf.ctypes.data
            w.row_stride = buf.strides[0] if kind == W_KQRAW else 0
            if kind == W_LQ or kind == W_FLOAT:
                lq_init_packed(&w.lq, w.type, w.rows, w.cols, w.data)
                w.tt = lq_tile_tokens(&w.lq, 0)
                w.n_items = w.lq.ngroups if kind == W_LQ else (w.rows + FLOAT_ROWS - 1) // FLOAT_ROWS
            elif kind == W_KQ:
                w.n_items = (w.rows + 15) // 16
            else:
                w.n_items = (w.rows + KQ_ROWS - 1) // KQ_ROWS
            if kind != W_FLOAT and (w.cols % (QK_K if kind >= W_KQ else QK8)):
                raise ValueError("Program: input size is not a whole number of blocks")
            L.col0[p] = col
            col += w.rows
            L.item0[p + 1] = L.item0[p] + w.n_items
            self.max_parts_bytes = max(self.max_parts_bytes, _act_bytes(w, MAX_TOKENS))
        L.out_features = col
        L.in_features = in_features
        L.bias = self._f32(bias, col) if bias is not None else NULL
        self.max_out = max(self.max_out, col)
        self.max_k = max(self.max_k, in_features)
        return 0

    def wo_layers(self):
        """How many layers' attention items quantize their rows for wo themselves."""
        return sum(self.layers[i].wo_ok for i in range(self.n_layers))

    def set_pools(self, list kv_pools):
        """Each layer's K/V pool storage: kv_pools[i] = (k, v), uint8 (n_blocks, block
        bytes) views (call again whenever a pool has grown: growth moves the arrays)."""
        cdef int l
        cdef layer_t *L
        cdef const uint8_t[:, ::1] kv
        if len(kv_pools) != self.n_layers:
            raise ValueError("Program.set_pools: one (k, v) pair per layer")
        for l in range(self.n_plans):
            self.plan_blocks[l] = -1
        for l in range(self.n_layers):
            L = &self.layers[l]
            kp, vp = kv_pools[l]
            if kp.shape[0] != vp.shape[0]:
                raise ValueError("Program.set_pools: K and V pools of different sizes")
            kv = kp
            L.k_pool = <uint8_t *>&kv[0, 0] if kv.shape[0] > 0 else NULL
            L.k_bstride = kv.strides[0]
            kv = vp
            L.v_pool = <uint8_t *>&kv[0, 0] if kv.shape[0] > 0 else NULL
            L.v_bstride = kv.strides[0]
            if self.plan_blocks[L.plan_id] < 0 or kp.shape[0] < self.plan_blocks[L.plan_id]:
                self.plan_blocks[L.plan_id] = kp.shape[0]
        self.pool_arrays = list(kv_pools)  # keeps the storage alive
        self.pools_set = 1

    def workspace_bytes(self, int n):
        """Bytes of the workspace a step of n tokens uses (run(work=...))."""
        return (((6 * n * self.max_k + 4 * n * self.max_out) * 4 + 63) // 64 * 64 + 3 * self.max_parts_bytes
                + (3 + 12 * self.n_layers) * sizeof(team_phase_t) + 64)

    def add_rope(self, int n_rot, float base, float freq_scale):
        """Id of a rope configuration (one cos/sin table per token and step each)."""
        cdef int i
        for i in range(self.n_ropes):
            if self.ropes[i].n_rot == n_rot and self.ropes[i].base == base and self.ropes[i].freq_scale == freq_scale:
                return i
        if self.n_ropes == MAX_ROPES:
            raise ValueError("Program: too many rope configurations")
        self.ropes[self.n_ropes].n_rot = n_rot
        self.ropes[self.n_ropes].base = base
        self.ropes[self.n_ropes].freq_scale = freq_scale
        self.n_ropes += 1
        return self.n_ropes - 1

    def add_plan(self, int kv_type, int bs, int k_row, int v_row, int H, int KVH, int D, int Dv, int window,
                 bint k_tiled=False):
        """Id of an attention geometry (one plan per step each: a pool and a window); k_tiled: a
        Q4_0 K pool of 16-key tiles (simd_kv_rows.h)."""
        cdef int i
        cdef plan_geom_t *g
        for i in range(self.n_plans):
            g = &self.plans[i]
            if (g.kv_type, g.bs, g.k_row, g.v_row, g.H, g.KVH, g.D, g.Dv, g.window, g.k_tiled) == (
                    kv_type, bs, k_row, v_row, H, KVH, D, Dv, window, k_tiled):
                return i
        if self.n_plans == MAX_PLANS:
            raise ValueError("Program: too many attention geometries")
        g = &self.plans[self.n_plans]
        if k_tiled and not kv_tiles_ok(kv_type == T_Q4_0, bs, D):
            raise ValueError("Program.add_plan: a tiled K pool is Q4_0 with block_size % 16 == 0 and head_dim % 32 == 0, <= 1024")
        g.kv_type, g.bs, g.k_row, g.v_row, g.H, g.KVH, g.D, g.Dv, g.window = kv_type, bs, k_row, v_row, H, KVH, D, Dv, window
        g.k_tiled = 1 if k_tiled else 0
        self.n_plans += 1
        return self.n_plans - 1

    def set_layer(self, int i, *, attn_norm, float attn_eps, attn_post, float attn_post_eps, ffn_norm, float ffn_eps,
                  ffn_post, float ffn_post_eps, list qkv, qkv_bias, list wo, wo_bias, list gate_up, list down,
                  int act, int H, int KVH, int D, int Dv, int n_rot, bint neox, int rope_id, int plan_id,
                  q_norm, k_norm, float qk_eps, float scale, float softcap, sinks):
        """Layer i's weights and attention parameters (see the module docstring)."""
        if not 0 <= i < self.n_layers:
            raise IndexError(i)
        cdef layer_t *L = &self.layers[i]
        cdef int d = self.n_embd
        L.attn_norm = self._f32(attn_norm, d)
        L.attn_eps = attn_eps
        L.has_attn_post = attn_post is not None
        L.attn_post = self._f32(attn_post, d)
        L.attn_post_eps = attn_post_eps
        L.ffn_norm = self._f32(ffn_norm, d)
        L.ffn_eps = ffn_eps
        L.has_ffn_post = ffn_post is not None
        L.ffn_post = self._f32(ffn_post, d)
        L.ffn_post_eps = ffn_post_eps
        self._linear(&L.qkv, qkv, qkv_bias, d)
        if L.qkv.out_features != H * D + KVH * D + KVH * Dv:
            raise ValueError("Program: the q/k/v projection's size does not match the heads")
        self._linear(&L.wo, wo, wo_bias, H * Dv)
        if L.wo.out_features != d:
            raise ValueError("Program: the output projection's size is not n_embd")
        self._linear(&L.gate_up, gate_up, None, d)
        L.n_ff = L.gate_up.out_features // 2
        self._linear(&L.down, down, None, L.n_ff)
        if L.down.out_features != d or L.gate_up.out_features != 2 * L.n_ff:
            raise ValueError("Program: the feed-forward's sizes do not match")
        L.act = act
        L.wo_ok = L.wo.n_parts == 1 and L.wo.part[0].kind == W_LQ
        if not (0 <= plan_id < self.n_plans and 0 <= rope_id < self.n_ropes):
            raise ValueError("Program: unknown plan or rope id")
        g = self.plans[plan_id]
        if (g.H, g.KVH, g.D, g.Dv) != (H, KVH, D, Dv) or KVH <= 0 or H % KVH:
            raise ValueError("Program: the layer's heads do not match its attention plan")
        if n_rot != self.ropes[rope_id].n_rot or n_rot > D or n_rot % 2:
            raise ValueError("Program: bad rope dimensions")
        L.H, L.KVH, L.D, L.Dv = H, KVH, D, Dv
        L.n_rot, L.neox, L.rope_id, L.plan_id = n_rot, neox, rope_id, plan_id
        L.q_norm = self._f32(q_norm, D)
        L.k_norm = self._f32(k_norm, D)
        L.qk_eps = qk_eps
        L.scale = scale
        L.softcap = softcap
        L.sinks = self._f32(sinks, H)
        L.k_pool = NULL
        L.v_pool = NULL
        self.max_k = max(self.max_k, 2 * L.n_ff, H * D)
        if i == self.n_layers - 1:
            self.ready = 1

    def run(self, const float[:, ::1] x, const int32_t[::1] positions, const int32_t[::1] seg_start, list tables,
            const int64_t[::1] logit_rows, float[:, ::1] logits, const uint8_t[::1] decode_seqs,
            int n_threads, double[::1] prof=None, work=None, int64_t[::1] argmax=None):
        """One step: logits of the rows ``logit_rows`` of the step's tokens.

        x : float32 (n, n_embd), the tokens' embeddings (n <= TOKENS_MAX)
        positions : int32 (n,); seg_start : int32 (S + 1,) from 0 to n
        tables : per attention plan, int32 (S, max_blocks) block tables (-1: freed)
        logit_rows : int64 (m,) rows of x whose logits are wanted
        logits : float32 (m, n_vocab), written
        decode_seqs : uint8 (S,) or None, as attention.attention's
        prof : float64 (len(PHASES),) or None: nanoseconds thread 0 spent in each phase are
            added to it (benchmarks)
        work : a uint8 array the step may use for its buffers (workspace_bytes(n)), or None
        argmax : int64 (m,) or None: each logits row's argmax (np.argmax's first maximum),
            found as the head writes the rows; -1 for a row holding a NaN or only -inf
            (np.argmax's answer is then for the caller to find)
        Raises ValueError (nothing written to the caches) when a position maps to no block.
        """
        if not self.ready:
            raise RuntimeError("Program: not every layer is set")
        cdef int n = x.shape[0], d = self.n_embd, S = seg_start.shape[0] - 1, m = logit_rows.shape[0]
        cdef int i, j, p, l, nb_seq, nt = n_threads if n_threads > 0 else 1
        cdef step_t st
        cdef layer_t *L
        cdef plan_geom_t *g
        cdef const int32_t[:, ::1] tab
        cdef int64_t nblk, f_bytes, a_bytes, p_bytes
        cdef size_t base
        if n < 1 or n > MAX_TOKENS or x.shape[1] != d:
            raise ValueError(f"Program.run: x must be (1..{MAX_TOKENS}, {d})")
        if positions.shape[0] != n or S < 1 or seg_start[0] != 0 or seg_start[S] != n:
            raise ValueError("Program.run: positions / seg_start do not match x")
        if len(tables) != self.n_plans:
            raise ValueError("Program.run: one block table per plan")
        if not self.pools_set:
            raise RuntimeError("Program.run: set_pools first")
        if logits.shape[0] != m or logits.shape[1] != self.n_vocab or m < 1:
            raise ValueError("Program.run: logits must be (len(logit_rows), n_vocab)")
        for i in range(m):
            if not 0 <= logit_rows[i] < n or (i > 0 and logit_rows[i] <= logit_rows[i - 1]):
                raise ValueError("Program.run: logit rows must be increasing rows of x")
        if argmax is not None and argmax.shape[0] != m:
            raise ValueError("Program.run: argmax must have one entry per logits row")
        if decode_seqs is not None and decode_seqs.shape[0] != S:
            raise ValueError("Program.run: decode_seqs must have one entry per sequence")
        for i in range(S):
            if seg_start[i + 1] < seg_start[i]:
                raise ValueError("Program.run: seg_start must be non-decreasing")
        memset_step(&st)
        st.n = n
        st.d = d
        st.S = S
        st.n_layers = self.n_layers
        st.pos = &positions[0]
        st.seg_start = &seg_start[0]
        st.logit_rows = &logit_rows[0]
        st.n_logits = m
        st.logits = &logits[0, 0]
        st.n_vocab = self.n_vocab
        st.x_in = &x[0, 0]
        if prof is not None and prof.shape[0] < N_PHASES:
            raise ValueError("Program.run: prof needs one entry per phase")
        st.prof = &prof[0] if prof is not None else NULL
        st.amax = NULL
        keep = []
        try:
            # the step's buffers: activations, quantized inputs, phase counters (zeroed), in
            # the caller's workspace when it is large enough (no fresh pages every step)
            f_bytes = ((6 * n * self.max_k + 4 * n * self.max_out) * 4 + 63) // 64 * 64
            a_bytes = 3 * self.max_parts_bytes
            p_bytes = (3 + 12 * self.n_layers) * sizeof(team_phase_t)
            if work is None or work.nbytes < f_bytes + a_bytes + p_bytes + 64:
                work = np.empty(f_bytes + a_bytes + p_bytes + 64, dtype=np.uint8)
            keep.append(work)
            base = ((<size_t>work.ctypes.data) + 63) & ~(<size_t>63)
            _shared_layout(&st, <float *>base, n, self.max_k, self.max_out)
            memcpy(st.x, &x[0, 0], n * d * sizeof(float))
            for p in range(3):
                st.acts[p].qa = <int8_t *>(base + f_bytes + p * self.max_parts_bytes)
            st.ph = <team_phase_t *>(base + f_bytes + a_bytes)
            memset(st.ph, 0, p_bytes)
            # attention plans and block ids; rope tables
            for p in range(self.n_plans):
                g = &self.plans[p]
                tab = tables[p]
                nb_seq = tab.shape[1]
                nblk = self.plan_blocks[p]
                if tab.shape[0] != S:
                    raise ValueError("Program.run: a block table per sequence")
                st.blk[p] = <int32_t *>malloc(n * sizeof(int32_t))
                if st.blk[p] == NULL:
                    raise MemoryError()
                for j in range(S):
                    for i in range(seg_start[j], seg_start[j + 1]):
                        st.blk[p][i] = tab[j, positions[i] // g.bs] if 0 <= positions[i] < nb_seq * g.bs else -1
                        if st.blk[p][i] < 0 or st.blk[p][i] >= nblk:
                            raise ValueError(f"kv_store: position {positions[i]} maps to no block")
                if attn_plan_build(&st.pl[p], n, g.H, g.KVH, g.Dv, g.bs, g.k_row, g.v_row, &tab[0, 0], S, nb_seq,
                                   &seg_start[0], &positions[0], g.window,
                                   &decode_seqs[0] if decode_seqs is not None else NULL) != 0:
                    raise MemoryError()
                _ctx_init(&st.ctx[p], g, &tab[0, 0], nb_seq, &positions[0])
                st.ctx[p].q = st.q
                st.ctx[p].out = st.o
                attn_plan_ctx(&st.pl[p], &st.ctx[p], n)
                st.attn_buf = max(st.attn_buf, attn_scratch_floats(g.D, g.Dv, g.bs))
            for p in range(self.n_ropes):
                st.n_rot[p] = self.ropes[p].n_rot
                st.rope[p] = <float *>malloc(max(1, n * self.ropes[p].n_rot) * sizeof(float))
                if st.rope[p] == NULL:
                    raise MemoryError()
                if self.ropes[p].n_rot > 0:
                    for i in range(n):
                        rope_cos_sin(<float>positions[i], self.ropes[p].n_rot,
                                     powf(self.ropes[p].base, -2.0 / self.ropes[p].n_rot), self.ropes[p].freq_scale,
                                     NULL, st.rope[p] + i * self.ropes[p].n_rot)
            st.attn_buf = max(st.attn_buf, self.max_k)
            if argmax is not None:
                st.amax = _amax_new(nt, m)
            team_init(&st.team, _spin_ns)
            with nogil, parallel(num_threads=nt):
                _thread_main(self.layers, &self.head, self.out_norm, self.out_eps, &st)
            if st.failed:
                raise MemoryError("Program.run: per-thread scratch")
            if argmax is not None:
                _amax_rows(st.amax, nt, m, &argmax[0])
        finally:
            free(st.amax)
            for p in range(self.n_plans):
                attn_plan_free(&st.pl[p])
                free(st.blk[p])
            for p in range(self.n_ropes):
                free(st.rope[p])


cdef void memset_step(step_t *st) noexcept nogil:
    cdef int p
    st.failed = 0
    st.attn_buf = 0
    for p in range(MAX_PLANS):
        st.blk[p] = NULL
        st.pl[p].items = NULL
        st.pl[p].toks = NULL
        st.pl[p].tinfo = NULL
        st.pl[p].partial = NULL
        st.pl[p].n_items = 0
    for p in range(MAX_ROPES):
        st.rope[p] = NULL


cdef void _ctx_init(attn_ctx *c, const plan_geom_t *g, const int32_t *tables, int max_blocks,
                    const int32_t *q_pos) noexcept nogil:
    c.k_row = g.k_row
    c.v_row = g.v_row
    c.kv_type = g.kv_type
    c.bs = g.bs
    c.KVH = g.KVH
    c.H = g.H
    c.G = g.H // g.KVH
    c.D = g.D
    c.Dv = g.Dv
    c.tables = tables
    c.max_blocks = max_blocks
    c.q_pos = q_pos
    c.window = g.window
    c.k_tiled = g.k_tiled


cdef void _shared_layout(step_t *st, float *base, int64_t n, int64_t max_k, int64_t max_out) noexcept nogil:
    cdef float *p = <float *>((((<size_t>base) + 63) & ~(<size_t>63)))
    st.x = p
    p += n * max_k
    st.h = p
    p += n * max_k
    st.t = p
    p += n * max_k
    st.act = p
    p += n * max_k
    st.y_qkv = p
    p += n * max_out
    st.y_wo = p
    p += n * max_out
    st.y_gu = p
    p += n * max_out
    st.y_down = p
    p += n * max_out
    st.q = p
    p += n * max_k
    st.o = p
