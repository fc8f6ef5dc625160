# cython: language_level=3
"""Kernels for the i-quants with the non-linear 4-bit table: IQ4_NL and IQ4_XS weights.

Implements the weight-format kernel interface of llmcore.quant (quants.pyx and kquants.pyx
implement the same one): SUPPORTED, SIMD_LEVEL, Packed, pack, matmul, matmul_grouped,
dequantize and get_rows. On AVX-512 VNNI builds weights are repacked at load into 16-row
interleaved groups ("repacked16"); elsewhere, with repack=False or with
``LLMCORE_IQ_REPACK=0``, the GGUF layout is used in place ("raw"). Activations are quantized
once per row like llama.cpp (q8_0 for IQ4_NL, q8_K for IQ4_XS) and dots are integer. The
GGUF-layout kernels sum in ggml's vec_dot order (bit-identical to llama.cpp's matmuls where
it runs vec_dot: experts, and small batches); the repacked ones sum whole blocks, twice as
fast for prefill, the same integers in another float order (see simd_iquants.h). Results never depend on the thread
count or the batch composition.
"""
import os

import numpy as np

from llmcore._kernels.quants import aligned_buffer

from cython.parallel cimport parallel, prange
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from weight_rows cimport dequantize_blocks, rows_of_blocks

cdef extern from "simd_iquants.h" nogil:
    const char *iq_simd_name()
    int iq_type_size(int t)
    int iq_block_size(int t)
    void iq_dequant_blocks(int t, const uint8_t *src, int64_t nblocks, float *dst)
    void iq_quantize_row(int t, const float *x, int64_t k, int8_t *qs, float *d, int32_t *bias)
    void iq_matmul_rows(int t, const uint8_t *W, int64_t row_stride, int64_t r0, int64_t r1, int64_t k,
                        const int8_t *qs, const float *d, int64_t n, float *Y, int64_t ldy)
    ctypedef struct iq_act:
        const int8_t *qs
        const float *d
        const int32_t *bias
    int IQ_RP
    int iq_rp_supported(int t)
    int64_t iq_rp_group_bytes(int t, int64_t k)
    void iq_rp_pack(int t, const uint8_t *W, int64_t row_stride, int64_t rows, int64_t k,
                    int64_t g0, int64_t g1, uint8_t *out)
    void iq_rp_group(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g, const iq_act *act,
                     int64_t tok0, int64_t n, float *Y, int64_t ldy)

IQ4_NL, IQ4_XS = 20, 23
SUPPORTED = frozenset({IQ4_NL, IQ4_XS})
SIMD_LEVEL = iq_simd_name().decode()  # build-time choice: "avx512vnni", "avx2" or "c"

cdef enum:
    ROW_TILE = 16     # rows per work item of the GGUF-layout kernel
    TOK_CHUNK = 64    # tokens per work item of the repacked kernels
    MIN_WORK = 98304  # bytes of weight x 4-token tiles per thread: smaller calls use fewer threads


cdef int64_t _cols(int ggml_type, int64_t row_bytes) except -1:
    if ggml_type not in SUPPORTED:
        raise ValueError(f"iquants: unsupported ggml type {ggml_type}")
    cdef int64_t ts = iq_type_size(ggml_type)
    if row_bytes % ts:
        raise ValueError(f"iquants: rows of {row_bytes} bytes are not whole {ts}-byte blocks")
    return row_bytes // ts * iq_block_size(ggml_type)


def dequantize(const uint8_t[:, ::1] raw, int ggml_type, float[:, ::1] out, int n_threads):
    """out = the dequantized rows, bit-exact with gguf.quants.dequantize.

    raw : uint8 (rows, bytes_per_row), C-contiguous
    out : float32 (rows, cols)
    n_threads : OpenMP threads over chunks of blocks (small tensors run on one)
    """
    cdef int64_t cols = _cols(ggml_type, raw.shape[1])
    dequantize_blocks("iquants", iq_dequant_blocks, ggml_type, iq_block_size(ggml_type), iq_type_size(ggml_type), raw, cols, out, n_threads)


def get_rows(const uint8_t[:, ::1] raw, int ggml_type, const int64_t[::1] ids, float[:, ::1] out,
             int n_threads):
    """out[i] = dequantized row ids[i] of raw (embedding lookup).

    raw : uint8 (rows, bytes_per_row), C-contiguous
    ids : int64 (k,), each in [0, rows) (IndexError otherwise)
    out : float32 (k, cols)
    n_threads : OpenMP threads over the ids (a few ids run on one)
    """
    cdef int64_t cols = _cols(ggml_type, raw.shape[1])
    rows_of_blocks("iquants", iq_dequant_blocks, ggml_type, iq_block_size(ggml_type), raw, cols, ids, out, n_threads)


cdef class Packed:
    """An IQ4_NL / IQ4_XS weight (rows, cols) prepared for matmul.

    layout : "repacked16" (rows interleaved 16 at a time, see simd_iquants.h; AVX-512 VNNI
        builds) or "raw" (the GGUF block layout used in place)
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
        return f"iquants.Packed(type={self.ggml_type}, rows={self.rows}, cols={self.cols}, layout={self.layout})"


def pack(const uint8_t[:, ::1] raw, int ggml_type, repack=None, alloc=None):
    """Prepare raw GGUF rows for matmul.

    raw : uint8 (rows, bytes_per_row), C-contiguous; the raw layout keeps a view of it
    repack : None: repacked where this build has the layout (AVX-512 VNNI), unless
        LLMCORE_IQ_REPACK=0; True: repacked where this build has the layout; False: the GGUF
        layout (llama.cpp's float order)
    alloc : None, or alloc(nbytes) -> writable 64-byte aligned uint8 (nbytes,) for the
        repacked layout (the weight arena); None: a fresh allocation
    Single-threaded, like quants.pack.
    """
    cdef Packed pk = Packed.__new__(Packed)
    pk.ggml_type = ggml_type
    pk.rows = raw.shape[0]
    pk.cols = _cols(ggml_type, raw.shape[1])
    pk.ngroups = (pk.rows + IQ_RP - 1) // IQ_RP
    if repack is None:
        repack = os.environ.get("LLMCORE_IQ_REPACK", "1") != "0"
    if repack and iq_rp_supported(ggml_type) and pk.rows > 0 and pk.cols > 0:
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
    cdef int64_t gb = iq_rp_group_bytes(t, k), size = gb * ngroups
    arr = aligned_buffer(size, alloc)
    cdef uint8_t[::1] ov = arr
    cdef int64_t stride = rv.strides[0], rows = rv.shape[0]
    with nogil:
        iq_rp_pack(t, &rv[0, 0], stride, rows, k, 0, ngroups, &ov[0])
    return arr


cdef inline int _cap_threads(int nt, int64_t weight_bytes, int64_t n) noexcept nogil:
    """A parallel region costs microseconds (much more when the cores are shared): give
    each thread at least MIN_WORK. Results do not depend on the thread count."""
    cdef int64_t w = weight_bytes * ((n + 3) // 4) // MIN_WORK
    if w < 1:
        w = 1
    return <int>w if w < nt else nt


cdef class _Acts:
    """x quantized once per row: qs (n, k) int8, d (n, k / block size), bias (n, k / 32)
    int32 (the repacked kernels' offset terms; empty for the GGUF layout)."""
    cdef object qs_arr, d_arr, c_arr
    cdef iq_act act

    def __cinit__(self, int t, int64_t n, int64_t k, bint repacked):
        cdef int8_t[:, ::1] qv
        cdef float[:, ::1] dv
        cdef int32_t[:, ::1] cv
        self.qs_arr = np.empty((n, k), dtype=np.int8)
        self.d_arr = np.empty((n, k // iq_block_size(t)), dtype=np.float32)
        self.c_arr = np.empty((n, k // 32 if repacked else 0), dtype=np.int32)
        qv, dv = self.qs_arr, self.d_arr
        self.act.qs = &qv[0, 0]
        self.act.d = &dv[0, 0]
        self.act.bias = NULL
        if repacked:
            cv = self.c_arr
            self.act.bias = &cv[0, 0]


cdef inline void _quantize_row(int t, const float *x, int64_t k, int64_t i, const iq_act *a) noexcept nogil:
    """Row i of the activations (buffers of _Acts)."""
    cdef int64_t nb = k // iq_block_size(t)
    iq_quantize_row(t, x, k, <int8_t *>&a.qs[i * k], <float *>&a.d[i * nb],
                    <int32_t *>&a.bias[i * (k // 32)] if a.bias != NULL else NULL)


def matmul(Packed packed, const float[:, ::1] x, float[:, ::1] y, int n_threads):
    """y = x @ W.T.

    x : float32 (n, cols); y : float32 (n, rows), overwritten
    n_threads : OpenMP threads (one parallel region; small calls use fewer); results do not
        depend on it
    """
    cdef int64_t n = x.shape[0], k = packed.cols, rows = packed.rows
    if x.shape[1] != k or y.shape[0] != n or y.shape[1] != rows:
        raise ValueError(f"iquants.matmul: x {tuple(x.shape)[:2]}, y {tuple(y.shape)[:2]} for weights {(rows, k)}")
    if n == 0 or rows == 0:
        return
    cdef int nt = n_threads if n_threads > 0 else 1
    nt = _cap_threads(nt, packed.nbytes, n)
    if packed.layout == "raw":
        _matmul_gguf(packed.raw, packed.ggml_type, x, y, nt)
        return
    cdef _Acts acts = _Acts(packed.ggml_type, n, k, True)
    cdef const uint8_t[::1] pv = packed.buf
    cdef int64_t ng = packed.ngroups, nchunks = (n + TOK_CHUNK - 1) // TOK_CHUNK
    cdef int64_t nitems = ng * nchunks, it, g, c, t0, t1, i
    cdef int t = packed.ggml_type
    cdef const uint8_t *pp = &pv[0]
    cdef const float *xp = &x[0, 0]
    cdef float *yp = &y[0, 0]
    cdef const iq_act *ap = &acts.act
    with nogil, parallel(num_threads=min(nt, max(n, nitems))):  # one region: quantize, barrier, rows
        for i in prange(n, schedule="static"):
            _quantize_row(t, xp + i * k, k, i, ap)
        for it in prange(nitems, schedule="static"):
            c = it // ng
            g = it - c * ng
            t0 = c * TOK_CHUNK
            t1 = min(t0 + TOK_CHUNK, n)
            iq_rp_group(t, pp, k, rows, g, ap, t0, t1 - t0, yp + t0 * rows, rows)


def matmul_grouped(list packs, const int64_t[::1] offsets, const float[:, ::1] x, float[:, ::1] y,
                   int n_threads):
    """MoE: rows offsets[i]:offsets[i+1] of y = those rows of x @ packs[i].T, one parallel
    region over (expert, token chunk, 16-row group) work items, activations quantized once.

    packs : Packed weights of one type, shape and layout
    offsets : int64 (len(packs) + 1,), non-decreasing from 0 to n
    x : float32 (n, cols); y : float32 (n, rows), overwritten
    """
    cdef int64_t ne = len(packs), i, n = x.shape[0]
    cdef Packed pk
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
    cdef int64_t work = 0
    for i in range(ne):
        work += pk.nbytes * ((offsets[i + 1] - offsets[i] + 3) // 4)
    nt = _cap_threads(nt, work, 4)
    if pk.layout == "raw":
        for i in range(ne):
            if offsets[i + 1] > offsets[i]:
                _matmul_gguf((<Packed>packs[i]).raw, pk.ggml_type, x[offsets[i]:offsets[i + 1]],
                             y[offsets[i]:offsets[i + 1]], nt)
        return
    cdef int64_t ng = pk.ngroups, k = pk.cols, rows = pk.rows, nitems = 0, c, nc, g, it, e, t0, t1, r
    cdef _Acts acts = _Acts(pk.ggml_type, n, k, True)
    for i in range(ne):
        nitems += (offsets[i + 1] - offsets[i] + TOK_CHUNK - 1) // TOK_CHUNK * ng
    items = np.empty((nitems, 3), dtype=np.int64)   # expert, group, first token
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
            for g in range(ng):
                iv[it, 0] = i
                iv[it, 1] = g
                iv[it, 2] = offsets[i] + c * TOK_CHUNK
                it += 1
    cdef int t = pk.ggml_type
    cdef const float *xp = &x[0, 0]
    cdef float *yp = &y[0, 0]
    cdef const iq_act *ap = &acts.act
    with nogil, parallel(num_threads=min(nt, max(n, nitems))):  # one region: quantize, barrier, items
        for r in prange(n, schedule="static"):
            _quantize_row(t, xp + r * k, k, r, ap)
        for it in prange(nitems, schedule="static"):
            e = iv[it, 0]
            t0 = iv[it, 2]
            t1 = min(t0 + TOK_CHUNK, offsets[e + 1])
            iq_rp_group(t, <const uint8_t *>pv[e], k, rows, iv[it, 1], ap, t0, t1 - t0, yp + t0 * rows, rows)


cdef int _matmul_gguf(const uint8_t[:, :] wv, int t, const float[:, ::1] xv, float[:, ::1] yv, int nt) except -1:
    """y (n, rows) = x (n, k) @ W.T from the GGUF block layout (rows of wv may be strided)."""
    cdef int64_t rows = wv.shape[0], n = xv.shape[0], k = xv.shape[1]
    cdef int64_t ntiles = (rows + ROW_TILE - 1) // ROW_TILE, i, r0, r1
    cdef int64_t wstride = wv.strides[0]
    cdef const uint8_t *wp = &wv[0, 0]
    cdef float *yp = &yv[0, 0]
    cdef _Acts acts = _Acts(t, n, k, False)
    cdef const iq_act *ap = &acts.act
    with nogil, parallel(num_threads=nt):  # one parallel region: quantize, barrier, rows
        for i in prange(n, schedule="static"):
            _quantize_row(t, &xv[i, 0], k, i, ap)
        for i in prange(ntiles, schedule="static"):
            r0 = i * ROW_TILE
            r1 = r0 + ROW_TILE
            if r1 > rows:
                r1 = rows
            iq_matmul_rows(t, wp, wstride, r0, r1, k, ap.qs, ap.d, n, yp, rows)
    return 0
