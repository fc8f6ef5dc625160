# cython: freethreading_compatible=True
"""Rotary position embedding (ggml_rope, normal and neox pairing, llama3 freq factors).

Called through llmcore/nn.py, which owns the API contract and the thread count; the
per-head functions are in rope.pxd (shared with attention.pyx).
"""
from cython.parallel cimport parallel, prange
from libc.math cimport powf
from libc.stdint cimport int32_t
from libc.stdlib cimport free, malloc

from rope cimport rope_apply, rope_cos_sin


cdef void _rope_row(float *x0p, Py_ssize_t hstride, int n_heads, float p, int n_rot, float theta_scale, float freq_scale,
                    const float *ff, bint neox, float *cs) noexcept nogil:
    """Rotate all heads of one token (cs: scratch for the cos/sin table)."""
    cdef int h
    rope_cos_sin(p, n_rot, theta_scale, freq_scale, ff, cs)
    for h in range(n_heads):
        rope_apply(x0p + h * hstride, n_rot, neox, cs)


def rope(float[:, :, :] x, const int32_t[::1] positions, int n_rot, float base, bint neox,
         float freq_scale, const float[::1] freq_factors=None, int n_threads=1):
    """Rotate the first n_rot values of every head in place.

    x : float32 (n, n_heads, head_dim), last axis contiguous (rows may be strided)
    positions : int32 (n,)
    n_rot : even, <= head_dim; base, freq_scale: angle of pair i at position p is
        p * freq_scale * base^(-2i/n_rot) / freq_factors[i]
    freq_factors : float32 (n_rot / 2,) or None (llama3 rope_freqs)
    n_threads : OpenMP threads (one cos/sin scratch table per thread; small inputs run on one)
    """
    cdef Py_ssize_t n = x.shape[0], i
    if n == 0 or n_rot <= 0:
        return
    cdef float theta_scale = powf(base, -2.0 / n_rot)
    cdef const float *ff = &freq_factors[0] if freq_factors is not None else NULL
    cdef float *cs = NULL
    if x.strides[2] != 4:
        raise ValueError("rope: the last axis must be contiguous")
    cdef Py_ssize_t hs = x.strides[1] // 4
    cdef int nh = <int>x.shape[1]
    if n_threads < 1 or n * x.shape[1] * n_rot < 32768:
        n_threads = 1
    with nogil, parallel(num_threads=n_threads):
        cs = <float *>malloc(n_rot * sizeof(float) + 16)
        for i in prange(n, schedule='static'):
            _rope_row(&x[i, 0, 0], hs, nh, <float>positions[i], n_rot, theta_scale, freq_scale, ff, neox, cs)
        free(cs)


def cos_sin_table(const int32_t[::1] positions, int n_rot, float base, float freq_scale, float[:, ::1] out,
                  int n_threads=1):
    """out[i] = the cos/sin table of position positions[i] (rope.pxd rope_cos_sin: the values
    rope and attention.qkv_post compute per token), for a step whose layers share it.

    positions : int32 (n,); out : float32 (n, n_rot), written
    n_rot, base, freq_scale : as rope (no freq factors)
    n_threads : OpenMP threads (small inputs run on one)
    """
    cdef Py_ssize_t n = positions.shape[0], i
    if out.shape[0] != n or out.shape[1] != n_rot or n_rot <= 0 or n_rot % 2:
        raise ValueError("cos_sin_table: out must be (len(positions), n_rot), n_rot even and > 0")
    if n == 0:
        return
    cdef float theta_scale = powf(base, -2.0 / n_rot)
    if n_threads < 1 or n * n_rot < 32768:
        n_threads = 1
    with nogil:
        for i in prange(n, num_threads=n_threads, schedule='static'):
            rope_cos_sin(<float>positions[i], n_rot, theta_scale, freq_scale, NULL, &out[i, 0])
