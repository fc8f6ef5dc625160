# cython: language_level=3
"""Kernels for K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and MXFP4 weights.

Implements the weight-format kernel interface of llmcore.quant (quants.pyx implements the
same one): SUPPORTED, SIMD_LEVEL, Packed, pack, matmul, matmul_grouped, dequantize and
get_rows. Q4_K, Q5_K, Q6_K and MXFP4 are repacked at load into 16-row interleaved tiles
("repacked16": AVX-512 VNNI builds all four, AVX2 builds the three K-quants; REPACK_TYPES
says which; ``LLMCORE_KQ_REPACK=0`` or repack=False keeps the zero-copy GGUF layout, "raw").
Activations are quantized like llama.cpp (q8_K for K-quants, q8_0 for MXFP4) and dots are
integer (VNNI / AVX2 / C), so repacked and raw layouts compute the same integers; their float
sums differ in order only. Results never depend on the thread count or the batch composition.
The kernels are in simd_kquants.h.

Beyond the interface (tests, benchmarks, references):

- ``block_info(ggml_type) -> (values per block, bytes per block)``
- ``matmul_raw(w, ggml_type, x, out=None, n_threads=1) -> float32 (n, rows)``: y = x @ W.T
  straight from the GGUF layout; ``w`` uint8 (rows, row_bytes) whose rows may be strided
  (one expert's slice of a 3-D tensor), ``x`` float32 (n, cols).
- ``quantize_q8_k(x, n_threads=1) -> (d float32 (n, nb), qs int8 (n, nb, 256), bsums int16
  (n, nb, 16))``: llama.cpp's q8_K activation quantization.
- ``_set_prefetch(bytes)``: benchmarks: how far ahead the repacked kernels prefetch.
"""
import os

import numpy as np

from llmcore._kernels.quants import aligned_buffer

from cython.parallel cimport parallel, prange
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from weight_rows cimport dequantize_blocks, rows_of_blocks
from amx_bf16 cimport ab_act_buffer, ab_act_bytes, ab_env_on, ab_init, ab_pack_act_tile, ab_set_min_tokens, ab_steps

cdef extern from "simd.h" nogil:
    int simd_pf_dist

cdef extern from "simd_kquants.h" nogil:
    int kq_set_pf_mode(int mode)
    ctypedef struct kq_q8k:
        float d
        int8_t qs[256]
        int16_t bsums[16]
    const char *kq_simd_name()
    int kq_type_size(int t)
    int kq_block_size(int t)
    void kq_dequant_blocks(int t, const uint8_t *src, int64_t nblocks, float *dst)
    void kq_quantize_q8k(const float *x, int64_t k, kq_q8k *y)
    void kq_quantize_q8_0(const float *x, int64_t k, int8_t *qs, float *d)
    void kq_matmul_rows(int t, const uint8_t *W, int64_t row_stride, int64_t r0, int64_t r1,
                        int64_t nb, const kq_q8k *A, int64_t n, float *Y, int64_t ldy)
    void kq_matmul_rows_mxfp4(const uint8_t *W, int64_t row_stride, int64_t r0, int64_t r1,
                              int64_t k, const int8_t *A, const float *DA, int64_t n,
                              float *Y, int64_t ldy, uint8_t *qbuf, float *dwbuf)
    ctypedef struct kq_act:
        const kq_q8k *q8k
        const int8_t *aq
        const float *ad
        const int32_t *as_ "as"
        int no_amx
    int KQ_RP
    int KQ_AMX_PAD
    int kq_amx_init(int enable)
    void kq_amx_set_min_tokens(int tile, int call)
    void kq_u_set_min_tokens(int n)
    int kq_u_min_tokens_for(int t)
    int kq_rp_supported(int t)
    int64_t kq_rp_group_bytes(int t, int64_t k)
    void kq_rp_pack(int t, const uint8_t *W, int64_t row_stride, int64_t rows, int64_t k,
                    int64_t g0, int64_t g1, uint8_t *out)
    void kq_rp_group(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g,
                     const kq_act *act, int64_t tok0, int64_t n, float *Y, int64_t ldy)
    void kq_rp_groups(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g0, int ngr,
                      const kq_act *act, int64_t tok0, int64_t n, float *Y, int64_t ldy)
    void kq_quantize_q8_0_sums(const float *x, int64_t k, int8_t *qs, float *d, int32_t *s)
    int kq_ab_ok(int t, int64_t k, int64_t n)
    int kq_ab_groups(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g0, int ng, const uint16_t *xb,
                     int64_t n, float *Y, int64_t ldy)

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4 = 10, 11, 12, 13, 14, 39
# AMX int8 tiles for token tiles of Q4_K / Q5_K / Q6_K: built for a CPU that has them, in use
# when the kernel grants the tile state and LLMCORE_NO_AMX is not 1 (outputs are the same
# bits as the VNNI kernel's)
AMX = bool(kq_amx_init(os.environ.get("LLMCORE_NO_AMX") != "1"))
# AMX-BF16 tiles for Q4_K / Q5_K / Q6_K matmuls of 128 tokens or more (prefill chunks): f32
# sums of bf16 weights and activations, not the int8 kernels' bits (within the conformance
# tolerances; see simd_amx_bf16.h); off with LLMCORE_NO_AMX_BF16=1 or LLMCORE_NO_AMX=1
AMX_BF16 = bool(ab_init(ab_env_on()))


def _set_amx_bf16(int on, int min_tokens=0):
    """Tests and benchmarks: whether matmuls of many tokens run on AMX-BF16 tiles (on: where
    the CPU and the kernel allow it), from min_tokens tokens (0: the default, 128). Returns
    whether they now do."""
    ab_set_min_tokens(min_tokens)
    return bool(ab_init(on))


cdef int _ab_matmul(int t, const uint8_t *pp, const float *xp, int64_t n, int64_t k, int64_t rows,
                    int64_t ngroups, float *yp, int nt) except -1 nogil:
    """The AMX-BF16 path of matmul: activations to bf16 tiles, then work items of two row groups."""
    cdef int64_t ns = ab_steps(k), ntt = (n + 15) // 16, i, it, nitems = (ngroups + 1) // 2
    cdef int failed = 0
    cdef int *failp = &failed  # written through a pointer: an assignment in prange is lastprivate
    cdef uint16_t *xb = ab_act_buffer(ab_act_bytes(n, k))
    if xb == NULL:
        with gil:
            raise MemoryError("kquants.matmul: scratch allocation failed")
    with parallel(num_threads=nt):  # one region: activations to bf16, barrier, row groups
        for i in prange(ntt, schedule="static"):
            ab_pack_act_tile(xp + i * 16 * k, k, <int>min(<int64_t>16, n - i * 16), xb + i * ns * 512)
        for it in prange(nitems, schedule="static"):
            if not kq_ab_groups(t, pp, k, rows, 2 * it, <int>min(<int64_t>2, ngroups - 2 * it), xb, n, yp, rows):
                failp[0] = 1
    if failed:
        with gil:
            raise MemoryError("kquants.matmul: scratch allocation failed")
    return 0
SUPPORTED = frozenset({Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4})
SIMD_LEVEL = kq_simd_name().decode()  # build-time choice: "avx512vnni", "avx2" or "c"
# the ggml types this build repacks into 16-row tiles (VNNI: Q4_K, Q5_K, Q6_K, MXFP4; AVX2:
# the K-quants; portable C: none)
REPACK_TYPES = frozenset(t for t in (10, 11, 12, 13, 14, 39) if kq_rp_supported(t))
# The streaming K-quant kernels prefetch 8 KB ahead (simd.h's default is 2 KB). Zen 5, 1
# thread, CPU ms with the weights cold (min of 25): Q6_K 32768 x 2048 at 1 / 4 / 8 tokens
# 1.66 / 1.76 / 3.33 at 2 KB, 1.51 / 1.64 / 2.76 at 8 KB; Q5_K 16384 x 2048 at 1 / 4 tokens
# 0.81 / 1.02 -> 0.73 / 0.86. (A Xeon measured 2 to 8 KB the same for quants.pyx's kernels.)
simd_pf_dist = 8192
Q8K_DTYPE = np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))])
assert Q8K_DTYPE.itemsize == sizeof(kq_q8k)

cdef enum:
    ROW_TILE = 8      # rows per work item of the GGUF-layout kernels
    TOK_CHUNK = 64    # tokens per work item of the repacked kernels
    AMX_TOK_CHUNK = 256  # the same where the AMX kernel takes them
    MIN_WORK = 98304  # bytes of weight x 4-token tiles per thread: smaller calls use fewer threads
    T_MXFP4 = 39
    Q4_K_T = 12
    Q5_K_T = 13
    Q6_K_T = 14


def block_info(int ggml_type):
    """(values per block, bytes per block)."""
    if ggml_type not in SUPPORTED:
        raise ValueError(f"kquants: unsupported ggml type {ggml_type}")
    return kq_block_size(ggml_type), kq_type_size(ggml_type)


cdef int64_t _cols(int ggml_type, int64_t row_bytes) except -1:
    bs, ts = block_info(ggml_type)
    if row_bytes % ts:
        raise ValueError(f"kquants: rows of {row_bytes} bytes are not whole {ts}-byte blocks")
    return row_bytes // ts * bs


def dequantize(const uint8_t[:, ::1] raw, int ggml_type, float[:, ::1] out, int n_threads):
    """out = the dequantized rows, bit-exact with gguf.quants.dequantize.

    raw : uint8 (rows, bytes_per_row), C-contiguous
    out : float32 (rows, cols)
    n_threads : OpenMP threads over chunks of blocks (small tensors run on one)
    """
    cdef int64_t cols = _cols(ggml_type, raw.shape[1])
    dequantize_blocks("kquants", kq_dequant_blocks, ggml_type, kq_block_size(ggml_type), kq_type_size(ggml_type), raw, cols, out, n_threads)


def get_rows(const uint8_t[:, ::1] raw, int ggml_type, const int64_t[::1] ids, float[:, ::1] out,
             int n_threads):
    """out[i] = dequantized row ids[i] of raw (embedding lookup).

    raw : uint8 (rows, bytes_per_row), C-contiguous
    ids : int64 (k,), each in [0, rows) (IndexError otherwise)
    out : float32 (k, cols)
    n_threads : OpenMP threads over the ids (a few ids run on one)
    """
    cdef int64_t cols = _cols(ggml_type, raw.shape[1])
    rows_of_blocks("kquants", kq_dequant_blocks, ggml_type, kq_block_size(ggml_type), raw, cols, ids, out, n_threads)


cdef class Packed:
    """A K-quant / MXFP4 weight (rows, cols) prepared for matmul.

    layout : "repacked16" (rows interleaved 16 at a time, see simd_kquants.h; Q4_K, Q5_K,
        Q6_K, MXFP4 on AVX-512 VNNI builds) or "raw" (the GGUF block layout used in place)
    nbytes : bytes one matmul reads
    """
    cdef readonly int ggml_type
    cdef readonly int64_t rows, cols, nbytes, ngroups
    cdef readonly object raw
    cdef readonly object buf
    cdef readonly str layout

    def __reduce__(self):
        raise TypeError("Packed weights are not picklable")

    def __repr__(self):
        return f"kquants.Packed(type={self.ggml_type}, rows={self.rows}, cols={self.cols}, layout={self.layout})"


def pack(const uint8_t[:, ::1] raw, int ggml_type, repack=None, alloc=None):
    """Prepare raw GGUF rows for matmul.

    raw : uint8 (rows, bytes_per_row), C-contiguous; the raw layout keeps a view of it
    repack : None: repacked where this build has the layout, unless LLMCORE_KQ_REPACK=0;
        True: repacked where this build has the layout; False: the GGUF layout
    alloc : None, or alloc(nbytes) -> writable 64-byte aligned uint8 (nbytes,) for the
        repacked bytes (as quants.pack)
    Single-threaded, like quants.pack.
    """
    cdef Packed pk = Packed.__new__(Packed)
    pk.ggml_type = ggml_type
    pk.rows = raw.shape[0]
    pk.cols = _cols(ggml_type, raw.shape[1])
    if repack is None:
        repack = os.environ.get("LLMCORE_KQ_REPACK", "1") != "0"
    pk.ngroups = (pk.rows + KQ_RP - 1) // KQ_RP
    if repack and kq_rp_supported(ggml_type) and pk.rows > 0 and pk.cols > 0:
        pk.layout = "repacked16"
        pk.raw = None
        pk.buf = _repack(raw, ggml_type, pk.cols, pk.ngroups, alloc)
        pk.nbytes = pk.buf.shape[0]
    else:
        pk.layout = "raw"
        pk.raw = np.asarray(raw)
        pk.buf = None
        pk.nbytes = raw.shape[0] * raw.shape[1]
    return pk


cdef object _repack(const uint8_t[:, ::1] rv, int t, int64_t k, int64_t ngroups, alloc):
    cdef int64_t gb = kq_rp_group_bytes(t, k), size = gb * ngroups
    arr = aligned_buffer(size, alloc)
    cdef uint8_t[::1] ov = arr
    cdef int64_t stride = rv.strides[0], rows = rv.shape[0]
    with nogil:
        kq_rp_pack(t, &rv[0, 0], stride, rows, k, 0, ngroups, &ov[0])
    return arr


cdef bint _VNNI = SIMD_LEVEL == "avx512vnni"


cdef inline bint _pairs(int t, int64_t n) noexcept:
    """Whether work items of n tokens of type t take two 16-row groups (the VNNI kernel on
    unpacked super-blocks; not where AMX takes the tiles; AVX2 unpacks one group at a time)."""
    cdef int m = kq_u_min_tokens_for(t)
    return _VNNI and m > 0 and n >= m and not (AMX and ptype_amx(t))


cdef inline bint ptype_amx(int t) noexcept nogil:
    return t == Q4_K_T or t == Q5_K_T or t == Q6_K_T


cdef inline int _cap_threads(int nt, int64_t weight_bytes, int64_t n) noexcept nogil:
    """A parallel region costs microseconds (much more when the cores are shared): give
    each thread at least MIN_WORK. Results do not depend on the thread count."""
    cdef int64_t w = weight_bytes * ((n + 3) // 4) // MIN_WORK
    if w < 1:
        w = 1
    return <int>w if w < nt else nt


cdef object _alloc_acts(int t, int64_t n, int64_t k, kq_act *act):
    """Buffers for x quantized once for the repacked kernels; returns their owners."""
    cdef uint8_t[:, ::1] av
    cdef int8_t[:, ::1] aq
    cdef float[:, ::1] ad
    cdef int32_t[:, ::1] asv
    act.no_amx = 0
    if t != MXFP4:
        # KQ_AMX_PAD spare rows: the AMX kernel loads whole 16-token tiles
        a = np.empty((n + KQ_AMX_PAD, (k // 256) * sizeof(kq_q8k)), dtype=np.uint8)
        av = a
        act.q8k = <const kq_q8k *>&av[0, 0]
        return a
    q_arr = np.empty((n, k), dtype=np.int8)
    d_arr = np.empty((n, k // 32), dtype=np.float32)
    s_arr = np.empty((n, k // 32), dtype=np.int32)
    aq, ad, asv = q_arr, d_arr, s_arr
    act.aq = &aq[0, 0]
    act.ad = &ad[0, 0]
    act.as_ = &asv[0, 0]
    return (q_arr, d_arr, s_arr)


cdef inline void _quantize_row(int t, const float *x, int64_t k, int64_t i, const kq_act *act) noexcept nogil:
    if t != T_MXFP4:
        kq_quantize_q8k(x, k, <kq_q8k *>&act.q8k[i * (k // 256)])
    else:
        kq_quantize_q8_0_sums(x, k, <int8_t *>&act.aq[i * k], <float *>&act.ad[i * (k // 32)],
                              <int32_t *>&act.as_[i * (k // 32)])


def matmul(Packed packed, const float[:, ::1] x, float[:, ::1] y, int n_threads):
    """y = x @ W.T.

    x : float32 (n, cols); y : float32 (n, rows), overwritten
    n_threads : OpenMP threads (one parallel region; small calls use fewer); results do not
        depend on it
    """
    cdef int64_t n = x.shape[0], k = packed.cols, rows = packed.rows
    if x.shape[1] != k or y.shape[0] != n or y.shape[1] != rows:
        raise ValueError(f"kquants.matmul: x {tuple(x.shape)[:2]}, y {tuple(y.shape)[:2]} for weights {(rows, k)}")
    if n == 0 or rows == 0:
        return
    cdef int nt = n_threads if n_threads > 0 else 1
    if packed.layout == "raw":
        _matmul_gguf(packed.raw, packed.ggml_type, x, y, nt)
        return
    cdef kq_act act
    cdef const uint8_t[::1] pv = packed.buf
    if kq_ab_ok(packed.ggml_type, k, n):
        with nogil:
            _ab_matmul(packed.ggml_type, &pv[0], &x[0, 0], n, k, rows, packed.ngroups, &y[0, 0], nt)
        return
    keep = _alloc_acts(packed.ggml_type, n, k, &act)
    # AMX: longer token chunks, so that a group's unpacked weights serve more 16-token tiles
    # and the weights stream once per chunk (the activations of a chunk stay in L2)
    cdef int64_t chunk = AMX_TOK_CHUNK if AMX and ptype_amx(packed.ggml_type) else TOK_CHUNK
    cdef int64_t nchunks = (n + chunk - 1) // chunk
    # work items of two 16-row groups where the unpacked-tile kernel takes them
    cdef int gper = 2 if _pairs(packed.ggml_type, min(n, chunk)) else 1
    cdef int64_t ng = (packed.ngroups + gper - 1) // gper, ngt = packed.ngroups
    cdef int64_t nitems = ng * nchunks, it, g, c, t0, t1
    cdef int t = packed.ggml_type
    cdef const uint8_t *pp = &pv[0]
    cdef const float *xp = &x[0, 0]
    cdef float *yp = &y[0, 0]
    cdef int64_t i
    nt = _cap_threads(nt, packed.nbytes, n)
    with nogil, parallel(num_threads=min(nt, max(n, nitems))):  # one region: quantize, barrier, rows
        for i in prange(n, schedule="static"):
            _quantize_row(t, xp + i * k, k, i, &act)
        for it in prange(nitems, schedule="static"):
            c = it // ng
            g = it - c * ng
            t0 = c * chunk
            t1 = min(t0 + chunk, n)
            kq_rp_groups(t, pp, k, rows, g * gper, <int>min(gper, ngt - g * gper), &act, t0, t1 - t0,
                         yp + t0 * rows, rows)
    del keep


def matmul_grouped(list packs, const int64_t[::1] offsets, x, float[:, ::1] y, int n_threads):
    """MoE: rows offsets[i]:offsets[i+1] of y = those rows of x @ packs[i].T, one parallel
    region over (expert, token chunk, 16-row group) work items, activations quantized once.

    packs : Packed weights of one type, shape and layout
    offsets : int64 (len(packs) + 1,), non-decreasing from 0 to n
    x : float32 (n, cols); y : float32 (n, rows), overwritten
    """
    _grouped(packs, offsets, x, y, n_threads, None)


def matmul_grouped_rows(list packs, const int64_t[::1] offsets, x, rows, float[:, ::1] y, int n_threads):
    """matmul_grouped with a row map: row r of the problem is x[rows[r]].

    x : float32 (m, cols), each distinct row once (an MoE layer's tokens), quantized once
        and the quantized rows copied where the map sends them (not each float row gathered
        and quantized once per expert that chose it)
    rows : int64 (n,), each in [0, m); offsets, y as matmul_grouped's (n rows)
    """
    _grouped(packs, offsets, x, y, n_threads, rows)


cdef _grouped(list packs, const int64_t[::1] offsets, x_in, float[:, ::1] y, int n_threads, rows):
    cdef int64_t ne = len(packs), i, n
    cdef Packed pk
    cdef const float[:, ::1] x
    cdef const int64_t[::1] rmap
    cdef int64_t nsrc
    if rows is not None:
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        nsrc = np.shape(x_in)[0]
        if rows.ndim != 1 or (rows.shape[0] and (rows.min() < 0 or rows.max() >= nsrc)):
            raise ValueError("matmul_grouped: rows must be int64 (n,) indices of x's rows")
        pk = packs[0] if len(packs) else None
        if pk is None or pk.layout == "raw" or pk.ggml_type == MXFP4:  # gather the floats
            return _grouped(packs, offsets, np.ascontiguousarray(np.asarray(x_in, dtype=np.float32)[rows]), y,
                            n_threads, None)
        x = x_in
        rmap = rows
        n = rows.shape[0]
    else:
        x = x_in
        n = x.shape[0]
    if offsets.shape[0] != ne + 1:
        raise ValueError("matmul_grouped: offsets must have len(packs) + 1 entries")
    if ne == 0:
        return
    pk = packs[0]
    if offsets[0] != 0 or offsets[ne] != n:
        raise ValueError("matmul_grouped: offsets must run from 0 to len(x)")
    if x.shape[1] != pk.cols or y.shape[0] != n or y.shape[1] != pk.rows:
        raise ValueError(f"matmul_grouped: x {tuple(x.shape)[:2]}, y {tuple(y.shape)[:2]} for weights {(pk.rows, pk.cols)}")
    for i in range(ne):
        if (<Packed>packs[i]).rows != pk.rows or (<Packed>packs[i]).cols != pk.cols \
                or (<Packed>packs[i]).ggml_type != pk.ggml_type or (<Packed>packs[i]).layout != pk.layout:
            raise ValueError("matmul_grouped: experts differ in type, shape or layout")
        if offsets[i + 1] < offsets[i]:
            raise ValueError("matmul_grouped: offsets must not decrease")
    if n == 0 or pk.rows == 0:
        return
    cdef int nt = n_threads if n_threads > 0 else 1
    if pk.layout == "raw":
        for i in range(ne):
            if offsets[i + 1] > offsets[i]:
                _matmul_gguf((<Packed>packs[i]).raw, pk.ggml_type, x[offsets[i]:offsets[i + 1]],
                             y[offsets[i]:offsets[i + 1]], nt)
        return
    cdef kq_act act
    cdef int64_t ng = pk.ngroups, k = pk.cols, nrows = pk.rows, nitems = 0, c, nc, g, it, e, t0, t1, r, ntok
    keep = _alloc_acts(pk.ggml_type, n, k, &act)
    # with a row map: the distinct rows quantized once (src), then copied to the problem's rows
    cdef int64_t rb = (k // 256) * sizeof(kq_q8k), nq = n
    cdef kq_act sact
    cdef uint8_t *dst8 = <uint8_t *>act.q8k
    cdef const uint8_t *src8 = NULL
    cdef const int64_t *rm = NULL
    if rows is not None:
        nq = x.shape[0]
        skeep = _alloc_acts(pk.ggml_type, nq, k, &sact)
        src8 = <const uint8_t *>sact.q8k
        rm = &rmap[0] if n else NULL
    else:
        sact = act
    # an expert's items of the unpacked-tile kernel take two 16-row groups (_pairs)
    gper_arr = np.ones(ne, dtype=np.int32)
    cdef int[::1] gper = gper_arr
    for i in range(ne):
        ntok = offsets[i + 1] - offsets[i]
        if ntok > 0 and _pairs(pk.ggml_type, min(ntok, TOK_CHUNK)):
            gper[i] = 2
        nitems += (ntok + TOK_CHUNK - 1) // TOK_CHUNK * ((ng + gper[i] - 1) // gper[i])
    items = np.empty((nitems, 3), dtype=np.int64)   # expert, first group, first token
    cdef int64_t[:, ::1] iv = items
    ptrs = np.empty(ne, dtype=np.uintp)
    cdef size_t[::1] pv = ptrs
    cdef const uint8_t[::1] bv
    it = 0
    for i in range(ne):
        bv = (<Packed>packs[i]).buf
        pv[i] = <size_t>&bv[0]
        nc = (offsets[i + 1] - offsets[i] + TOK_CHUNK - 1) // TOK_CHUNK
        for c in range(nc):
            for g in range(0, ng, gper[i]):
                iv[it, 0] = i
                iv[it, 1] = g
                iv[it, 2] = offsets[i] + c * TOK_CHUNK
                it += 1
    cdef int t = pk.ggml_type
    cdef const float *xp = &x[0, 0]
    cdef float *yp = &y[0, 0]
    cdef int64_t work = 0
    for i in range(ne):
        work += pk.nbytes * ((offsets[i + 1] - offsets[i] + 3) // 4)
    nt = _cap_threads(nt, work, 4)
    with nogil, parallel(num_threads=min(nt, max(n, nitems))):  # one region: quantize, barrier, items
        for r in prange(nq, schedule="static"):
            _quantize_row(t, xp + r * k, k, r, &sact)
        if rm != NULL:
            for r in prange(n, schedule="static"):
                memcpy(dst8 + r * rb, src8 + rm[r] * rb, rb)
        for it in prange(nitems, schedule="static"):
            e = iv[it, 0]
            t0 = iv[it, 2]
            t1 = min(t0 + TOK_CHUNK, offsets[e + 1])
            g = iv[it, 1]
            kq_rp_groups(t, <const uint8_t *>pv[e], k, nrows, g, <int>min(gper[e], ng - g), &act, t0, t1 - t0,
                         yp + t0 * nrows, nrows)
    del keep


def quantize_q8_k(x, int n_threads=1):
    """llama.cpp q8_K quantization of float32 rows (n, k), k % 256 == 0."""
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, np.shape(x)[np.ndim(x) - 1])
    cdef int64_t n = xv.shape[0], k = xv.shape[1], i
    if k % 256:
        raise ValueError("quantize_q8_k: row length must be a multiple of 256")
    cdef int64_t nb = k // 256
    out = np.empty((n, nb), dtype=Q8K_DTYPE)
    cdef uint8_t[:, ::1] ov = out.view(np.uint8).reshape(n, nb * sizeof(kq_q8k))
    cdef int nt = n_threads if n_threads > 0 else 1
    if n:
        with nogil:
            for i in prange(n, num_threads=nt, schedule="static"):
                kq_quantize_q8k(&xv[i, 0], k, <kq_q8k *>&ov[i, 0])
    return out["d"], out["qs"], out["bsums"]


def matmul_raw(w, int ggml_type, x, out=None, int n_threads=1):
    """y = x @ W.T with W (rows, row_bytes) uint8 in the GGUF layout of `ggml_type`; rows may
    be strided (last axis contiguous). x float32 (n, cols) or (cols,); returns out (n, rows)."""
    bs, ts = block_info(ggml_type)
    w = np.asarray(w)
    if w.dtype != np.uint8 or w.ndim != 2:
        w = w.view(np.uint8).reshape(w.shape[0], -1)
    if w.strides[1] != 1 or w.strides[0] < w.shape[1]:
        w = np.ascontiguousarray(w)
    cdef int64_t rows = w.shape[0], k = _cols(ggml_type, w.shape[1])
    xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim == 1:
        xa = xa.reshape(1, -1)
    if xa.ndim != 2 or xa.shape[1] != k:
        raise ValueError(f"kquants.matmul: x has shape {np.shape(x)}, weight rows hold {k} values")
    cdef int64_t n = xa.shape[0]
    if out is None:
        out = np.empty((n, rows), dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != (n, rows) or not out.flags.c_contiguous:
        raise ValueError(f"kquants.matmul: out must be C-contiguous float32 {(n, rows)}")
    if n and rows:
        _matmul_gguf(w, ggml_type, xa, out, n_threads if n_threads > 0 else 1)
    return out


cdef int _matmul_gguf(const uint8_t[:, :] wv, int t, const float[:, ::1] xv, float[:, ::1] yv, int nt) except -1:
    """y (n, rows) = x (n, k) @ W.T from the GGUF block layout (rows of wv may be strided)."""
    cdef int64_t rows = wv.shape[0], n = xv.shape[0], k = xv.shape[1]
    cdef int64_t nb = k // kq_block_size(t), ntiles = (rows + ROW_TILE - 1) // ROW_TILE, i, r0, r1
    cdef int64_t wstride = wv.strides[0]
    cdef const uint8_t *wp = &wv[0, 0]
    cdef float *yp = &yv[0, 0]
    cdef uint8_t[:, ::1] av
    cdef int8_t[:, ::1] aq
    cdef float[:, ::1] ad
    cdef uint8_t *qbuf = NULL
    cdef float *dwbuf = NULL
    if t != MXFP4:
        act = np.empty((n, nb * sizeof(kq_q8k)), dtype=np.uint8)
        av = act
        with nogil, parallel(num_threads=nt):  # one parallel region: quantize, barrier, rows
            for i in prange(n, schedule="static"):
                kq_quantize_q8k(&xv[i, 0], k, <kq_q8k *>&av[i, 0])
            for i in prange(ntiles, schedule="static"):
                r0 = i * ROW_TILE
                r1 = r0 + ROW_TILE
                if r1 > rows:
                    r1 = rows
                kq_matmul_rows(t, wp, wstride, r0, r1, nb, <const kq_q8k *>&av[0, 0], n, yp, rows)
    else:
        aq_arr = np.empty((n, k), dtype=np.int8)
        ad_arr = np.empty((n, nb), dtype=np.float32)
        aq = aq_arr
        ad = ad_arr
        with nogil:
            with parallel(num_threads=nt):  # per-thread scratch for the portable kernel
                qbuf = <uint8_t *>malloc(k + 64)
                dwbuf = <float *>malloc(nb * sizeof(float) + 64)
                for i in prange(n, schedule="static"):
                    kq_quantize_q8_0(&xv[i, 0], k, &aq[i, 0], &ad[i, 0])
                for i in prange(ntiles, schedule="static"):
                    r0 = i * ROW_TILE
                    r1 = r0 + ROW_TILE
                    if r1 > rows:
                        r1 = rows
                    kq_matmul_rows_mxfp4(wp, wstride, r0, r1, k, &aq[0, 0], &ad[0, 0], n, yp, rows,
                                         qbuf, dwbuf)
                free(qbuf)
                free(dwbuf)
    return 0


def _set_amx_min_tokens(int tile, int call=0):
    """Tests and benchmarks: the fewest tokens of a tile (at most 16) and of a work item (a
    16-row group x up to 256 tokens) the AMX kernel takes; tile > 16: never; 0, 0: the
    built-in per-type thresholds."""
    kq_amx_set_min_tokens(tile, call)


def _set_unpacked_min_tokens(int n):
    """Tests and benchmarks: the fewest tokens of a work item (16-row group x token chunk)
    the kernels run on unpacked super-blocks (VNNI: kq_u_groups; AVX2: the group unpacked
    once; fewer: 4 tokens a call on the packed tiles), for every type; 0: never; -1: the
    built-in per-type thresholds. Both ways give the same bits."""
    kq_u_set_min_tokens(n)


def _unpacked_min_tokens(int ggml_type):
    """The threshold in use for a type (0: never)."""
    return kq_u_min_tokens_for(ggml_type)


def _set_kq_pf_mode(int mode):
    """(A/B) How the repacked K-quant kernels ask for their weights ahead: 1 a slice with each
    chunk into L2 (default), 2 the same into L1, 0 a whole tile at its start. Returns the
    previous setting."""
    return kq_set_pf_mode(mode)


def _set_prefetch(int nbytes):
    """Benchmarks: bytes the streaming kernels prefetch ahead (0: off); returns the old value."""
    global simd_pf_dist
    cdef int old = simd_pf_dist
    simd_pf_dist = nbytes
    return old
