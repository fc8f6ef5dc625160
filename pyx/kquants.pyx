# cython: language_level=3
"""K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and MXFP4 kernels.

Public API (all arrays NumPy):

- ``SUPPORTED``: set of ggml type ids handled here.
- ``simd() -> str``: "avx512vnni", "avx2" or "c" (the path this build uses).
- Kernel module interface of llmcore.quant (see its docstring): ``pack(raw, ggml_type,
  repack=None) -> Packed`` (rows, cols, nbytes, layout): Q4_K, Q5_K, Q6_K and MXFP4 are
  repacked at load into 16-row interleaved tiles ("repacked16", AVX-512 VNNI builds;
  ``LLMCORE_KQ_REPACK=0`` or repack=False keeps the zero-copy GGUF layout, "raw"),
  ``matmul(packed, x, y, n_threads)``, ``matmul_grouped(packs, offsets, x, y, n_threads)``
  (MoE: rows offsets[i]:offsets[i+1] through packs[i], one parallel region, activations
  quantized once; used by quant.ExpertLinear.grouped), ``dequantize(raw, ggml_type, out=None)`` (equals
  ``gguf.quants.dequantize`` bit for bit; returns a flat array when out is None),
  ``get_rows(raw, ggml_type, ids, out)``.
- ``matmul_raw(w, ggml_type, x, out=None, n_threads=0) -> float32 (n, rows)``: y = x @ W.T.
  ``w`` is uint8 (rows, row_bytes) in GGUF block layout (rows may be strided, e.g. one
  expert's slice of a 3-D tensor); ``x`` float32 (n, in). Activations are quantized like
  llama.cpp (q8_K for K-quants, q8_0 for MXFP4), dots are integer (VNNI/AVX2/C).
  Repacked and raw layouts compute the same integers; float sums differ in order only
  (within float rounding). Results never depend on thread count or batch composition.
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
    ctypedef struct kq_act:
        const kq_q8k *q8k
        const int8_t *aq
        const float *ad
        const int32_t *as_ "as"
    int KQ_RP
    int kq_rp_supported(int t)
    int64_t kq_rp_group_bytes(int t, int64_t k)
    void kq_rp_pack(int t, const uint8_t *W, int64_t row_stride, int64_t rows, int64_t k,
                    int64_t g0, int64_t g1, uint8_t *out)
    void kq_rp_group(int t, const uint8_t *P, int64_t k, int64_t rows, int64_t g,
                     const kq_act *act, int64_t tok0, int64_t n, float *Y, int64_t ldy)
    void kq_quantize_q8_0_sums(const float *x, int64_t k, int8_t *qs, float *d, int32_t *s)

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4 = 10, 11, 12, 13, 14, 39
SUPPORTED = frozenset({Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4})
Q8K_DTYPE = np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))])
assert Q8K_DTYPE.itemsize == sizeof(kq_q8k)

cdef enum:
    ROW_TILE = 8   # rows per OpenMP work item
    T_MXFP4 = 39


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


def dequantize(raw, int ggml_type, out=None, int n_threads=0):
    """Dequantize whole blocks of raw GGUF bytes into `out` (float32, any C-contiguous
    shape with the right size) or a new flat float32 array; returns it."""
    bs, ts = block_info(ggml_type)
    cdef const uint8_t[::1] src = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if src.shape[0] % ts:
        raise ValueError(f"kquants.dequantize: {src.shape[0]} bytes is not a whole number of {ts}-byte blocks")
    cdef int64_t nblocks = src.shape[0] // ts
    if out is None:
        out = np.empty(nblocks * bs, dtype=np.float32)
    elif out.dtype != np.float32 or not out.flags.c_contiguous or out.size != nblocks * bs:
        raise ValueError(f"kquants.dequantize: out must be C-contiguous float32 with {nblocks * bs} values")
    cdef float[::1] dst = out.reshape(-1)
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


def get_rows(raw, int ggml_type, ids, out):
    """out[i] = dequantized row ids[i] of raw (rows, bytes_per_row)."""
    bs, ts = block_info(ggml_type)
    r = np.asarray(raw).view(np.uint8)
    r = r.reshape(r.shape[0], -1)
    if r.strides[1] != 1:
        r = np.ascontiguousarray(r)
    cdef const uint8_t[:, :] rv = r
    cdef const int64_t[::1] iv = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    cdef int64_t nrows = rv.shape[0], nb = rv.shape[1] // ts, n = iv.shape[0], i, row
    if rv.shape[1] % ts:
        raise ValueError("kquants.get_rows: rows are not whole blocks")
    if out.dtype != np.float32 or not out.flags.c_contiguous or out.shape != (n, nb * bs):
        raise ValueError(f"kquants.get_rows: out must be C-contiguous float32 {(n, nb * bs)}")
    for i in range(n):
        if iv[i] < 0 or iv[i] >= nrows:
            raise IndexError(f"kquants.get_rows: row {iv[i]} out of range [0, {nrows})")
    cdef float[:, ::1] ov = out
    cdef int t = ggml_type
    if n == 0 or nb == 0:
        return out
    cdef int nt = min(_threads(0), n) if n > 4 else 1
    with nogil:
        for i in prange(n, num_threads=nt, schedule="static"):
            row = iv[i]
            kq_dequant_blocks(t, &rv[row, 0], nb, &ov[i, 0])
    return out


def _repack_enabled():
    import os
    return os.environ.get("LLMCORE_KQ_REPACK", "1") != "0"


cdef class Packed:
    """A K-quant/MXFP4 weight (rows, cols) prepared for matmul.

    ``layout`` "repacked16": rows interleaved 16 at a time (see simd_kquants.h), built at
    pack time (Q4_K, Q5_K, Q6_K, MXFP4 on AVX-512 VNNI builds; off with
    ``LLMCORE_KQ_REPACK=0``); ``raw``: zero-copy GGUF block layout, the kq_matmul_rows path.
    ``nbytes`` is the bytes one matmul reads."""
    cdef readonly int ggml_type
    cdef readonly int64_t rows, cols, nbytes, ngroups
    cdef readonly object raw
    cdef readonly object buf
    cdef readonly str layout

    def __init__(self, raw, int ggml_type, repack=None):
        bs, ts = block_info(ggml_type)
        r = np.asarray(raw)
        if r.ndim != 2:
            raise ValueError(f"kquants.pack: expected (rows, bytes_per_row), got shape {r.shape}")
        r = r.view(np.uint8)
        if r.strides[1] != 1 or r.strides[0] < r.shape[1]:
            r = np.ascontiguousarray(r)
        if r.shape[1] % ts:
            raise ValueError(f"kquants.pack: rows of {r.shape[1]} bytes are not whole {ts}-byte blocks")
        self.ggml_type = ggml_type
        self.rows = r.shape[0]
        self.cols = r.shape[1] // ts * bs
        if repack is None:
            repack = _repack_enabled()
        self.ngroups = (self.rows + KQ_RP - 1) // KQ_RP
        if repack and kq_rp_supported(ggml_type) and self.rows > 0 and self.cols > 0:
            self.layout = "repacked16"
            self.raw = None
            self.buf = _repack(r, ggml_type, self.cols, self.ngroups)
            self.nbytes = self.buf.shape[0]
        else:
            self.layout = "raw"
            self.raw = r
            self.buf = None
            self.nbytes = r.shape[0] * r.shape[1]

    def __reduce__(self):
        raise TypeError("Packed weights are not picklable")

    def __repr__(self):
        return f"kquants.Packed(type={self.ggml_type}, rows={self.rows}, cols={self.cols}, layout={self.layout})"


cdef object _repack(r, int t, int64_t k, int64_t ngroups):
    cdef const uint8_t[:, :] rv = r
    cdef int64_t gb = kq_rp_group_bytes(t, k), size = gb * ngroups
    arr = np.empty(size + 64, dtype=np.uint8)
    off = (-arr.ctypes.data) % 64
    arr = arr[off:off + size]
    cdef uint8_t[::1] ov = arr
    cdef int64_t stride = rv.strides[0], rows = rv.shape[0]
    with nogil:
        kq_rp_pack(t, &rv[0, 0], stride, rows, k, 0, ngroups, &ov[0])
    return arr


def pack(raw, int ggml_type, repack=None):
    """Prepare a 2-D weight (rows, bytes_per_row) for matmul (kernel module interface).
    repack: None = default (repack where supported), False = keep the GGUF layout."""
    return Packed(raw, ggml_type, repack)


cdef enum:
    TOK_CHUNK = 64   # tokens per work item of the repacked kernels
    MIN_WORK = 98304  # bytes of weight x 4-token tiles per thread: smaller calls use fewer threads


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
    if t != MXFP4:
        a = np.empty((n, (k // 256) * sizeof(kq_q8k)), dtype=np.uint8)
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


def matmul(Packed packed, x, y, int n_threads=0):
    """y[...] = x @ W.T (kernel module interface): x (n, cols), y (n, rows) float32."""
    if packed.layout == "raw":
        matmul_raw(packed.raw, packed.ggml_type, x, y, n_threads)
        return
    cdef const float[:, ::1] xv = x
    cdef float[:, ::1] yv = y
    cdef int64_t n = xv.shape[0], k = packed.cols, rows = packed.rows
    if xv.shape[1] != k or yv.shape[0] != n or yv.shape[1] != rows:
        raise ValueError(f"kquants.matmul: x {tuple(xv.shape)[:2]}, y {tuple(yv.shape)[:2]} for weights {(rows, k)}")
    if n == 0:
        return
    cdef int nt = _threads(n_threads)
    cdef kq_act act
    keep = _alloc_acts(packed.ggml_type, n, k, &act)
    cdef const uint8_t[::1] pv = packed.buf
    cdef int64_t ng = packed.ngroups, nchunks = (n + TOK_CHUNK - 1) // TOK_CHUNK
    cdef int64_t nitems = ng * nchunks, it, g, c, t0, t1
    cdef int t = packed.ggml_type
    cdef const uint8_t *pp = &pv[0]
    cdef float *yp = &yv[0, 0]
    cdef int64_t i
    nt = _cap_threads(nt, packed.nbytes, n)
    with nogil, parallel(num_threads=min(nt, max(n, nitems))):  # one region: quantize, barrier, rows
        for i in prange(n, schedule="static"):
            _quantize_row(t, &xv[i, 0], k, i, &act)
        for it in prange(nitems, schedule="static"):
            c = it // ng
            g = it - c * ng
            t0 = c * TOK_CHUNK
            t1 = min(t0 + TOK_CHUNK, n)
            kq_rp_group(t, pp, k, rows, g, &act, t0, t1 - t0, yp + t0 * rows, rows)
    del keep


def matmul_grouped(list packs, const int64_t[::1] offsets, x, y, int n_threads=0):
    """MoE: rows offsets[i]:offsets[i+1] of y = those rows of x @ packs[i].T, one parallel
    region over (expert, token chunk, 16-row group) work items, activations quantized once
    (same type and shape, offsets[0] == 0, len(offsets) == len(packs) + 1)."""
    cdef int64_t ne = len(packs), i, n
    cdef Packed pk
    if offsets.shape[0] != ne + 1:
        raise ValueError("matmul_grouped: offsets must have len(packs) + 1 entries")
    if ne == 0:
        return
    pk = packs[0]
    cdef const float[:, ::1] xv = x
    cdef float[:, ::1] yv = y
    n = xv.shape[0]
    if offsets[0] != 0 or offsets[ne] != n:
        raise ValueError("matmul_grouped: offsets must run from 0 to len(x)")
    if xv.shape[1] != pk.cols or yv.shape[0] != n or yv.shape[1] != pk.rows:
        raise ValueError(f"matmul_grouped: x {tuple(xv.shape)[:2]}, y {tuple(yv.shape)[:2]} for weights {(pk.rows, pk.cols)}")
    for i in range(ne):
        if (<Packed>packs[i]).rows != pk.rows or (<Packed>packs[i]).cols != pk.cols \
                or (<Packed>packs[i]).ggml_type != pk.ggml_type or (<Packed>packs[i]).layout != pk.layout:
            raise ValueError("matmul_grouped: experts differ in type, shape or layout")
        if offsets[i + 1] < offsets[i]:
            raise ValueError("matmul_grouped: offsets must not decrease")
    if n == 0:
        return
    if pk.layout == "raw":
        xa, ya = np.asarray(xv), np.asarray(yv)
        for i in range(ne):
            if offsets[i + 1] > offsets[i]:
                ya[offsets[i]:offsets[i + 1]] = matmul_raw(packs[i].raw, pk.ggml_type, xa[offsets[i]:offsets[i + 1]],
                                                           n_threads=n_threads)
        return
    cdef int nt = _threads(n_threads)
    cdef kq_act act
    cdef int64_t ng = pk.ngroups, k = pk.cols, rows = pk.rows, nitems = 0, c, nc, g, it, e, t0, t1, r
    keep = _alloc_acts(pk.ggml_type, n, k, &act)
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
    cdef float *yp = &yv[0, 0]
    cdef int64_t work = 0
    for i in range(ne):
        work += pk.nbytes * ((offsets[i + 1] - offsets[i] + 3) // 4)
    nt = _cap_threads(nt, work, 4)
    with nogil, parallel(num_threads=min(nt, max(n, nitems))):  # one region: quantize, barrier, items
        for r in prange(n, schedule="static"):
            _quantize_row(t, &xv[r, 0], k, r, &act)
        for it in prange(nitems, schedule="static"):
            e = iv[it, 0]
            t0 = iv[it, 2]
            t1 = min(t0 + TOK_CHUNK, offsets[e + 1])
            kq_rp_group(t, <const uint8_t *>pv[e], k, rows, iv[it, 1], &act, t0, t1 - t0, yp + t0 * rows, rows)
    del keep


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


def matmul_raw(w, int ggml_type, x, out=None, int n_threads=0):
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
            with parallel(num_threads=nt):
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
    return out
