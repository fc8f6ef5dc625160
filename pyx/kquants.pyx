# cython: language_level=3
"""K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and MXFP4 kernels.

Public API (all arrays NumPy):

- ``SUPPORTED``: set of ggml type ids handled here.
- ``simd() -> str``: "avx512vnni", "avx2" or "c" (the path this build uses).
- ``dequantize(raw, ggml_type) -> float32 1-D``: equals ``gguf.quants.dequantize`` bit
  for bit; ``raw`` is any C-contiguous uint8 array of whole blocks.
- ``matmul(w, ggml_type, x, out=None, n_threads=0) -> float32 (n, rows)``: y = x @ W.T.
  ``w`` is uint8 (rows, row_bytes) in GGUF block layout (rows may be strided, e.g. one
  expert's slice of a 3-D tensor); ``x`` float32 (n, in). Activations are quantized like
  llama.cpp (q8_K for K-quants, q8_0 for MXFP4), dots are integer (VNNI/AVX2/C).
  ``n_threads <= 0``: llmcore.threads.get_num_threads(). The GIL is released.
- ``quantize_q8_k(x) -> (d float32 (n, nb), qs int8 (n, nb, 256), bsums int16 (n, nb, 16))``
  for tests and references.
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from libc.stdint cimport uint8_t, int8_t, int16_t, int32_t, int64_t
from libc.stdlib cimport malloc, free

cnp.import_array()

cdef extern from "simd_kquants.h" nogil:
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

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4 = 10, 11, 12, 13, 14, 39
SUPPORTED = frozenset({Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4})
Q8K_DTYPE = np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))])
assert Q8K_DTYPE.itemsize == sizeof(kq_q8k)

cdef enum:
    ROW_TILE = 8   # rows per OpenMP work item


def simd():
    return kq_simd_name().decode()


def block_info(int ggml_type):
    """(values per block, bytes per block)."""
    if ggml_type not in SUPPORTED:
        raise ValueError(f"kquants: unsupported ggml type {ggml_type}")
    return kq_block_size(ggml_type), kq_type_size(ggml_type)


cdef int _threads(int n_threads):
    if n_threads > 0:
        return n_threads
    from llmcore.threads import get_num_threads
    return max(1, get_num_threads())


def dequantize(raw, int ggml_type, int n_threads=0):
    """Dequantize whole blocks of raw GGUF bytes to a flat float32 array."""
    bs, ts = block_info(ggml_type)
    cdef const uint8_t[::1] src = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if src.shape[0] % ts:
        raise ValueError(f"kquants.dequantize: {src.shape[0]} bytes is not a whole number of {ts}-byte blocks")
    cdef int64_t nblocks = src.shape[0] // ts
    out = np.empty(nblocks * bs, dtype=np.float32)
    cdef float[::1] dst = out
    if nblocks == 0:
        return out
    cdef int nt = _threads(n_threads)
    cdef int64_t chunk = 64, nchunks = (nblocks + chunk - 1) // chunk, c, b0, b1
    cdef int t = ggml_type, cts = ts, cbs = bs
    with nogil:
        for c in prange(nchunks, num_threads=nt, schedule="static"):
            b0 = c * chunk
            b1 = b0 + chunk
            if b1 > nblocks:
                b1 = nblocks
            kq_dequant_blocks(t, &src[b0 * cts], b1 - b0, &dst[b0 * cbs])
    return out


def quantize_q8_k(x, int n_threads=0):
    """llama.cpp q8_K quantization of float32 rows (n, k), k % 256 == 0."""
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, np.shape(x)[np.ndim(x) - 1])
    cdef int64_t n = xv.shape[0], k = xv.shape[1], i
    if k % 256:
        raise ValueError("quantize_q8_k: row length must be a multiple of 256")
    cdef int64_t nb = k // 256
    out = np.empty((n, nb), dtype=Q8K_DTYPE)
    cdef uint8_t[:, ::1] ov = out.view(np.uint8).reshape(n, nb * sizeof(kq_q8k))
    cdef int nt = _threads(n_threads)
    if n:
        with nogil:
            for i in prange(n, num_threads=nt, schedule="static"):
                kq_quantize_q8k(&xv[i, 0], k, <kq_q8k *>&ov[i, 0])
    return out["d"], out["qs"], out["bsums"]


def matmul(w, int ggml_type, x, out=None, int n_threads=0):
    """y = x @ W.T with W (rows, row_bytes) uint8 in GGUF layout of `ggml_type`."""
    bs, ts = block_info(ggml_type)
    w = np.asarray(w)
    if w.dtype != np.uint8 or w.ndim != 2:
        w = w.view(np.uint8).reshape(w.shape[0], -1)
    if w.strides[1] != 1 or w.strides[0] < w.shape[1]:
        w = np.ascontiguousarray(w)
    cdef const uint8_t[:, :] wv = w
    cdef int64_t rows = wv.shape[0], row_bytes = wv.shape[1]
    if row_bytes % ts:
        raise ValueError(f"kquants.matmul: row of {row_bytes} bytes is not whole {ts}-byte blocks")
    cdef int64_t k = row_bytes // ts * bs
    xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim == 1:
        xa = xa.reshape(1, -1)
    if xa.ndim != 2 or xa.shape[1] != k:
        raise ValueError(f"kquants.matmul: x has shape {np.shape(x)}, weight rows hold {k} values")
    cdef const float[:, ::1] xv = xa
    cdef int64_t n = xv.shape[0]
    if out is None:
        out = np.empty((n, rows), dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != (n, rows) or not out.flags.c_contiguous:
        raise ValueError(f"kquants.matmul: out must be C-contiguous float32 {(n, rows)}")
    cdef float[:, ::1] yv = out
    if n == 0 or rows == 0:
        return out
    cdef int nt = _threads(n_threads)
    cdef int t = ggml_type
    cdef int64_t nb = k // bs, ntiles = (rows + ROW_TILE - 1) // ROW_TILE, i, r0, r1
    cdef int64_t wstride = wv.strides[0]
    cdef const uint8_t *wp = &wv[0, 0]
    cdef float *yp = &yv[0, 0]
    cdef uint8_t[:, ::1] av
    cdef int8_t[:, ::1] aq
    cdef float[:, ::1] ad
    cdef uint8_t *qbuf
    cdef float *dwbuf
    if t != MXFP4:
        act = np.empty((n, nb * sizeof(kq_q8k)), dtype=np.uint8)
        av = act
        with nogil:
            for i in prange(n, num_threads=nt, schedule="static"):
                kq_quantize_q8k(&xv[i, 0], k, <kq_q8k *>&av[i, 0])
            for i in prange(ntiles, num_threads=nt, schedule="static"):
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
            for i in prange(n, num_threads=nt, schedule="static"):
                kq_quantize_q8_0(&xv[i, 0], k, &aq[i, 0], &ad[i, 0])
            with parallel(num_threads=nt):
                qbuf = <uint8_t *>malloc(k + 64)
                dwbuf = <float *>malloc(nb * sizeof(float) + 64)
                for i in prange(ntiles, schedule="static"):
                    r0 = i * ROW_TILE
                    r1 = r0 + ROW_TILE
                    if r1 > rows:
                        r1 = rows
                    kq_matmul_rows_mxfp4(wp, wstride, r0, r1, k, &aq[0, 0], &ad[0, 0], n, yp, rows,
                                         qbuf, dwbuf)
                free(qbuf)
                free(dwbuf)
    return out
