# cython: language_level=3
"""Kernels for float (F32, F16, BF16) and legacy quant (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) weights.

Implements the weight-format kernel interface of llmcore.quant (kquants.pyx implements the
same one): SUPPORTED, SIMD_LEVEL, Packed, pack, matmul, matmul_grouped, dequantize and
get_rows. Beyond the interface: matmul_portable (the C kernel on the same packed layout, for
tests), AMX (whether 16-token tiles run on AMX int8 tiles: builds for a CPU that has them,
when Linux grants the tile state and LLMCORE_NO_AMX is not 1; same output bits as the VNNI
kernel) and _set_prefetch(bytes) (benchmarks: how far ahead the weight kernels prefetch).
The kernels are in simd_quants.h (AMX, AVX-512 VNNI, AVX2, portable C); the work items
(16-row groups, token tiles) are shared out here with prange.
"""
import os

import numpy as np

from cython.parallel cimport parallel, prange, threadid
from libc.stdint cimport int8_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport free, malloc
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from weight_rows cimport dequantize_blocks, rows_of_blocks
from amx_bf16 cimport ab_act_buffer, ab_act_bytes, ab_env_on, ab_init, ab_pack_act_tile, ab_set_min_tokens, ab_steps

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
    int LQ_G
    int LQ_TT
    int lq_simd_level()
    int lq_amx_init(int enable)
    int lq_fmt_for_type(int type)
    int lq_block_bytes(int type)
    int64_t lq_init_packed(lq_packed *p, int type, int64_t rows, int64_t cols, const uint8_t *data)
    void lq_pack(const uint8_t *raw, int64_t bpr, int type, int64_t rows, int64_t cols,
                 int64_t g0, int64_t g1, uint8_t *out)
    void lq_dequant_row(const uint8_t *row, int type, int64_t cols, float *out)
    void lq_quant_row_q8(const float *x, int64_t K, int8_t *q, float *d, float *s, float moff)
    void lq_float_rows(const lq_packed *P, int64_t r0, int64_t r1, const float *x, float *y, int64_t n)
    int lq_act_buffers(int64_t n, int64_t K, int8_t **qa, float **da, float **sa)
    int64_t lq_tile_tokens(const lq_packed *P, int portable)
    void lq_u_set_min_tokens(int n)
    void lq_group_rows(const lq_packed *P, int64_t g, const int8_t *qa, const float *da, const float *sa,
                       int64_t n, int64_t tt, float *y, int portable)
    int64_t lq_tile_bytes(int64_t nb)
    void *lq_get_scratch(size_t nbytes)
    int lq_tiles_ok(const lq_packed *P, int64_t n, int portable)
    int64_t lq_quant_tile_tmp(int64_t K)
    void lq_quant_tile(const float *x, int64_t K, int nt, float moff, void *tmp, uint8_t *rec)
    void lq_group_tiles(const lq_packed *P, int64_t g, const uint8_t *rec, int64_t n, float *y, int64_t R)
    ctypedef void (*lq_act_fn)(const float *g, const float *u, float *y, int n) noexcept nogil
    void lq_group_tiles_glu(const lq_packed *P, int64_t g, const uint8_t *rec, int64_t n, float *out, int64_t ldo,
                            int64_t F, lq_act_fn act)

    int lq_ab_ok(const lq_packed *P, int64_t n)
    int lq_ab_groups(const lq_packed *P, int64_t g0, int ng, const uint16_t *xb, int64_t n, float *y, int64_t R)
    int lq_ab_glu(const lq_packed *P, int64_t g, const uint16_t *xb, int64_t n, float *out, int64_t ldo, int64_t F,
                  lq_act_fn act)

cdef extern from "simd_activations.h" nogil:
    void act_silu_row(const float *g, const float *u, float *y, int n)
    void act_gelu_row(const float *g, const float *u, float *y, int n)

SUPPORTED = frozenset({0, 1, 30, 2, 3, 6, 7, 8})  # F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
SIMD_LEVEL = ("c", "avx2", "avx512vnni")[lq_simd_level()]  # build-time choice
# The one-token kernels ask for their weights 4 KB ahead (simd.h's default is 2 KB), a part of
# each block with each chunk (lq_pf_mode): Xeon with AMX, one thread, one token from memory,
# 32768 x 640 weights, Q8_0 / Q4_0 / Q4_1 15.7 / 13.2 / 13.3 GB/s at 2 KB, 16.4 / 14.0 / 14.0
# at 4 KB, 16.8 / 14.2 / 14.2 at 8 KB (the fused step, pyx/step.pyx, measured the same choice)
simd_pf_dist = 4096
# AMX int8 tiles for 16-token tiles of the quant types: built for a CPU that has them, in use
# when the kernel grants the tile state and LLMCORE_NO_AMX is not 1 (outputs are the same
# bits either way; see simd_quants.h)
AMX = bool(lq_amx_init(os.environ.get("LLMCORE_NO_AMX") != "1"))
# AMX-BF16 tiles for matmuls of ab_min_tokens (128) tokens or more (prefill chunks): f32 sums
# of bf16 weights and activations, not the int8 kernels' bits (within the conformance
# tolerances; see simd_amx_bf16.h); off with LLMCORE_NO_AMX_BF16=1 or LLMCORE_NO_AMX=1
AMX_BF16 = bool(ab_init(ab_env_on()))


def _set_amx_bf16(int on, int min_tokens=0):
    """Tests and benchmarks: whether matmuls of many tokens run on AMX-BF16 tiles (on: where
    the CPU and the kernel allow it), from min_tokens tokens (0: the default, 128). Returns
    whether they now do."""
    ab_set_min_tokens(min_tokens)
    return bool(ab_init(on))


cdef int _ab_matmul(const lq_packed *P, const float *xp, int64_t n, float *yp, int64_t R, int nt,
                    int64_t F, lq_act_fn act) except -1 nogil:
    """The AMX-BF16 path of matmul (F == 0) and matmul_glu (F > 0: gate/up groups, out row
    stride F): activations to bf16 tiles, then work items of two row groups (one gate/up pair)."""
    cdef int64_t K = P.cols, ns = ab_steps(K), ntt = (n + 15) // 16, i, it, nitems
    cdef int failed = 0
    cdef int *failp = &failed  # written through a pointer: an assignment in prange is lastprivate
    cdef uint16_t *xb = ab_act_buffer(ab_act_bytes(n, K))
    if xb == NULL:
        with gil:
            raise MemoryError("matmul: scratch allocation failed")
    nitems = F // LQ_G if F > 0 else (P.ngroups + 1) // 2
    with parallel(num_threads=nt):  # one region: activations to bf16, barrier, row groups
        for i in prange(ntt, schedule='static'):
            ab_pack_act_tile(xp + i * 16 * K, K, <int>min(<int64_t>16, n - i * 16), xb + i * ns * 512)
        for it in prange(nitems, schedule='static'):
            if F > 0:
                if not lq_ab_glu(P, it, xb, n, yp, F, F, act):
                    failp[0] = 1
            elif not lq_ab_groups(P, 2 * it, <int>min(<int64_t>2, P.ngroups - 2 * it), xb, n, yp, R):
                failp[0] = 1
    if failed:
        with gil:
            raise MemoryError("matmul: scratch allocation failed")
    return 0


def _set_amx(int on):
    """Benchmarks: whether this module's matmuls run whole 16-token tiles on AMX (on: where the
    CPU and the kernel allow it). Returns whether they now do."""
    return bool(lq_amx_init(on))


cdef enum:
    FLOAT_CHUNK = 16           # output rows per work item of the float kernels


cdef int64_t _cols(int ggml_type, int64_t bpr) except -1:
    cdef int fmt = lq_fmt_for_type(ggml_type)
    if fmt == LQ_FMT_NONE:
        raise ValueError(f"quants: unsupported ggml type {ggml_type}")
    if ggml_type == 0:
        return bpr // 4
    if ggml_type == 1 or ggml_type == 30:
        return bpr // 2
    return bpr // lq_block_bytes(ggml_type) * 32


cdef class Packed:
    """A weight (rows, cols) prepared for matmul.

    layout : "raw" (float types: the GGUF bytes used in place) or "repacked16" (quant types:
        16-row groups interleaved, see simd_quants.h)
    nbytes : bytes one matmul reads
    """
    cdef lq_packed p
    cdef readonly object buf
    cdef readonly int64_t rows, cols, nbytes
    cdef readonly int ggml_type
    cdef readonly str layout

    def __reduce__(self):
        raise TypeError("Packed weights are not picklable")

    def __repr__(self):
        return f"quants.Packed(type={self.ggml_type}, rows={self.rows}, cols={self.cols}, layout={self.layout})"


def aligned_buffer(int64_t size, alloc):
    """A writable uint8 (size,) array starting on a 64-byte boundary, from alloc(size) or
    a fresh allocation (every weight kernel's pack uses it)."""
    if alloc is not None:
        arr = alloc(size)
        if arr.dtype != np.uint8 or arr.shape != (size,) or arr.ctypes.data % 64:
            raise ValueError("pack: alloc must return a 64-byte aligned uint8 array of the asked size")
        return arr
    arr = np.empty(size + 64, dtype=np.uint8)
    off = (-arr.ctypes.data) % 64
    return arr[off:off + size]


def pack(const uint8_t[:, ::1] raw, int ggml_type, repack=None, alloc=None):
    """Prepare raw GGUF rows for matmul.

    raw : uint8 (rows, bytes_per_row), C-contiguous; float weights keep a view of it
    repack : None or True: the layout above; False: the GGUF layout, which only the float
        types have a kernel for (ValueError for the quant types)
    alloc : None, or alloc(nbytes) -> writable 64-byte aligned uint8 (nbytes,): where the
        repacked bytes go (llmcore.quant puts a model's weights in one huge-page arena)
    Single-threaded: repacking is ~1 GB/s per core and a parallel region per tensor costs more
    than it saves when the cores are shared.
    """
    cdef int64_t rows = raw.shape[0], bpr = raw.shape[1]
    cdef int64_t cols = _cols(ggml_type, bpr)
    cdef Packed pk = Packed.__new__(Packed)
    cdef int64_t size = lq_init_packed(&pk.p, ggml_type, rows, cols, NULL)
    cdef uint8_t[::1] out
    pk.rows, pk.cols, pk.ggml_type = rows, cols, ggml_type
    if pk.p.fmt <= LQ_FMT_BF16:
        # float weights are used in place (zero-copy view of the mapping)
        pk.layout = "raw"
        pk.buf = np.asarray(raw)
        pk.p.data = &raw[0, 0] if rows > 0 and bpr > 0 else NULL
        pk.nbytes = rows * bpr
        return pk
    if repack is False:
        raise ValueError(f"quants: no kernel reads ggml type {ggml_type} in the GGUF layout")
    arr = aligned_buffer(size, alloc)
    out = arr
    if size > 0:
        with nogil:
            lq_pack(&raw[0, 0], bpr, ggml_type, rows, cols, 0, pk.p.ngroups, &out[0])
        pk.p.data = &out[0]
    pk.layout = "repacked16"
    pk.buf = arr
    pk.nbytes = size
    return pk


cdef uint8_t *_tile_tmp(int64_t K, int nt) except NULL:
    """Per-thread scratch of lq_quant_tile for nt threads (free() it)."""
    cdef uint8_t *tmp = <uint8_t *>malloc(nt * lq_quant_tile_tmp(K))
    if tmp == NULL:
        raise MemoryError("matmul: scratch allocation failed")
    return tmp

cdef int _matmul(Packed pk, const float[:, ::1] x, float[:, ::1] y, int n_threads, bint portable) except -1:
    cdef int64_t n = x.shape[0], R = pk.rows, K = pk.cols, ng = pk.p.ngroups, i, g, c, nch, tt
    cdef const lq_packed *P = &pk.p
    cdef int8_t *qa
    cdef float *da
    cdef float *sa
    cdef int nt = n_threads if n_threads > 0 else 1
    if x.shape[1] != K or y.shape[0] != n or y.shape[1] != R:
        raise ValueError(f"matmul: x {tuple(x.shape)[:2]}, y {tuple(y.shape)[:2]} for weights {(R, K)}")
    if n == 0 or R == 0:
        return 0
    if K == 0:
        np.asarray(y)[...] = 0
        return 0
    cdef const float *xp = &x[0, 0]
    cdef float *yp = &y[0, 0]
    if P.fmt <= LQ_FMT_BF16:
        nch = (R + FLOAT_CHUNK - 1) // FLOAT_CHUNK
        if nt > nch:
            nt = <int>nch
        with nogil, parallel(num_threads=nt):
            for c in prange(nch, schedule='static'):
                lq_float_rows(P, c * FLOAT_CHUNK, min((c + 1) * FLOAT_CHUNK, R), xp, yp, n)
        return 0
    cdef int64_t ntl, nb = P.nb, tsz
    cdef uint8_t *rec
    cdef uint8_t *tmp
    if not portable and lq_ab_ok(P, n):
        with nogil:
            _ab_matmul(P, xp, n, yp, R, nt, 0, NULL)
        return 0
    if lq_tiles_ok(P, n, portable):
        # prefill: activations as token-tile records (simd_quants.h), quantized in parallel
        ntl = (n + LQ_TT - 1) // LQ_TT
        rec = <uint8_t *>lq_get_scratch(ntl * lq_tile_bytes(nb))
        if rec == NULL:
            raise MemoryError("matmul: scratch allocation failed")
        tmp = _tile_tmp(K, nt)
        tsz = lq_quant_tile_tmp(K)
        with nogil, parallel(num_threads=nt):  # one region: quantize x, barrier, row groups
            for i in prange(ntl, schedule='static'):
                lq_quant_tile(xp + i * LQ_TT * K, K, <int>min(<int64_t>LQ_TT, n - i * LQ_TT), P.moff,
                              tmp + threadid() * tsz, rec + i * lq_tile_bytes(nb))
            for g in prange(ng, schedule='static'):
                lq_group_tiles(P, g, rec, n, yp, R)
        free(tmp)
        return 0
    if lq_act_buffers(n, K, &qa, &da, &sa) != 0:
        raise MemoryError("matmul: scratch allocation failed")
    if nt > ng and n == 1:
        nt = <int>ng
    tt = lq_tile_tokens(P, portable)
    with nogil, parallel(num_threads=nt):  # one region: quantize x, barrier, row groups
        for i in prange(n, schedule='static'):
            lq_quant_row_q8(xp + i * K, K, qa + i * K, da + i * P.nb, sa + i * P.nb, P.moff)
        for g in prange(ng, schedule='static'):
            lq_group_rows(P, g, qa, da, sa, n, tt, yp, portable)
    return 0


def matmul(Packed packed, const float[:, ::1] x, float[:, ::1] y, int n_threads):
    """y = x @ W.T.

    x : float32 (n, cols); y : float32 (n, rows), overwritten
    n_threads : OpenMP threads (one parallel region); results do not depend on it
    """
    _matmul(packed, x, y, n_threads, False)


def matmul_glu(Packed packed, const float[:, ::1] x, float[:, ::1] out, int act_kind, int n_threads):
    """out = act(x @ gate.T) * (x @ up.T) for a weight whose rows are [gate; up] (a gated
    FFN's fused gate/up projection): the bits of matmul followed by activations.act_rows.
    Prefill-sized inputs on AVX-512 VNNI builds compute each 16-column strip of gate and up
    tile by tile and write only the product (the (n, 2F) projection never goes to memory).

    x : float32 (n, cols); out : float32 (n, rows / 2), overwritten
    act_kind : 0 SiLU, 1 GELU (tanh approximation)
    n_threads : OpenMP threads (one parallel region); results do not depend on it
    """
    cdef int64_t n = x.shape[0], R = packed.rows, K = packed.cols, F = packed.rows // 2
    cdef const lq_packed *P = &packed.p
    cdef int nt = n_threads if n_threads > 0 else 1
    cdef int64_t ntl, nb = P.nb, i, g, tsz
    cdef uint8_t *rec
    cdef uint8_t *tmp
    cdef lq_act_fn act = act_silu_row if act_kind == 0 else act_gelu_row
    if R % 2 or x.shape[1] != K or out.shape[0] != n or out.shape[1] != F:
        raise ValueError(f"matmul_glu: x {tuple(x.shape)[:2]}, out {tuple(out.shape)[:2]} for weights {(R, K)}")
    if act_kind not in (0, 1):
        raise ValueError("matmul_glu: act_kind must be 0 (SiLU) or 1 (GELU)")
    if n == 0 or F == 0:
        return
    cdef const float *xp = &x[0, 0]
    cdef float *op = &out[0, 0]
    cdef float[:, ::1] gu
    if K > 0 and F % LQ_G == 0 and lq_ab_ok(P, n):
        with nogil:
            _ab_matmul(P, xp, n, op, R, nt, F, act)
        return
    if not (K > 0 and F % LQ_G == 0 and lq_tiles_ok(P, n, 0)):
        gu = np.empty((n, R), dtype=np.float32)
        _matmul(packed, x, gu, n_threads, False)
        with nogil:
            for i in prange(n, num_threads=nt if n * F >= 65536 else 1, schedule='static'):
                act(&gu[i, 0], &gu[i, F], op + i * F, <int>F)
        return
    ntl = (n + LQ_TT - 1) // LQ_TT
    rec = <uint8_t *>lq_get_scratch(ntl * lq_tile_bytes(nb))
    if rec == NULL:
        raise MemoryError("matmul_glu: scratch allocation failed")
    tmp = _tile_tmp(K, nt)
    tsz = lq_quant_tile_tmp(K)
    with nogil, parallel(num_threads=nt):  # one region: quantize x, barrier, gate/up group pairs
        for i in prange(ntl, schedule='static'):
            lq_quant_tile(xp + i * LQ_TT * K, K, <int>min(<int64_t>LQ_TT, n - i * LQ_TT), P.moff,
                          tmp + threadid() * tsz, rec + i * lq_tile_bytes(nb))
        for g in prange(F // LQ_G, schedule='static'):
            lq_group_tiles_glu(P, g, rec, n, op, F, F, act)
    free(tmp)


def matmul_portable(Packed packed, const float[:, ::1] x, float[:, ::1] y, int n_threads):
    """matmul with the portable C kernel on the same packed layout (tests compare the SIMD
    kernels with it; equal up to float summation order)."""
    _matmul(packed, x, y, n_threads, True)


def matmul_grouped(list packs, const int64_t[::1] offsets, const float[:, ::1] x, float[:, ::1] y,
                   int n_threads):
    """MoE: rows offsets[i]:offsets[i+1] of y = those rows of x @ packs[i].T, one parallel
    region for all experts (activations quantized once, (expert, row group) work items).

    packs : Packed weights of one type and shape
    offsets : int64 (len(packs) + 1,), non-decreasing from 0 to n
    x : float32 (n, cols); y : float32 (n, rows), overwritten
    """
    cdef int64_t ne = len(packs), i, n = x.shape[0], w, e, c, g, r0, m, nch, nw
    cdef Packed pk
    cdef int nt = n_threads if n_threads > 0 else 1
    if offsets.shape[0] != ne + 1 or (ne and (offsets[0] != 0 or offsets[ne] != n)):
        raise ValueError("matmul_grouped: offsets must run from 0 to len(x), one per expert + 1")
    if ne == 0 or n == 0:
        return
    pk = packs[0]
    if x.shape[1] != pk.cols or y.shape[0] != n or y.shape[1] != pk.rows:
        raise ValueError(f"matmul_grouped: x {tuple(x.shape)[:2]}, y {tuple(y.shape)[:2]} for weights {(pk.rows, pk.cols)}")
    cdef int64_t K = pk.cols, R = pk.rows, nb = pk.p.nb, ng = pk.p.ngroups
    cdef const lq_packed *P0 = &pk.p
    cdef int8_t *qa
    cdef float *da
    cdef float *sa
    cdef const float *xp = &x[0, 0]
    cdef float *yp = &y[0, 0]
    cdef const lq_packed **ptrs = <const lq_packed **>PyMem_Malloc(ne * sizeof(lq_packed *))
    if ptrs == NULL:
        raise MemoryError()
    try:
        for i in range(ne):
            pk = packs[i]
            if pk.rows != R or pk.cols != K or pk.ggml_type != P0.type:
                raise ValueError("matmul_grouped: experts differ in type or shape")
            if offsets[i + 1] < offsets[i]:
                raise ValueError("matmul_grouped: offsets must not decrease")
            ptrs[i] = &pk.p
        if K == 0:
            np.asarray(y)[...] = 0
            return
        if R == 0:
            return
        if P0.fmt <= LQ_FMT_BF16:
            nch = (R + FLOAT_CHUNK - 1) // FLOAT_CHUNK
            nw = ne * nch
            if nt > nw:
                nt = <int>nw
            with nogil, parallel(num_threads=nt):
                for w in prange(nw, schedule='dynamic', chunksize=1):
                    e = w // nch
                    c = w % nch
                    r0 = offsets[e]
                    m = offsets[e + 1] - r0
                    if m > 0:
                        lq_float_rows(ptrs[e], c * FLOAT_CHUNK, min((c + 1) * FLOAT_CHUNK, R),
                                      xp + r0 * K, yp + r0 * R, m)
            return
        if lq_act_buffers(n, K, &qa, &da, &sa) != 0:
            raise MemoryError("matmul_grouped: scratch allocation failed")
        nw = ne * ng
        if nt > nw:
            nt = <int>nw
        with nogil, parallel(num_threads=nt):  # one region: quantize x, barrier, work items
            for i in prange(n, schedule='static'):
                lq_quant_row_q8(xp + i * K, K, qa + i * K, da + i * nb, sa + i * nb, P0.moff)
            for w in prange(nw, schedule='dynamic', chunksize=1):
                e = w // ng
                g = w % ng
                r0 = offsets[e]
                m = offsets[e + 1] - r0
                if m > 0:
                    lq_group_rows(ptrs[e], g, qa + r0 * K, da + r0 * nb, sa + r0 * nb, m, LQ_TT, yp + r0 * R, 0)
    finally:
        PyMem_Free(ptrs)


cdef inline int _block_values(int t) noexcept nogil:
    """Values a block of type t holds (a float type: one)."""
    return 1 if t == 0 or t == 1 or t == 30 else 32


cdef inline int _block_bytes(int t) noexcept nogil:
    return 4 if t == 0 else 2 if t == 1 or t == 30 else lq_block_bytes(t)


cdef void _dequant_blocks(int t, const uint8_t *src, int64_t nblocks, float *dst) noexcept nogil:
    """weight_rows' block function: a run of blocks is a row of their values."""
    lq_dequant_row(src, t, nblocks * _block_values(t), dst)


def dequantize(const uint8_t[:, ::1] raw, int ggml_type, float[:, ::1] out, int n_threads):
    """out = the dequantized rows, bit-exact with gguf.quants.dequantize.

    raw : uint8 (rows, bytes_per_row), C-contiguous
    out : float32 (rows, cols)
    n_threads : OpenMP threads over chunks of blocks (small tensors run on one)
    """
    cdef int64_t cols = _cols(ggml_type, raw.shape[1])
    dequantize_blocks("quants", _dequant_blocks, ggml_type, _block_values(ggml_type), _block_bytes(ggml_type), raw, cols, out, n_threads)


def get_rows(const uint8_t[:, ::1] raw, int ggml_type, const int64_t[::1] ids, float[:, ::1] out,
             int n_threads):
    """out[i] = dequantized row ids[i] of raw (embedding lookup).

    raw : uint8 (rows, bytes_per_row), C-contiguous
    ids : int64 (k,), each in [0, rows) (IndexError otherwise)
    out : float32 (k, cols)
    n_threads : OpenMP threads over the ids (a few ids run on one)
    """
    cdef int64_t cols = _cols(ggml_type, raw.shape[1])
    rows_of_blocks("quants", _dequant_blocks, ggml_type, _block_values(ggml_type), raw, cols, ids, out, n_threads)


def _set_unpacked_min_tokens(int n):
    """Tests and benchmarks: the fewest tokens of a work item (16-row group x token chunk)
    for which AVX2 builds unpack a 4-bit (Q4_0 / Q4_1) group once (fewer: the pair and one-token loops;
    the same bits either way); 0: never; -1: the built-in thresholds. Other builds: no-op."""
    lq_u_set_min_tokens(n)


def _set_lq_pf_mode(int mode):
    """(A/B) How the one- to few-token legacy-quant kernels ask for a block ahead: 1 a part with
    each chunk (default), 0 the whole block at its start. Returns the previous setting."""
    return lq_set_pf_mode(mode)


def _set_prefetch(int nbytes):
    """Benchmarks: bytes the streaming kernels prefetch ahead (0: off); returns the old value."""
    global simd_pf_dist
    cdef int old = simd_pf_dist
    simd_pf_dist = nbytes
    return old
