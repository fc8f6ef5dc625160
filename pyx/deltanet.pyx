# cython: language_level=3
"""Gated DeltaNet (Qwen3.5 / Qwen3.6 / Qwen3-Next linear-attention layers): the whole layer
between its input projections and its output projection, for every sequence of a batched
step in one call.

    gated_delta_net(qkv, z, beta, alpha, dt_bias, ssm_a, conv_w, norm_w, head_map,
                    conv_states, ssm_states, seg_start, eps, out, n_threads)

Shapes (N tokens of S sequences; n_qk q/k heads, n_v value heads, head dim D for q, k and v;
C = 2*n_qk*D + n_v*D conv channels, K conv taps):

- ``qkv``     float32 (N, C), IN: the fused projection before the conv, channels
              [q (n_qk*D) | k (n_qk*D) | v (n_v*D)], head-major; last axis contiguous.
- ``z``       float32 (N, n_v*D), IN: the output gate (before SiLU).
- ``beta``    float32 (N, n_v), IN: before the sigmoid.
- ``alpha``   float32 (N, n_v), IN: before the dt bias and the softplus.
- ``dt_bias`` (n_v,), ``ssm_a`` (n_v,) (= -exp(A_log)), ``conv_w`` (K, C) (the GGUF
  ``ssm_conv1d.weight`` transposed: tap k, channel c; tap K-1 multiplies the current token),
  ``norm_w`` (D,) (``ssm_norm``, shared by the heads), ``head_map`` int32 (n_v,): the q/k head
  each value head reads.
- ``conv_states``: list of S float32 C-contiguous arrays (K-1, C), the previous K-1 inputs of
  each sequence, oldest first; ``ssm_states``: list of S float32 C-contiguous arrays
  (n_v, D, D): per value head, row i (value dim) over the D key dims. Both updated in place.
- ``seg_start`` int32 (S+1,): rows seg_start[s]:seg_start[s+1] are sequence s's tokens.
- ``out`` float32 (N, n_v*D) C-contiguous, OUT (must not alias the inputs).

Per sequence and token t, per value head h reading q/k head m = head_map[h]:

    xc = silu(conv(state ++ qkv));   q, k = l2norm(xc's q_m, k_m) (eps), q /= sqrt(D)
    g = exp(ssm_a[h] * softplus(alpha + dt_bias[h])),  b = sigmoid(beta)
    M_h <- g M_h;  d = b (v - M_h k);  M_h <- M_h + d k^T;  o = M_h q      (M_h = the D x D state)
    out = rms_norm(o) * norm_w * silu(z)

All float32 (state included). One parallel region: conv (items: sequence x up to 64
channels), q/k norms and gates (items: tokens), the recurrence (items: sequence x value head
x 32 state rows; each item walks its sequence's tokens with its rows hot in L1, reading q, k
and v from a head-major copy), the gated norm (items: tokens). Every output element is computed by one thread in a fixed order: results
do not depend on the thread count, and splitting a sequence's tokens over several calls
gives the same result as one call. The GIL is released while the kernel runs.
"""
from cython.parallel cimport parallel, prange
from libc.math cimport expf, log1pf, sqrtf
from libc.stdint cimport int32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memmove
cimport cython
cimport numpy as cnp

cnp.import_array()

cdef extern from "simd_deltanet.h" nogil:
    void gdn_rows(float *s, const float *k, const float *q, const float *v, float g, float beta,
                  float *o, int n, int S)
    void conv_row(float *y, const float *const *src, const float *w, long C, int K, int n)
    float dn_sum_sq(const float *x, int n)
    void dn_silu_inplace(float *y, int n)
    void dn_gated_norm(const float *o, const float *z, const float *w, float *y, int n, float eps)

cdef enum:
    CONV_CHUNK = 64   # channels per conv work item, at most (a divisor of the head dim)
    ROW_BLOCK = 32    # state rows per recurrence work item
    MAX_TAPS = 16


cdef inline float _softplus(float x) noexcept nogil:
    if x > 20.0:
        return x
    return log1pf(expf(x))


cdef inline float _sigmoid(float x) noexcept nogil:
    return 1.0 / (1.0 + expf(-x))


cdef int _pointers(list arrays, Py_ssize_t n_want, Py_ssize_t size, float **ptrs, str name) except -1:
    """Data pointers of `arrays` (float32, C-contiguous, `size` elements each)."""
    cdef Py_ssize_t i
    cdef cnp.ndarray a
    if len(arrays) != n_want:
        raise ValueError(f"gated_delta_net: {name}: {len(arrays)} arrays for {n_want} sequences")
    for i in range(n_want):
        a = arrays[i]
        if (cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(a)
                or cnp.PyArray_SIZE(a) != size or not cnp.PyArray_ISWRITEABLE(a)):
            raise ValueError(f"gated_delta_net: {name}[{i}] must be a writeable C-contiguous "
                             f"float32 array of {size} values")
        ptrs[i] = <float *>cnp.PyArray_DATA(a)
    return 0


cdef void _conv_item(const float *qkv, Py_ssize_t ldq, float *state, const float *w, float *y,
                     Py_ssize_t C, int K, Py_ssize_t r0, Py_ssize_t n, Py_ssize_t c0, int nc, int D) noexcept nogil:
    """Conv + SiLU of channels c0:c0+nc (inside one head) of one sequence's n tokens (rows
    r0..), written to y[t * D] (the head-major buffer at this head, token r0 and offset c0 % D);
    then its conv state rolled to the last K-1 inputs."""
    cdef const float *src[MAX_TAPS]
    cdef Py_ssize_t t, j
    cdef int k, km1 = K - 1
    for t in range(n):
        for k in range(K):
            j = t + k - km1  # input index of tap k; < 0: from the state
            if j < 0:
                src[k] = state + (km1 + j) * C + c0
            else:
                src[k] = qkv + (r0 + j) * ldq + c0
        conv_row(y + t * D, src, w + c0, C, K, nc)
        dn_silu_inplace(y + t * D, nc)
    if km1 == 0:
        return
    if n >= km1:
        for k in range(km1):
            memcpy(state + k * C + c0, qkv + (r0 + n - km1 + k) * ldq + c0, nc * sizeof(float))
    else:
        for k in range(km1 - n):
            memcpy(state + k * C + c0, state + (k + n) * C + c0, nc * sizeof(float))
        for k in range(n):
            memcpy(state + (km1 - n + k) * C + c0, qkv + (r0 + k) * ldq + c0, nc * sizeof(float))


@cython.boundscheck(False)
@cython.wraparound(False)
def gated_delta_net(const float[:, :] qkv, const float[:, :] z, const float[:, :] beta,
                    const float[:, :] alpha, const float[::1] dt_bias, const float[::1] ssm_a,
                    const float[:, ::1] conv_w, const float[::1] norm_w,
                    const int32_t[::1] head_map, list conv_states, list ssm_states,
                    const int32_t[::1] seg_start, float eps, float[:, ::1] out, int n_threads=1):
    cdef Py_ssize_t N = qkv.shape[0], C = qkv.shape[1]
    cdef int n_v = <int>dt_bias.shape[0], K = <int>conv_w.shape[0]
    cdef int D = <int>norm_w.shape[0]
    cdef Py_ssize_t VD = <Py_ssize_t>n_v * D
    cdef int n_qk = <int>((C - VD) // (2 * D)) if D > 0 else 0
    cdef Py_ssize_t n_seq = seg_start.shape[0] - 1
    cdef Py_ssize_t i, s
    if N == 0:
        return
    if D <= 0 or n_v <= 0 or n_qk <= 0 or C != 2 * n_qk * D + VD:
        raise ValueError("gated_delta_net: qkv must have 2*n_qk*D + n_v*D channels")
    if K < 1 or K > MAX_TAPS or conv_w.shape[1] != C:
        raise ValueError(f"gated_delta_net: conv_w must be (K <= {MAX_TAPS}, {C})")
    if (z.shape[0] != N or z.shape[1] != VD or beta.shape[0] != N or beta.shape[1] != n_v
            or alpha.shape[0] != N or alpha.shape[1] != n_v or ssm_a.shape[0] != n_v
            or head_map.shape[0] != n_v or out.shape[0] != N or out.shape[1] != VD):
        raise ValueError("gated_delta_net: z / beta / alpha / ssm_a / head_map / out shapes do not match")
    if (qkv.strides[1] != 4 or z.strides[1] != 4 or (n_v > 1 and (beta.strides[1] != 4
                                                                  or alpha.strides[1] != 4))):
        raise ValueError("gated_delta_net: inputs need a contiguous last axis")
    for i in range(n_v):
        if head_map[i] < 0 or head_map[i] >= n_qk:
            raise ValueError("gated_delta_net: head_map entry out of range")
    if n_seq < 1 or seg_start[0] != 0 or seg_start[n_seq] != N:
        raise ValueError("gated_delta_net: seg_start does not cover the tokens")
    for s in range(n_seq):
        if seg_start[s + 1] < seg_start[s]:
            raise ValueError("gated_delta_net: seg_start must be non-decreasing")

    # scratch, head-major so that a recurrence item reads its head's tokens contiguously:
    # xh (2*n_qk + n_v heads, N, D) the conv outputs [q heads | k heads | v heads], oh (n_v, N, D)
    cdef float **conv_p = <float **>malloc(n_seq * sizeof(float *))
    cdef float **ssm_p = <float **>malloc(n_seq * sizeof(float *))
    cdef float *xh = <float *>malloc(N * C * sizeof(float))
    cdef float *oh = <float *>malloc(N * VD * sizeof(float))
    cdef float *gb = <float *>malloc(N * 2 * n_v * sizeof(float))  # per token: g (n_v), beta (n_v)
    if conv_p == NULL or ssm_p == NULL or xh == NULL or oh == NULL or gb == NULL:
        free(conv_p); free(ssm_p); free(xh); free(oh); free(gb)
        raise MemoryError()
    try:
        _pointers(conv_states, n_seq, (K - 1) * C, conv_p, "conv_states")
        _pointers(ssm_states, n_seq, VD * D, ssm_p, "ssm_states")
    except Exception:
        free(conv_p); free(ssm_p); free(xh); free(oh); free(gb)
        raise

    cdef int cw = D  # conv chunk: a divisor of D, at most CONV_CHUNK when D allows
    while cw > CONV_CHUNK and cw % 2 == 0:
        cw = cw // 2
    cdef Py_ssize_t n_cchunk = C // cw
    cdef int n_rblock = (D + ROW_BLOCK - 1) // ROW_BLOCK
    cdef Py_ssize_t n_conv_items = n_seq * n_cchunk
    cdef Py_ssize_t n_rec_items = n_seq * n_v * n_rblock
    cdef Py_ssize_t ldq = qkv.strides[0] // 4, ldz = z.strides[0] // 4
    cdef Py_ssize_t ldb = beta.strides[0] // 4, lda = alpha.strides[0] // 4
    cdef Py_ssize_t HS = N * D  # stride between heads in xh / oh
    cdef const float *qkv_p = &qkv[0, 0]
    cdef const float *z_p = &z[0, 0]
    cdef const float *b_p = &beta[0, 0]
    cdef const float *a_p = &alpha[0, 0]
    cdef const float *w_p = &conv_w[0, 0]
    cdef const float *nw = &norm_w[0]
    cdef float *o_p = &out[0, 0]
    cdef float q_scale = 1.0 / sqrtf(<float>D)
    cdef Py_ssize_t it, r0, t, c0, hq
    cdef int h, m, rb, i0, nr, j
    cdef float *x
    cdef float *st
    cdef const float *qh
    cdef const float *kh
    cdef const float *vh
    cdef float *ohh
    cdef float nrm, sc
    with nogil, parallel(num_threads=n_threads):
        # 1. causal conv + SiLU over [q | k | v] into xh, conv states rolled
        for it in prange(n_conv_items, schedule='static'):
            s = it // n_cchunk
            c0 = (it % n_cchunk) * cw
            r0 = seg_start[s]
            _conv_item(qkv_p, ldq, conv_p[s], w_p, xh + (c0 // D) * HS + r0 * D + c0 % D, C, K, r0,
                       seg_start[s + 1] - r0, c0, cw, D)
        # 2. per token: L2-normalised q (scaled) and k per q/k head; decay and beta per value head
        for t in prange(N, schedule='static'):
            for m in range(2 * n_qk):
                x = xh + m * HS + t * D
                nrm = sqrtf(dn_sum_sq(x, D))
                sc = 1.0 / (nrm if nrm > eps else eps)
                if m < n_qk:
                    sc = sc * q_scale
                for j in range(D):
                    x[j] = x[j] * sc
            for h in range(n_v):
                gb[t * 2 * n_v + h] = expf(ssm_a[h] * _softplus(a_p[t * lda + h] + dt_bias[h]))
                gb[t * 2 * n_v + n_v + h] = _sigmoid(b_p[t * ldb + h])
        # 3. the delta rule: each item walks its sequence's tokens over ROW_BLOCK rows of one head
        for it in prange(n_rec_items, schedule='dynamic'):
            s = it // (n_v * n_rblock)
            h = <int>((it // n_rblock) % n_v)
            rb = <int>(it % n_rblock)
            i0 = rb * ROW_BLOCK
            nr = D - i0 if D - i0 < ROW_BLOCK else ROW_BLOCK
            hq = head_map[h]
            st = ssm_p[s] + (<Py_ssize_t>h * D + i0) * D
            qh = xh + hq * HS
            kh = xh + (n_qk + hq) * HS
            vh = xh + (2 * n_qk + h) * HS + i0
            ohh = oh + h * HS + i0
            for t in range(seg_start[s], seg_start[s + 1]):
                gdn_rows(st, kh + t * D, qh + t * D, vh + t * D, gb[t * 2 * n_v + h], gb[t * 2 * n_v + n_v + h],
                         ohh + t * D, nr, D)
        # 4. gated RMS norm per value head: rms_norm(o) * norm_w * silu(z), into out (token-major)
        for t in prange(N, schedule='static'):
            for h in range(n_v):
                dn_gated_norm(oh + h * HS + t * D, z_p + t * ldz + <Py_ssize_t>h * D, nw,
                              o_p + t * VD + <Py_ssize_t>h * D, D, eps)
    free(conv_p)
    free(ssm_p)
    free(xh)
    free(oh)
    free(gb)
