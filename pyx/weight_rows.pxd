# Dequantize and row lookup (embedding) of a block-quantized weight, shared by the weight-format
# modules (quants.pyx, kquants.pyx, iquants.pyx): each passes the C function that dequantizes
# a run of its format's blocks; the checks, the thread choice and the loops are written here
# once. Inlined into every module that cimports it.
from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t

# dst[0 : nblocks * values a block] = the nblocks blocks of type t at src (blocks of one
# tensor are adjacent, rows included: a row is whole blocks)
ctypedef void (*dequant_blocks_fn)(int t, const uint8_t *src, int64_t nblocks, float *dst) noexcept nogil

cdef enum:
    DEQUANT_CHUNK_VALUES = 2048  # a dequantize work item: this many values, and at least 64 blocks
    MIN_PARALLEL_VALUES = 65536  # dequantize: smaller tensors run on one thread
    MIN_PARALLEL_ROWS = 64       # get_rows: fewer rows run on one thread (a row is
                                 # ~0.1-1 us; waking a sleeping team costs tens)


cdef inline int dequantize_blocks(str who, dequant_blocks_fn f, int t, int bs, int ts, const uint8_t[:, ::1] raw,
                                  int64_t cols, float[:, ::1] out, int n_threads) except -1:
    """out = the dequantized rows of raw (rows of cols values, blocks of bs values in ts bytes),
    over chunks of blocks on n_threads OpenMP threads (small tensors on one)."""
    cdef int64_t rows = raw.shape[0]
    if out.shape[0] != rows or out.shape[1] != cols:
        raise ValueError(f"{who}.dequantize: out {(out.shape[0], out.shape[1])}, expected {(rows, cols)}")
    if rows == 0 or cols == 0:
        return 0
    cdef int64_t nblocks = rows * cols // bs
    cdef int64_t chunk = max(DEQUANT_CHUNK_VALUES // bs, 64)  # blocks a work item
    cdef int64_t nchunks = (nblocks + chunk - 1) // chunk, c, b0
    cdef const uint8_t *src = &raw[0, 0]
    cdef float *dst = &out[0, 0]
    cdef int nt = n_threads if rows * cols > MIN_PARALLEL_VALUES else 1
    with nogil:
        if nt > 1:
            for c in prange(nchunks, num_threads=nt, schedule="static"):
                b0 = c * chunk
                f(t, src + b0 * ts, min(b0 + chunk, nblocks) - b0, dst + b0 * bs)
        else:
            f(t, src, nblocks, dst)
    return 0


cdef inline int rows_of_blocks(str who, dequant_blocks_fn f, int t, int bs, const uint8_t[:, ::1] raw,
                               int64_t cols, const int64_t[::1] ids, float[:, ::1] out, int n_threads) except -1:
    """out[i] = dequantized row ids[i] of raw (IndexError for an id outside [0, rows)), over
    the ids on n_threads OpenMP threads (a few ids on one)."""
    cdef int64_t nrows = raw.shape[0], k = ids.shape[0], i
    if out.shape[0] != k or out.shape[1] != cols:
        raise ValueError(f"{who}.get_rows: out {(out.shape[0], out.shape[1])}, expected {(k, cols)}")
    for i in range(k):
        if ids[i] < 0 or ids[i] >= nrows:
            raise IndexError(f"{who}.get_rows: row {ids[i]} out of range [0, {nrows})")
    if k == 0 or cols == 0:
        return 0
    cdef int64_t nb = cols // bs
    cdef int nt = min(n_threads, k) if k > MIN_PARALLEL_ROWS else 1
    with nogil:
        if nt > 1:
            for i in prange(k, num_threads=nt, schedule="static"):
                f(t, &raw[ids[i], 0], nb, &out[i, 0])
        else:
            for i in range(k):
                f(t, &raw[ids[i], 0], nb, &out[i, 0])
    return 0
