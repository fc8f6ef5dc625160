# cython: language_level=3
"""Recurrent-layer kernels: causal depthwise conv1d with a rolling state, Mamba-1 selective
scan, Mamba-2 SSD scan. One sequence per call, a batch of its tokens; states updated in
place. float32 throughout (like ggml's ssm_conv / ssm_scan). OpenMP over channels / rows,
GIL released; each output element is computed by exactly one thread in a fixed order, so
results do not depend on the thread count.

Use llmcore.ssm (it checks shapes and documents the API); these are the raw kernels.
2-D arguments are float32 with a contiguous last axis and any row stride (slices of a
fused projection output work without a copy).
"""
from cython.parallel cimport prange
from libc.math cimport expf, log1pf

cdef extern from "simd_ssm.h" nogil:
    float ssm2_row(float *s, const float *b, const float *c, float dA, float xdt, int n)
    float ssm1_row(float *s, const float *a, const float *b, const float *c, float d, float xdt, int n)

cdef enum:
    CONV_CHUNK = 16     # channels per conv work item


cdef inline float _softplus(float x) noexcept nogil:
    # ggml_softplus
    if x > 20.0:
        return x
    return log1pf(expf(x))


cdef inline float _silu(float x) noexcept nogil:
    return x / (1.0 + expf(-x))


def conv1d(const float[:, :] x,        # IN  (n, C)
           float[:, :] state,          # IN/OUT (K-1, C): previous K-1 inputs, oldest first
           const float[:, :] w,        # IN  (C, K); w[:, K-1] multiplies the current token
           const float[::1] bias,      # IN  (C,) or None
           float[:, :] out,            # OUT (n, C); must not alias x
           bint silu,
           int n_threads):
    cdef Py_ssize_t n = x.shape[0], C = x.shape[1], K = w.shape[1]
    cdef Py_ssize_t km1 = K - 1, nchunks = (C + CONV_CHUNK - 1) // CONV_CHUNK
    cdef Py_ssize_t ch, c, c0, c1, t, k, src
    cdef float acc, b
    cdef bint has_bias = bias is not None
    if n == 0:
        return
    with nogil:
        for ch in prange(nchunks, num_threads=n_threads, schedule="static"):
            c0 = ch * CONV_CHUNK
            c1 = c0 + CONV_CHUNK
            if c1 > C:
                c1 = C
            for c in range(c0, c1):
                b = bias[c] if has_bias else 0.0
                for t in range(n):
                    acc = b
                    # window = inputs t-K+1 .. t; index j < 0 comes from the state
                    for k in range(K):
                        src = t + k - km1
                        if src < 0:
                            acc = acc + state[km1 + src, c] * w[c, k]
                        else:
                            acc = acc + x[src, c] * w[c, k]
                    out[t, c] = _silu(acc) if silu else acc
                # roll the state: keep the last K-1 inputs of (state ++ x)
                if n >= km1:
                    for k in range(km1):
                        state[k, c] = x[n - km1 + k, c]
                else:
                    for k in range(km1 - n):
                        state[k, c] = state[k + n, c]
                    for k in range(n):
                        state[km1 - n + k, c] = x[k, c]


def mamba_scan(float[:, ::1] state,    # IN/OUT (d_inner, d_state)
               const float[:, :] x,    # IN (n, d_inner)
               const float[:, :] dt,   # IN (n, d_inner) before softplus (bias not yet added)
               const float[:, :] A,    # IN (d_inner, d_state) (= -exp(A_log))
               const float[:, :] B,    # IN (n, d_state)
               const float[:, :] Cm,   # IN (n, d_state)
               const float[::1] D,     # IN (d_inner,) or None: y += x * D
               const float[:, :] z,    # IN (n, d_inner) or None: y *= silu(z)
               const float[::1] dt_bias,  # IN (d_inner,) or None: dt += dt_bias
               float[:, :] out,        # OUT (n, d_inner)
               int n_threads):
    cdef Py_ssize_t n = x.shape[0], di = x.shape[1], ds = state.shape[1]
    cdef Py_ssize_t i, t, s
    cdef float d, xdt, acc, v, xv
    cdef bint has_d = D is not None, has_z = z is not None, has_b = dt_bias is not None
    if n == 0:
        return
    with nogil:
        for i in prange(di, num_threads=n_threads, schedule="static"):
            for t in range(n):
                d = dt[t, i]
                if has_b:
                    d = d + dt_bias[i]
                d = _softplus(d)
                xv = x[t, i]
                xdt = xv * d
                acc = ssm1_row(&state[i, 0], &A[i, 0], &B[t, 0], &Cm[t, 0], d, xdt, <int>ds)
                if has_d:
                    acc = acc + xv * D[i]
                if has_z:
                    acc = acc * _silu(z[t, i])
                out[t, i] = acc


def mamba2_scan(float[:, ::1] state,   # IN/OUT (n_head * head_dim, d_state)
                const float[:, :] x,   # IN (n, n_head * head_dim)
                const float[:, :] dt,  # IN (n, n_head) before softplus
                const float[::1] A,    # IN (n_head,)
                const float[:, :] B,   # IN (n, n_group * d_state)
                const float[:, :] Cm,  # IN (n, n_group * d_state)
                const float[::1] D,    # IN (n_head,) or None
                const float[:, :] z,   # IN (n, n_head * head_dim) or None
                const float[::1] dt_bias,  # IN (n_head,) or None
                float[:, :] out,       # OUT (n, n_head * head_dim)
                int n_head, int n_group,
                int n_threads):
    cdef Py_ssize_t n = x.shape[0], rows = x.shape[1], ds = state.shape[1]
    cdef Py_ssize_t hd = rows // n_head, hpg = n_head // n_group
    cdef Py_ssize_t r, h, g, t, s, go
    cdef float d, dA, xdt, acc, v, xv
    cdef bint has_d = D is not None, has_z = z is not None, has_b = dt_bias is not None
    if n == 0:
        return
    with nogil:
        for r in prange(rows, num_threads=n_threads, schedule="static"):
            h = r // hd
            g = h // hpg
            go = g * ds
            for t in range(n):
                d = dt[t, h]
                if has_b:
                    d = d + dt_bias[h]
                d = _softplus(d)
                dA = expf(d * A[h])
                xv = x[t, r]
                xdt = xv * d
                acc = ssm2_row(&state[r, 0], &B[t, go], &Cm[t, go], dA, xdt, <int>ds)
                if has_d:
                    acc = acc + xv * D[h]
                if has_z:
                    acc = acc * _silu(z[t, r])
                out[t, r] = acc
