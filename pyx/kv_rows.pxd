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

# storage type codes (llmcore/nn.py maps the contract's strings to these)
cdef enum:
    T_F32 = 0
    T_F16 = 1
    T_Q8_0 = 2
    T_Q4_0 = 3


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
