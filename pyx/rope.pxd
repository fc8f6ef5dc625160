# Row functions of rope.pyx, inlined into every module that cimports them (attention.pyx
# rotates q and k with one cos/sin table per position, the arithmetic of rope).
from libc.math cimport cosf, sinf


cdef inline void rope_cos_sin(float p, int n_rot, float theta_scale, float freq_scale,
                              const float *ff, float *cs) noexcept nogil:
    """cos/sin table (n_rot,) of one position. Angles follow ggml_rope_cache_init: theta is
    p * theta_scale^i built by repeated float multiplication, divided by freq_factors[i]
    (ff, or NULL)."""
    cdef int i
    cdef float theta = p, t
    for i in range(n_rot // 2):
        t = theta / ff[i] if ff != NULL else theta
        t = t * freq_scale
        cs[2 * i] = cosf(t)
        cs[2 * i + 1] = sinf(t)
        theta = theta * theta_scale


cdef inline void rope_apply(float *xh, int n_rot, bint neox, const float *cs) noexcept nogil:
    """Rotate the first n_rot values of one head: pairs (i, i + n_rot/2) when neox, else
    (2i, 2i+1)."""
    cdef int half = n_rot // 2, i
    cdef float c, s, x0, x1
    if neox:
        for i in range(half):
            c = cs[2 * i]
            s = cs[2 * i + 1]
            x0 = xh[i]
            x1 = xh[i + half]
            xh[i] = x0 * c - x1 * s
            xh[i + half] = x0 * s + x1 * c
    else:
        for i in range(half):
            c = cs[2 * i]
            s = cs[2 * i + 1]
            x0 = xh[2 * i]
            x1 = xh[2 * i + 1]
            xh[2 * i] = x0 * c - x1 * s
            xh[2 * i + 1] = x0 * s + x1 * c
