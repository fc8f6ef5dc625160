# The AMX-BF16 prefill paths' C entry points (simd_amx_bf16.h) and their switch, shared by the
# modules that compile the header (quants, kquants: matmuls; attention, step: prompt tiles).
# Each module has its own copy of the header's state, so each asks at its import.
from libc.stdint cimport int64_t, uint16_t

cdef extern from "simd_amx_bf16.h" nogil:
    int ab_init(int enable)
    void ab_set_min_tokens(int n)
    int64_t ab_steps(int64_t K)
    size_t ab_act_bytes(int64_t n, int64_t K)
    uint16_t *ab_act_buffer(size_t nbytes)
    void ab_pack_act_tile(const float *x, int64_t K, int nt, uint16_t *dst)


cdef inline bint ab_env_on():
    """Whether the environment leaves the AMX-BF16 paths on: LLMCORE_NO_AMX_BF16=1 turns them
    off, LLMCORE_NO_AMX=1 every AMX path."""
    import os
    return os.environ.get("LLMCORE_NO_AMX") != "1" and os.environ.get("LLMCORE_NO_AMX_BF16") != "1"
