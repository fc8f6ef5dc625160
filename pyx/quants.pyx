# cython: language_level=3
"""Kernels for float (F32, F16, BF16) and legacy quant (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) weights.

Implements the kernel module interface of llmcore.quant: pack, matmul, dequantize,
get_rows. The SIMD code lives in simd_q.h (AVX-512 VNNI, portable C fallback).
"""
import numpy as np

from libc.stdint cimport uint8_t, int64_t
from cpython.mem cimport PyMem_Malloc, PyMem_Free

cdef extern from "simd_q.h" nogil:
    ctypedef struct lq_packed:
        int type
        int fmt
        int has_m
        float moff
        int64_t rows, cols, nb, ngroups, qbytes, blk_bytes
        const uint8_t *data
    int LQ_FMT_NONE
    int LQ_FMT_BF16
    int lq_have_vnni()
    int lq_simd_level()
    int lq_fmt_for_type(int type)
    int lq_block_bytes(int type)
    int64_t lq_init_packed(lq_packed *p, int type, int64_t rows, int64_t cols, const uint8_t *data)
    void lq_pack(const uint8_t *raw, int64_t bpr, int type, int64_t rows, int64_t cols, uint8_t *out, int nt)
    int lq_dequant_rows(const uint8_t *raw, int64_t bpr, const int64_t *ids, int64_t nrows, int type,
                        int64_t cols, float *out, int nt)
    int lq_matmul(const lq_packed *P, const float *x, float *y, int64_t n, int nt, int force_scalar)
    int lq_matmul_grouped(const lq_packed *const *P, int64_t ne, const int64_t *offs,
                          const float *x, float *y, int nt)

SUPPORTED_TYPES = (0, 1, 30, 2, 3, 6, 7, 8)  # F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
HAVE_VNNI = bool(lq_have_vnni())
SIMD_LEVEL = ("c", "avx2", "avx512vnni")[lq_simd_level()]  # build-time choice


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
    """Weights (rows, cols) repacked for lq_matmul; `nbytes` = bytes read per matmul."""
    cdef lq_packed p
    cdef readonly object buf
    cdef readonly int64_t rows, cols, nbytes
    cdef readonly int ggml_type

    def __reduce__(self):
        raise TypeError("Packed weights are not picklable")


def pack(const uint8_t[:, ::1] raw, int ggml_type, int n_threads=1):  # IN
    """Repack raw GGUF rows (rows, bytes_per_row) into the interleaved kernel layout."""
    cdef int64_t rows = raw.shape[0], bpr = raw.shape[1]
    cdef int64_t cols = _cols(ggml_type, bpr)
    cdef Packed pk = Packed.__new__(Packed)
    cdef int64_t size = lq_init_packed(&pk.p, ggml_type, rows, cols, NULL)
    cdef uint8_t[::1] out
    cdef const uint8_t[:, ::1] keep
    cdef int64_t off
    pk.rows, pk.cols, pk.ggml_type = rows, cols, ggml_type
    if pk.p.fmt <= LQ_FMT_BF16:
        # float weights are used in place (zero-copy view of the mapping)
        pk.buf = np.asarray(raw)
        keep = raw
        pk.p.data = &keep[0, 0] if rows > 0 and bpr > 0 else NULL
        pk.nbytes = rows * bpr
        return pk
    arr = np.empty(size + 64, dtype=np.uint8)
    off = (-arr.ctypes.data) % 64
    arr = arr[off:off + size]
    out = arr
    # one thread by default: repacking is ~1 GB/s per core and a parallel region per
    # tensor costs more than it saves when the cores are shared
    if size > 0:
        with nogil:
            lq_pack(&raw[0, 0], bpr, ggml_type, rows, cols, &out[0], n_threads)
        pk.p.data = &out[0]
    pk.buf = arr
    pk.nbytes = size
    return pk


def matmul(Packed pk, const float[:, ::1] x, float[:, ::1] y, int n_threads, bint force_scalar=False):  # IN, IN, OUT
    """y (n, rows) = x (n, cols) @ W.T."""
    cdef int64_t n = x.shape[0]
    cdef int rc
    if x.shape[1] != pk.cols or y.shape[0] != n or y.shape[1] != pk.rows:
        raise ValueError(f"matmul: x {tuple(x.shape)[:2]}, y {tuple(y.shape)[:2]} for weights {(pk.rows, pk.cols)}")
    if n == 0 or pk.rows == 0:
        return
    if pk.cols == 0:
        np.asarray(y)[...] = 0
        return
    with nogil:
        rc = lq_matmul(&pk.p, &x[0, 0], &y[0, 0], n, max(1, n_threads), force_scalar)
    if rc != 0:
        raise MemoryError("matmul: scratch allocation failed")


def matmul_grouped(list packs, const int64_t[::1] offsets, const float[:, ::1] x, float[:, ::1] y,
                   int n_threads):  # IN, IN, IN, OUT
    """MoE: rows offsets[i]:offsets[i+1] of y = those rows of x @ packs[i].T, one parallel
    region for all (same type and shape, offsets[0] == 0, len(offsets) == len(packs) + 1)."""
    cdef int64_t ne = len(packs), i, n = x.shape[0]
    cdef Packed pk
    cdef int rc
    if offsets.shape[0] != ne + 1 or (ne and (offsets[0] != 0 or offsets[ne] != n)):
        raise ValueError("matmul_grouped: offsets must run from 0 to len(x), one per expert + 1")
    if ne == 0 or n == 0:
        return
    pk = packs[0]
    if x.shape[1] != pk.cols or y.shape[0] != n or y.shape[1] != pk.rows:
        raise ValueError(f"matmul_grouped: x {tuple(x.shape)[:2]}, y {tuple(y.shape)[:2]} for weights {(pk.rows, pk.cols)}")
    cdef const lq_packed **ptrs = <const lq_packed **>PyMem_Malloc(ne * sizeof(lq_packed *))
    if ptrs == NULL:
        raise MemoryError()
    try:
        for i in range(ne):
            pk = packs[i]
            if pk.rows != packs[0].rows or pk.cols != packs[0].cols or pk.ggml_type != packs[0].ggml_type:
                raise ValueError("matmul_grouped: experts differ in type or shape")
            if offsets[i + 1] < offsets[i]:
                raise ValueError("matmul_grouped: offsets must not decrease")
            ptrs[i] = &pk.p
        if pk.cols == 0:
            np.asarray(y)[...] = 0
            return
        with nogil:
            rc = lq_matmul_grouped(ptrs, ne, &offsets[0], &x[0, 0], &y[0, 0], max(1, n_threads))
        if rc != 0:
            raise MemoryError("matmul_grouped: scratch allocation failed")
    finally:
        PyMem_Free(ptrs)


def dequantize(const uint8_t[:, ::1] raw, int ggml_type, float[:, ::1] out, int n_threads=1):  # IN, OUT
    """out (rows, cols) = dequantized raw rows, bit-exact with gguf.quants.dequantize."""
    cdef int64_t rows = raw.shape[0], cols = _cols(ggml_type, raw.shape[1])
    if out.shape[0] != rows or out.shape[1] != cols:
        raise ValueError(f"dequantize: out {tuple(out.shape)[:2]}, expected {(rows, cols)}")
    if rows == 0 or cols == 0:
        return
    with nogil:
        lq_dequant_rows(&raw[0, 0], raw.shape[1], NULL, rows, ggml_type, cols, &out[0, 0], n_threads)


def get_rows(const uint8_t[:, ::1] raw, int ggml_type, const int64_t[::1] ids, float[:, ::1] out):  # IN, IN, OUT
    """out[i] = dequantized row ids[i] of raw (rows, bytes_per_row)."""
    cdef int64_t k = ids.shape[0], cols = _cols(ggml_type, raw.shape[1]), i
    if out.shape[0] != k or out.shape[1] != cols:
        raise ValueError(f"get_rows: out {tuple(out.shape)[:2]}, expected {(k, cols)}")
    for i in range(k):
        if ids[i] < 0 or ids[i] >= raw.shape[0]:
            raise IndexError(f"get_rows: row {ids[i]} out of range [0, {raw.shape[0]})")
    if k == 0 or cols == 0:
        return
    with nogil:
        lq_dequant_rows(&raw[0, 0], raw.shape[1], &ids[0], k, ggml_type, cols, &out[0, 0], 1)
