# cython: language_level=3
"""Gated DeltaNet (Qwen3.5 / Qwen3.6 / Qwen3-Next linear-attention layers): the whole layer
between its input projections and its output projection, for every sequence of a batched
step in one call.

    gated_delta_net(qkv, z, beta, alpha, dt_bias, ssm_a, conv_w, norm_w, head_map,
                    conv_states, ssm_states, seg_start, eps, out, n_threads, seg_pos=None)

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
- ``seg_pos`` int32 (S,) or None: the position in its sequence of each segment's first token
  (None: 0 for all), which fixes where the chunks of the chunked form start (below).
- ``out`` float32 (N, n_v*D) C-contiguous, OUT (must not alias the inputs).

Per sequence and token t, per value head h reading q/k head m = head_map[h]:

    xc = silu(conv(state ++ qkv));   q, k = l2norm(xc's q_m, k_m) (eps), q /= sqrt(D)
    g = exp(ssm_a[h] * softplus(alpha + dt_bias[h])),  b = sigmoid(beta)
    M_h <- g M_h;  d = b (v - M_h k);  M_h <- M_h + d k^T;  o = M_h q      (M_h = the D x D state)
    out = rms_norm(o) * norm_w * silu(z)

All float32 (state included). One parallel region: conv, q/k norms and gates (items:
tokens, each reading its rows of qkv whole), the conv states rolled (items: sequences), the
recurrence, the gated norm (items: tokens). The recurrence runs in two forms. Token by
token (decode, short segments): items sequence x value head x 32 state rows, each walking
its sequence's tokens with its rows hot in L1, reading q, k and v from a head-major copy.
Chunked (prefill): a sequence's positions are cut into chunks of GDN_CHUNK (64) at
multiples of 64 from position 0; the part of a chunk a segment holds runs as small matrix
products (simd_deltanet.h, gdn_chunk_group) when it has at least ``chunk_min_tokens()``
tokens, token by token otherwise; items: sequence x q/k head (its value heads share k.k and
q.k). Every output element is computed by one thread in a fixed order: results do not
depend on the thread count or on the other sequences of the call; splitting a sequence's
tokens over several calls at multiples of 64 gives the same bits as one call, elsewhere the
same values to float rounding (a chunk cut in two is two chunks). The GIL is released while
the kernel runs.
"""
from cython.parallel cimport parallel, prange
from libc.math cimport expf, log1pf, sqrtf
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memmove
cimport cython
cimport numpy as cnp
from simd cimport simd_alloc
import numpy as np

cnp.import_array()

cdef extern from "simd_deltanet.h" nogil:
    void gdn_rows(float *s, const float *k, const float *q, const float *v, float g, float beta,
                  float *o, int n, int S)
    void conv_silu_row(float *y, const float *const *src, const float *w, long C, int K, int n)
    float dn_sum_sq(const float *x, int n)
    void dn_gated_norm(const float *o, const float *z, const float *w, float *y, int n, float eps)
    int GDN_CHUNK
    long gdn_chunk_scratch(int D)
    void gdn_prefetch(const void *p, long nbytes)
    void gdn_transpose(const float *src, long lds, float *dst, long ldd, int rows, int cols)
    void gdn_chunk_group(int nh, float **ST, const float *k, const float *q, const float **v, long ld,
                         const float **lg, const float **beta, long ldg, float **o, long ldo,
                         int L, int D, float *w)

cdef enum:
    ROW_BLOCK = 32    # state rows per recurrence work item
    MAX_TAPS = 16


cdef int _chunk_min = 16  # fewest tokens of a chunk that run in the chunked form


def chunk_min_tokens():
    """The fewest tokens of a chunk (the part of a 64-token chunk one call holds) that run in
    the chunked form; fewer run token by token."""
    return _chunk_min


def set_chunk_min_tokens(int n):
    """Tests and benchmarks: the fewest tokens of a chunk run in the chunked form (at most
    GDN_CHUNK; 0 or more than GDN_CHUNK: never, token by token only). Returns the old value."""
    global _chunk_min
    old = _chunk_min
    _chunk_min = n
    return old


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


cdef void _conv_token(const float *qkv, Py_ssize_t ldq, const float *state, const float *w, float *xh,
                      Py_ssize_t HS, Py_ssize_t C, int K, Py_ssize_t r0, Py_ssize_t t, int D) noexcept nogil:
    """Conv + SiLU of every channel of token row t (its sequence's rows start at r0; the K-1
    inputs before r0 are the conv state), written head by head to xh[head][t] (head-major)."""
    cdef const float *src[MAX_TAPS]
    cdef const float *sh[MAX_TAPS]
    cdef Py_ssize_t j, hd
    cdef int k, km1 = K - 1
    for k in range(K):
        j = t - r0 + k - km1  # input index of tap k; < 0: from the state
        src[k] = state + (km1 + j) * C if j < 0 else qkv + (r0 + j) * ldq
    for hd in range(C // D):
        for k in range(K):
            sh[k] = src[k] + hd * D
        conv_silu_row(xh + hd * HS + t * D, sh, w + hd * D, C, K, D)


cdef void _roll_state(const float *qkv, Py_ssize_t ldq, float *state, Py_ssize_t C, int K, Py_ssize_t r0,
                      Py_ssize_t n) noexcept nogil:
    """The conv state after a sequence's n input rows (r0..): its last K-1 inputs."""
    cdef int k, km1 = K - 1
    if km1 == 0 or n == 0:
        return
    if n >= km1:
        for k in range(km1):
            memcpy(state + k * C, qkv + (r0 + n - km1 + k) * ldq, C * sizeof(float))
    else:
        memmove(state, state + n * C, (km1 - n) * C * sizeof(float))
        for k in range(n):
            memcpy(state + (km1 - n + k) * C, qkv + (r0 + k) * ldq, C * sizeof(float))


cdef void _rec_rows(float *state, int h, int rb, int D, const float *kh, const float *qh, const float *vh,
                    float *ohh, const float *gb, int n_v, Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """Tokens t0..t1 of the delta rule token by token over rows rb*ROW_BLOCK.. of value head h
    (state: the sequence's (n_v, D, D); kh, qh, vh, ohh: the head-major rows of this head)."""
    cdef int i0 = rb * ROW_BLOCK
    cdef int nr = D - i0 if D - i0 < ROW_BLOCK else ROW_BLOCK
    cdef float *st = state + (<Py_ssize_t>h * D + i0) * D
    cdef Py_ssize_t t
    if t1 - t0 <= 2:  # decode: the next row block (the next item's, in memory order) streams in meanwhile
        gdn_prefetch(st + nr * D, nr * D * sizeof(float))
    for t in range(t0, t1):
        gdn_rows(st, kh + t * D, qh + t * D, vh + t * D + i0, expf(gb[t * 2 * n_v + h]), gb[t * 2 * n_v + n_v + h],
                 ohh + t * D + i0, nr, D)


cdef void _rec_group(float *state, const int32_t *hs, int nh, int m, int n_qk, int n_v, int D, int n_rblock,
                     float *xh, float *oh, const float *gb, Py_ssize_t HS, Py_ssize_t q0, Py_ssize_t q1,
                     Py_ssize_t p0, int cmin, float *wbuf, void **ptrs) noexcept nogil:
    """Tokens q0..q1 (positions p0..) of the nh value heads hs[:nh] that read q/k head m: the
    chunks of at least cmin tokens in the chunked form (on the heads' states transposed, in
    wbuf after the chunk scratch), the others token by token. ptrs: 5 * (nh + 1) pointers."""
    cdef const float *qh = xh + m * HS
    cdef const float *kh = xh + (n_qk + m) * HS
    cdef float **stp = <float **>ptrs
    cdef const float **vp = <const float **>(ptrs + nh)
    cdef const float **lgp = <const float **>(ptrs + 2 * nh)
    cdef const float **bp = <const float **>(ptrs + 3 * nh)
    cdef float **op = <float **>(ptrs + 4 * nh)
    cdef float *st0 = wbuf + gdn_chunk_scratch(D) if wbuf != NULL else NULL
    cdef Py_ssize_t DD = <Py_ssize_t>D * D, tb = q0, te, pos
    cdef int i, h, rb, ldg = 2 * n_v
    cdef bint transposed = False
    while tb < q1:
        pos = p0 + tb - q0
        te = min(q1, tb + (pos // GDN_CHUNK + 1) * GDN_CHUNK - pos)
        if te - tb >= cmin and st0 != NULL:
            for i in range(nh):
                h = hs[i]
                stp[i] = st0 + i * DD
                if not transposed:
                    gdn_transpose(state + h * DD, D, stp[i], D, D, D)
                vp[i] = xh + (2 * n_qk + h) * HS + tb * D
                lgp[i] = gb + tb * ldg + h
                bp[i] = gb + tb * ldg + n_v + h
                op[i] = oh + h * HS + tb * D
            transposed = True
            gdn_chunk_group(nh, stp, kh + tb * D, qh + tb * D, vp, D, lgp, bp, ldg, op, D, <int>(te - tb), D, wbuf)
        else:
            if transposed:
                for i in range(nh):
                    gdn_transpose(st0 + i * DD, D, state + hs[i] * DD, D, D, D)
                transposed = False
            for i in range(nh):
                for rb in range(n_rblock):
                    _rec_rows(state, hs[i], rb, D, kh, qh, xh + (2 * n_qk + hs[i]) * HS, oh + hs[i] * HS, gb, n_v,
                              tb, te)
        tb = te
    if transposed:
        for i in range(nh):
            gdn_transpose(st0 + i * DD, D, state + hs[i] * DD, D, D, D)


@cython.boundscheck(False)
@cython.wraparound(False)
def gated_delta_net(const float[:, :] qkv, const float[:, :] z, const float[:, :] beta,
                    const float[:, :] alpha, const float[::1] dt_bias, const float[::1] ssm_a,
                    const float[:, ::1] conv_w, const float[::1] norm_w,
                    const int32_t[::1] head_map, list conv_states, list ssm_states,
                    const int32_t[::1] seg_start, float eps, float[:, ::1] out, int n_threads=1,
                    seg_pos=None):
    cdef Py_ssize_t N = qkv.shape[0], C = qkv.shape[1]
    cdef int n_v = <int>dt_bias.shape[0], K = <int>conv_w.shape[0]
    cdef int D = <int>norm_w.shape[0]
    cdef Py_ssize_t VD = <Py_ssize_t>n_v * D
    cdef int n_qk = <int>((C - VD) // (2 * D)) if D > 0 else 0
    cdef Py_ssize_t n_seq = seg_start.shape[0] - 1
    cdef Py_ssize_t i, s, it, r0, t, c0, hq
    cdef int h, m, rb, i0, nr, j
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
    pos_arr = np.zeros(n_seq, np.int64)
    if seg_pos is not None:
        sp = np.asarray(seg_pos, np.int64).reshape(-1)
        if sp.shape[0] != n_seq or sp.min() < 0:
            raise ValueError("gated_delta_net: seg_pos must hold one non-negative position per sequence")
        pos_arr[:] = sp
    cdef const int64_t[::1] pos = pos_arr

    cdef int n_rblock = (D + ROW_BLOCK - 1) // ROW_BLOCK
    # recurrence items: (sequence, value head, row block) token by token, or (sequence, value
    # head, -1) for a sequence with a chunk in the chunked form (whole heads), those first
    cdef int cmin = _chunk_min if 0 < _chunk_min <= GDN_CHUNK else GDN_CHUNK + 1
    cdef Py_ssize_t p0, p1, a, nchunked = 0
    chunked_arr = np.zeros(n_seq, np.uint8)
    cdef uint8_t[::1] chunked = chunked_arr
    for s in range(n_seq):
        p0 = pos[s]
        p1 = p0 + seg_start[s + 1] - seg_start[s]
        while p0 < p1:
            a = min(p1, (p0 // GDN_CHUNK + 1) * GDN_CHUNK)
            if a - p0 >= cmin:
                chunked[s] = 1
                nchunked += 1
                break
            p0 = a
    # the value heads of each q/k head: heads[m, :cnt[m]]
    heads_arr = np.zeros((n_qk, n_v), np.int32)
    cnt_arr = np.zeros(n_qk, np.int32)
    cdef int32_t[:, ::1] heads = heads_arr
    cdef int32_t[::1] cnt = cnt_arr
    for h in range(n_v):
        m = head_map[h]
        heads[m, cnt[m]] = h
        cnt[m] += 1
    cdef int nhmax = int(cnt_arr.max())
    cdef Py_ssize_t n_groups = int((cnt_arr > 0).sum())
    cdef Py_ssize_t n_rec_items = nchunked * n_groups + (n_seq - nchunked) * n_v * n_rblock
    items_arr = np.empty((n_rec_items, 3), np.int32)
    cdef int32_t[:, ::1] items = items_arr
    it = 0
    for s in range(n_seq):
        if chunked[s]:
            for m in range(n_qk):
                if cnt[m]:
                    items[it, 0] = <int32_t>s
                    items[it, 1] = m
                    items[it, 2] = -1
                    it += 1
    for s in range(n_seq):
        if not chunked[s]:
            for h in range(n_v):
                for rb in range(n_rblock):
                    items[it, 0] = <int32_t>s
                    items[it, 1] = h
                    items[it, 2] = rb
                    it += 1

    # scratch, head-major so that a recurrence item reads its head's tokens contiguously:
    # xh (2*n_qk + n_v heads, N, D) the conv outputs [q heads | k heads | v heads], oh (n_v, N, D)
    cdef float **conv_p = <float **>malloc(n_seq * sizeof(float *))
    cdef float **ssm_p = <float **>malloc(n_seq * sizeof(float *))
    # one NumPy buffer: large ones get transparent huge pages (NumPy asks for them), which
    # the head-major accesses (one head's rows, then the next's, MBs apart) need: 4 KB pages
    # cost a TLB miss nearly every access and a page fault every 4 KB of a fresh buffer
    work = np.empty(N * C + N * VD + N * 2 * n_v, np.float32)
    cdef float[::1] work_v = work
    cdef float *xh = &work_v[0]
    cdef float *oh = xh + N * C
    cdef float *gb = oh + N * VD  # per token: log g (n_v), beta (n_v)
    if conv_p == NULL or ssm_p == NULL:
        free(conv_p); free(ssm_p)
        raise MemoryError()
    try:
        _pointers(conv_states, n_seq, (K - 1) * C, conv_p, "conv_states")
        _pointers(ssm_states, n_seq, VD * D, ssm_p, "ssm_states")
    except Exception:
        free(conv_p); free(ssm_p)
        raise

    tok_seq_arr = np.repeat(np.arange(n_seq, dtype=np.int32), np.diff(np.asarray(seg_start)))
    cdef const int32_t[::1] tok_seq = tok_seq_arr
    # per thread: the chunked form's scratch, then a group's transposed states
    cdef long scratch_floats = gdn_chunk_scratch(D) + <long>nhmax * D * D if nchunked else 0
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
    cdef float *x
    cdef float *st
    cdef const float *qh
    cdef const float *kh
    cdef const float *vh
    cdef float *ohh
    cdef float *wbuf
    cdef void **ptrs
    cdef float nrm, sc
    with nogil, parallel(num_threads=n_threads):
        wbuf = <float *>simd_alloc(scratch_floats * sizeof(float)) if scratch_floats else NULL
        ptrs = <void **>malloc(5 * (nhmax + 1) * sizeof(void *))
        # 1. per token: causal conv + SiLU over [q | k | v] into xh (head-major); L2-normalised q
        # (scaled) and k per q/k head; decay and beta per value head
        for t in prange(N, schedule='static'):
            s = tok_seq[t]
            _conv_token(qkv_p, ldq, conv_p[s], w_p, xh, HS, C, K, seg_start[s], t, D)
            for m in range(2 * n_qk):
                x = xh + m * HS + t * D
                nrm = sqrtf(dn_sum_sq(x, D))
                sc = 1.0 / (nrm if nrm > eps else eps)
                if m < n_qk:
                    sc = sc * q_scale
                for j in range(D):
                    x[j] = x[j] * sc
            for h in range(n_v):  # the log decay (the recurrence takes its exp)
                gb[t * 2 * n_v + h] = ssm_a[h] * _softplus(a_p[t * lda + h] + dt_bias[h])
                gb[t * 2 * n_v + n_v + h] = _sigmoid(b_p[t * ldb + h])
        # 2. the conv states: the last K-1 inputs (after every token has read the old ones)
        for s in prange(n_seq, schedule='static'):
            _roll_state(qkv_p, ldq, conv_p[s], C, K, seg_start[s], seg_start[s + 1] - seg_start[s])
        # 3. the delta rule
        for it in prange(n_rec_items, schedule='dynamic'):
            s = items[it, 0]
            h = items[it, 1]
            rb = items[it, 2]
            hq = head_map[h]
            qh = xh + hq * HS
            kh = xh + (n_qk + hq) * HS
            if rb >= 0:  # token by token over ROW_BLOCK rows of one head
                _rec_rows(ssm_p[s], h, rb, D, kh, qh, xh + (2 * n_qk + h) * HS, oh + h * HS, gb, n_v,
                          seg_start[s], seg_start[s + 1])
                continue
            # the value heads of q/k head h, the segment cut at multiples of GDN_CHUNK of its positions
            _rec_group(ssm_p[s], &heads[h, 0], cnt[h], h, n_qk, n_v, D, n_rblock, xh, oh, gb, HS,
                       seg_start[s], seg_start[s + 1], pos[s], cmin, wbuf, ptrs)
        # 4. gated RMS norm per value head: rms_norm(o) * norm_w * silu(z), into out (token-major)
        for t in prange(N, schedule='static'):
            for h in range(n_v):
                dn_gated_norm(oh + h * HS + t * D, z_p + t * ldz + <Py_ssize_t>h * D, nw,
                              o_p + t * VD + <Py_ssize_t>h * D, D, eps)
        free(wbuf)
        free(ptrs)
    free(conv_p)
    free(ssm_p)
