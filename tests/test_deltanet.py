"""The gated DeltaNet kernel (pyx/deltanet.pyx) against the NumPy reference
(reference_hybrid.gated_delta_net): several sequences of different lengths in one call, a
sequence split over calls, thread-count independence, both value-head mappings."""
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


def run(w, head_map, segments, states, n_threads=2):
    """One kernel call over `segments` (per sequence: qkv, z, beta, alpha), states updated."""
    qkv, z, beta, alpha = (np.concatenate([s[i] for s in segments]) for i in range(4))
    seg = np.zeros(len(segments) + 1, np.int32)
    seg[1:] = np.cumsum([len(s[0]) for s in segments])
    out = np.empty((len(qkv), z.shape[1]), np.float32)
    dn.gated_delta_net(qkv, z, beta, alpha, w["dt_bias"], w["ssm_a"], np.ascontiguousarray(w["conv_w"].T),
                       w["norm_w"], np.asarray(head_map, np.int32), [c for c, _ in states],
                       [m for _, m in states], seg, 1e-6, out, n_threads)
    return [out[a:b] for a, b in zip(seg[:-1], seg[1:])]


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
    n_v = 4
    w = layer(n_v, 5)
    hm = ref.head_map("qwen35moe", n_v, N_QK)
    seg = inputs(37, n_v, 6)
    whole_state = fresh(n_v)
    whole = run(w, hm, [seg], [whole_state])[0]
    state = fresh(n_v)
    parts = [run(w, hm, [[x[a:b] for x in seg]], [state], n_threads=nt)[0]
             for (a, b), nt in (((0, 1), 1), ((1, 3), 2), ((3, 30), 1), ((30, 37), 2))]
    # the same float operations in the same order: bit-identical
    assert np.array_equal(np.concatenate(parts), whole)
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
