# cython: freethreading_compatible=True
"""KV cache rows: store (quantizing) and load (dequantizing) the rows of block pools.

A pool is passed as bytes, shape (n_blocks, block_size * n_kv_heads * row_nbytes), so one
kernel serves every storage type: row (token t of a block, kv head h) of block b starts at
byte (t * n_kv_heads + h) * row_nbytes of pool[b]. The row formats (f32, f16, ggml Q8_0 and
Q4_0, byte-identical to ggml) are in kv_rows.pxd. Called through llmcore/nn.py, which owns
the API contract, the argument checks and the thread count.
"""
from cython.parallel cimport prange
from libc.stdint cimport int32_t, uint8_t
from libc.stdlib cimport free, malloc

from kv_rows cimport T_F16, T_F32, T_Q4_0, T_Q4_0_TILES, T_Q8_0, load_slot, store_slot

F32, F16, Q8_0, Q4_0, Q4_0_TILES = T_F32, T_F16, T_Q8_0, T_Q4_0, T_Q4_0_TILES


def kv_store(uint8_t[:, ::1] pool, int kv_type, int block_size, int n_kv_heads, int row_nbytes,
             const int32_t[:, ::1] block_tables, const int32_t[::1] seg_start,
             const int32_t[::1] positions, const float[:, :, ::1] values, int n_threads=1):
    """Write each token's rows into its block slot; returns the number of tokens whose
    position maps to no block (block id out of range or negative: nothing written for them).

    pool : uint8 (n_blocks, block_size * n_kv_heads * row_nbytes), updated in place
    kv_type : F32, F16, Q8_0 or Q4_0, or Q4_0_TILES (a K pool of 16-slot tiles: block_size % 16 == 0)
    block_tables : int32 (S, max_blocks); sequence s keeps position p in block
        block_tables[s, p // block_size], slot p % block_size
    seg_start : int32 (S + 1,): rows seg_start[s]:seg_start[s+1] belong to sequence s
    positions : int32 (n,)
    values : float32 (n, n_kv_heads, head_dim)
    n_threads : OpenMP threads over tokens (small inputs run on one)
    """
    cdef Py_ssize_t n = values.shape[0], i
    cdef int D = <int>values.shape[2], h, p, blk, s, bad = 0
    cdef int S = <int>seg_start.shape[0] - 1
    cdef int nb_seq = <int>block_tables.shape[1], nb = <int>pool.shape[0]
    if n == 0 or S <= 0:
        return 0
    if n_threads < 1 or n * n_kv_heads * D < 65536:
        n_threads = 1
    cdef int32_t *row_seq = <int32_t *>malloc(n * sizeof(int32_t))
    if row_seq == NULL:
        raise MemoryError()
    cdef Py_ssize_t r
    for s in range(S):
        for r in range(max(seg_start[s], 0), min(seg_start[s + 1], n)):
            row_seq[r] = s
    with nogil:
        for i in prange(n, num_threads=n_threads, schedule='static'):
            p = positions[i]
            s = row_seq[i]
            blk = block_tables[s, p // block_size] if 0 <= p < nb_seq * block_size else -1
            if blk < 0 or blk >= nb:
                bad += 1
                continue
            for h in range(n_kv_heads):
                store_slot(&values[i, h, 0], kv_type, &pool[blk, 0], p % block_size, h, n_kv_heads, row_nbytes, D)
    free(row_seq)
    return bad


def kv_load(const uint8_t[:, ::1] pool, int kv_type, int block_size, int n_kv_heads, int row_nbytes,
            const int32_t[::1] block_table, float[:, :, ::1] out):
    """Dequantize the first n tokens of one sequence (blocks with id < 0 read as zeros).

    pool : uint8 (n_blocks, block_size * n_kv_heads * row_nbytes)
    block_table : int32 (n_blocks_seq,), ids checked by the caller
    out : float32 (n, n_kv_heads, head_dim): tokens 0..n-1
    """
    cdef Py_ssize_t n = out.shape[0], i
    cdef int D = <int>out.shape[2], h, j, blk
    with nogil:
        for i in range(n):
            blk = block_table[i // block_size]
            for h in range(n_kv_heads):
                if blk < 0:
                    for j in range(D):
                        out[i, h, j] = 0.0
                else:
                    load_slot(&pool[blk, 0], kv_type, i % block_size, h, n_kv_heads, row_nbytes, &out[i, h, 0], D)
