"""The gated DeltaNet kernel (pyx/deltanet.pyx) against the NumPy reference
(reference_hybrid.gated_delta_net): several sequences of different lengths in one call, a
sequence split over calls, thread-count independence, both value-head mappings; its chunked
form (prefill) against its token-by-token form, decays near 0 and 1, chunk boundaries at
fixed positions."""
import contextlib

import numpy as np
import pytest

import reference_hybrid as ref

dn = pytest.importorskip("llmcore._kernels.deltanet")

N_QK, D, K = 2, 32, 4


def layer(n_v, seed=0):
    rng = np.random.default_rng(seed)
    C = 2 * N_QK * D + n_v * D
    return dict(dt_bias=rng.standard_normal(n_v).astype(np.float32),
                ssm_a=-rng.uniform(1, 16, n_v).astype(np.float32),
                conv_w=rng.uniform(-0.5, 0.5, (C, K)).astype(np.float32),
                norm_w=(1 + 0.1 * rng.standard_normal(D)).astype(np.float32))


def inputs(n, n_v, seed):
    rng = np.random.default_rng(seed)
    C = 2 * N_QK * D + n_v * D
    return [rng.standard_normal(s).astype(np.float32) for s in ((n, C), (n, n_v * D), (n, n_v), (n, n_v))]


def fresh(n_v):
    return np.zeros((K - 1, 2 * N_QK * D + n_v * D), np.float32), np.zeros((n_v, D, D), np.float32)


def run(w, head_map, segments, states, n_threads=2, pos=None):
    """One kernel call over `segments` (per sequence: qkv, z, beta, alpha), states updated;
    pos: each segment's first position in its sequence (None: the kernel's default, 0)."""
    qkv, z, beta, alpha = (np.concatenate([s[i] for s in segments]) for i in range(4))
    seg = np.zeros(len(segments) + 1, np.int32)
    seg[1:] = np.cumsum([len(s[0]) for s in segments])
    out = np.empty((len(qkv), z.shape[1]), np.float32)
    dn.gated_delta_net(qkv, z, beta, alpha, w["dt_bias"], w["ssm_a"], np.ascontiguousarray(w["conv_w"].T),
                       w["norm_w"], np.asarray(head_map, np.int32), [c for c, _ in states],
                       [m for _, m in states], seg, 1e-6, out, n_threads,
                       seg_pos=None if pos is None else np.asarray(pos, np.int32))
    return [out[a:b] for a, b in zip(seg[:-1], seg[1:])]


@contextlib.contextmanager
def chunk_min(n):
    """The kernel's chunked-form threshold for a while (0: token by token only)."""
    old = dn.set_chunk_min_tokens(n)
    try:
        yield
    finally:
        dn.set_chunk_min_tokens(old)


def run_split(w, hm, seg, n_v, cuts, threads=(1, 2)):
    """One sequence's tokens in calls cut at `cuts`, positions carried: (outputs, state)."""
    st = fresh(n_v)
    ends = [0, *cuts, len(seg[0])]
    outs = [run(w, hm, [[x[a:b] for x in seg]], [st], n_threads=threads[i % len(threads)], pos=[a])[0]
            for i, (a, b) in enumerate(zip(ends[:-1], ends[1:]))]
    return np.concatenate(outs), st


def close(a, b, tol=2e-5):
    """Equal to float rounding, relative to the array's scale."""
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * float(np.abs(b).max()))


@pytest.mark.parametrize("n_v,mapping", [(4, "qwen35moe"), (6, "qwen35"), (4, "qwen3next"), (2, "qwen35")])
def test_kernel_matches_reference(n_v, mapping):
    w = layer(n_v)
    hm = ref.head_map(mapping, n_v, N_QK)
    segs = [inputs(n, n_v, seed) for n, seed in ((13, 1), (1, 2), (40, 3))]
    states = [fresh(n_v) for _ in segs]
    got = run(w, hm, segs, states)
    for seg, out, (conv, S) in zip(segs, got, states):
        want, want_conv, want_S = ref.gated_delta_net(*seg, w["dt_bias"], w["ssm_a"], w["conv_w"], w["norm_w"],
                                                      hm, 1e-6)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        np.testing.assert_allclose(conv, want_conv, atol=1e-6)
        np.testing.assert_allclose(S, want_S, rtol=1e-4, atol=1e-5 * np.abs(want_S).max())


def test_split_calls_and_thread_count_change_nothing():
    """Token by token, any split is the same float operations in the same order:
    bit-identical; so is any thread count."""
    n_v = 4
    w = layer(n_v, 5)
    hm = ref.head_map("qwen35moe", n_v, N_QK)
    seg = inputs(37, n_v, 6)
    with chunk_min(0):
        whole_state = fresh(n_v)
        whole = run(w, hm, [seg], [whole_state])[0]
        parts, state = run_split(w, hm, seg, n_v, [1, 3, 30])
    assert np.array_equal(parts, whole)
    assert np.array_equal(state[0], whole_state[0]) and np.array_equal(state[1], whole_state[1])


def test_state_carries_over_and_restores():
    """Continuing from a copied state is the same as never having stopped."""
    n_v = 6
    w = layer(n_v, 7)
    hm = ref.head_map("qwen35", n_v, N_QK)
    a, b = inputs(9, n_v, 8), inputs(5, n_v, 9)
    st = fresh(n_v)
    run(w, hm, [a], [st])
    saved = (st[0].copy(), st[1].copy())
    first = run(w, hm, [b], [st])[0]
    run(w, hm, [inputs(3, n_v, 10)], [st])  # wander off
    st[0][...], st[1][...] = saved
    assert np.array_equal(run(w, hm, [b], [st])[0], first)


def test_bad_arguments_are_refused():
    n_v = 4
    w = layer(n_v)
    seg = inputs(3, n_v, 1)
    with pytest.raises(ValueError, match="arrays for"):
        run(w, [0, 1, 0, 1], [seg], [])
    with pytest.raises(ValueError, match="head_map"):
        run(w, [0, 1, 2, 1], [seg], [fresh(n_v)])
    conv, S = fresh(n_v)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        run(w, [0, 1, 0, 1], [seg], [(conv, S.astype(np.float64))])


# ---- the chunked form -------------------------------------------------------------------------

def decay_layer(n_v, kind, seed):
    """A layer whose decays g = exp(ssm_a * softplus(alpha + dt_bias)) are near 1 ("slow"),
    near 0 ("fast": the state forgets within a token) or spread over both ("mixed")."""
    w = layer(n_v, seed)
    if kind == "slow":
        w["ssm_a"] = np.full(n_v, -1e-3, np.float32)
        w["dt_bias"] = np.full(n_v, -6.0, np.float32)
    elif kind == "fast":
        w["ssm_a"] = np.full(n_v, -40.0, np.float32)
        w["dt_bias"] = np.full(n_v, 4.0, np.float32)
    else:
        w["ssm_a"] = -np.geomspace(1e-3, 40.0, n_v).astype(np.float32)
    return w


@pytest.mark.parametrize("kind", ["mixed", "slow", "fast"])
@pytest.mark.parametrize("n_v,mapping,n", [(4, "qwen35moe", 150), (6, "qwen35", 64), (4, "qwen3next", 70)])
def test_chunked_equals_token_by_token(kind, n_v, mapping, n):
    """The chunked form (every chunk, from 1 token up) gives the recurrence's outputs and
    state to float rounding, and the NumPy reference's (float64) likewise, with decays near 1
    (the state remembers everything), near 0 (forgets at every token) and both."""
    w = decay_layer(n_v, kind, 11)
    g = np.exp(w["ssm_a"] * np.log1p(np.exp(w["dt_bias"])))  # decays at alpha = 0
    assert (g.min() > 0.99) if kind == "slow" else (g.max() < 1e-30) if kind == "fast" else (g.min() < 1e-6 < 0.99 < g.max())
    hm = ref.head_map(mapping, n_v, N_QK)
    seg = inputs(n, n_v, 12)
    if kind != "fast":
        seg[3][:] *= 0.3  # alpha: keep the decays where the kind put them
    with chunk_min(0):
        st_r = fresh(n_v)
        rec = run(w, hm, [seg], [st_r])[0]
    with chunk_min(1):
        st_c = fresh(n_v)
        chk = run(w, hm, [seg], [st_c])[0]
    assert not np.array_equal(chk, rec)  # the chunked form did run
    close(chk, rec)
    close(st_c[1], st_r[1])
    assert np.array_equal(st_c[0], st_r[0])  # the conv state is not the recurrence's business
    want, _, want_S = ref.gated_delta_net(*seg, w["dt_bias"], w["ssm_a"], w["conv_w"], w["norm_w"], hm, 1e-6)
    close(chk, want, 1e-4)
    close(st_c[1], want_S, 1e-4)


def test_chunked_continues_a_state_and_handles_partial_chunks():
    """A prefill that starts mid-sequence (positions 37..): a partial first chunk, whole
    chunks, a partial last one, from a state that is not zero; D not a multiple of 16 (the
    portable product) too."""
    for d in (D, 24):
        n_v = 4
        w = layer(n_v, 21)
        if d != D:
            rng = np.random.default_rng(3)
            C = 2 * N_QK * d + n_v * d
            w = dict(w, conv_w=rng.uniform(-0.5, 0.5, (C, K)).astype(np.float32),
                     norm_w=(1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        hm = ref.head_map("qwen35moe", n_v, N_QK)
        rng = np.random.default_rng(22)
        C = 2 * N_QK * d + n_v * d
        seg = [rng.standard_normal(sh).astype(np.float32) for sh in ((200, C), (200, n_v * d), (200, n_v), (200, n_v))]
        head, tail = [x[:37] for x in seg], [x[37:] for x in seg]
        states = []
        outs = []
        for cmin in (0, 1, 16):
            with chunk_min(cmin):
                st = (np.zeros((K - 1, C), np.float32), np.zeros((n_v, d, d), np.float32))
                run(w, hm, [head], [st], pos=[0])
                outs.append(run(w, hm, [tail], [st], pos=[37])[0])
                states.append(st)
        for o, st in zip(outs[1:], states[1:]):
            close(o, outs[0])
            close(st[1], states[0][1])


def test_split_at_chunk_boundaries_is_bit_identical():
    """Chunks sit at multiples of 64 of the positions: a prompt cut there gives the bits of one
    call (threads 1 and 2 alternating); cut elsewhere, the same values to float rounding."""
    n_v = 4
    w = layer(n_v, 31)
    hm = ref.head_map("qwen35moe", n_v, N_QK)
    seg = inputs(200, n_v, 32)
    whole_st = fresh(n_v)
    whole = run(w, hm, [seg], [whole_st], pos=[0])[0]
    for cuts in ([64], [128], [64, 128, 192]):
        out, st = run_split(w, hm, seg, n_v, cuts)
        assert np.array_equal(out, whole) and np.array_equal(st[1], whole_st[1])
    for cuts in ([100], [5, 70, 150], [1, 2, 3, 90]):
        out, st = run_split(w, hm, seg, n_v, cuts)
        close(out, whole)
        close(st[1], whole_st[1])
    # the default position (None: 0) is the start of a chunk
    st = fresh(n_v)
    assert np.array_equal(run(w, hm, [seg], [st])[0], whole)


def test_batched_sequences_equal_each_alone_and_threads_change_nothing():
    """Prefills at different positions, decode steps and short segments in one call: each
    sequence gets the bits it gets alone, whatever the thread count."""
    n_v = 4
    w = layer(n_v, 41)
    hm = ref.head_map("qwen35", n_v, N_QK)
    lens, pos = [130, 1, 70, 9, 1, 64], [0, 300, 10, 64, 5, 128]
    segs = [inputs(n, n_v, 50 + i) for i, n in enumerate(lens)]
    rng = np.random.default_rng(42)
    init = [(rng.standard_normal((K - 1, 2 * N_QK * D + n_v * D)).astype(np.float32),
             (0.1 * rng.standard_normal((n_v, D, D))).astype(np.float32)) for _ in segs]
    alone = []
    for seg, p, (c, m) in zip(segs, pos, init):
        st = (c.copy(), m.copy())
        alone.append((run(w, hm, [seg], [st], n_threads=1, pos=[p])[0], st))
    for nt in (1, 2):
        states = [(c.copy(), m.copy()) for c, m in init]
        outs = run(w, hm, segs, states, n_threads=nt, pos=pos)
        for o, st, (ao, ast) in zip(outs, states, alone):
            assert np.array_equal(o, ao)
            assert np.array_equal(st[0], ast[0]) and np.array_equal(st[1], ast[1])


def test_chunk_threshold():
    """Chunks of at least chunk_min_tokens() tokens take the chunked form, shorter ones the
    recurrence: a 20-token prefill is the recurrence's bits below the threshold only."""
    n_v = 4
    w = layer(n_v, 51)
    hm = ref.head_map("qwen35moe", n_v, N_QK)
    seg = inputs(20, n_v, 52)
    with chunk_min(0):
        rec = run(w, hm, [seg], [fresh(n_v)])[0]
    with chunk_min(21):
        assert np.array_equal(run(w, hm, [seg], [fresh(n_v)])[0], rec)
    with chunk_min(20):
        out = run(w, hm, [seg], [fresh(n_v)])[0]
        assert not np.array_equal(out, rec)
        close(out, rec)
    # positions 50..69 cross a chunk boundary: 14 + 6 tokens, both below 20
    with chunk_min(20):
        assert np.array_equal(run(w, hm, [seg], [fresh(n_v)], pos=[50])[0], rec)
    assert 1 <= dn.chunk_min_tokens() <= 64
