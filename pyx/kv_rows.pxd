# KV row formats, shared by kv_rows.pyx (store / load) and attention.pyx (which reads and
# writes rows in place). A row is one (token, kv head) of head_dim values.
from libc.stdint cimport uint8_t, uint16_t
from libc.string cimport memcpy

from simd cimport simd_f16_to_f32_row, simd_f32_to_f16_row

cdef extern from "simd_kv_rows.h" nogil:
    void kv_quantize_q8_0(const float *x, uint8_t *y, int n)
    void kv_quantize_q4_0(const float *x, uint8_t *y, int n)
    void kv_dequant_q8_0(const uint8_t *x, float *y, int n)
    void kv_dequant_q4_0(const uint8_t *x, float *y, int n)
    int kv_tiles_ok(int is_q4_0, int block_size, int head_dim)
    void kv_tile_load_q4_0(const uint8_t *block, int t, int h, int KVH, int nb, float *y)
    void kv_tile_store_q4_0(const float *x, uint8_t *block, int t, int h, int KVH, int nb)

# storage type codes (llmcore/nn.py maps the contract's strings to these)
cdef enum:
    T_F32 = 0
    T_F16 = 1
    T_Q8_0 = 2
    T_Q4_0 = 3
    # a Q4_0 K pool in 16-slot tiles (simd_kv_rows.h): stores and loads by (block, slot, head)
    T_Q4_0_TILES = 4


cdef inline void load_row(const uint8_t *src, int kv_type, float *y, int n) noexcept nogil:
    """y (n,) = the row at src, dequantized."""
    if kv_type == T_F16:
        simd_f16_to_f32_row(<const uint16_t *>src, y, n)
    elif kv_type == T_Q8_0:
        kv_dequant_q8_0(src, y, n)
    elif kv_type == T_Q4_0:
        kv_dequant_q4_0(src, y, n)
    else:
        memcpy(y, src, n * sizeof(float))


cdef inline void store_row(const float *x, int kv_type, uint8_t *dst, int n) noexcept nogil:
    """The row at dst = x (n,), quantized."""
    if kv_type == T_F16:
        simd_f32_to_f16_row(x, <uint16_t *>dst, n)
    elif kv_type == T_Q8_0:
        kv_quantize_q8_0(x, dst, n)
    elif kv_type == T_Q4_0:
        kv_quantize_q4_0(x, dst, n)
    else:
        memcpy(dst, x, n * sizeof(float))


cdef inline void store_slot(const float *x, int kv_type, uint8_t *block, int t, int h, int KVH, int row_nbytes,
                            int n) noexcept nogil:
    """Slot t, kv head h of a block (rows, or tiles for T_Q4_0_TILES) = x (n,), quantized."""
    if kv_type == T_Q4_0_TILES:
        kv_tile_store_q4_0(x, block, t, h, KVH, n // 32)
    else:
        store_row(x, kv_type, block + (t * KVH + h) * row_nbytes, n)


cdef inline void load_slot(const uint8_t *block, int kv_type, int t, int h, int KVH, int row_nbytes, float *y,
                           int n) noexcept nogil:
    """y (n,) = slot t, kv head h of a block, dequantized."""
    if kv_type == T_Q4_0_TILES:
        kv_tile_load_q4_0(block, t, h, KVH, n // 32, y)
    else:
        load_row(block + (t * KVH + h) * row_nbytes, kv_type, y, n)
