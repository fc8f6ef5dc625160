"""llmcore.ssm kernels vs the NumPy references in tests/reference_archs.py."""
from __future__ import annotations

import numpy as np
import pytest

from llmcore import ssm
import reference_archs as R

SPLITS = (5, 7, 1)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _chunks(n_total=sum(SPLITS)):
    out, s = [], 0
    for k in SPLITS:
        out.append(slice(s, s + k))
        s += k
    assert s == n_total
    return out


@pytest.fixture(params=["kernel", "numpy"])
def impl(request, monkeypatch):
    if request.param == "kernel":
        if not ssm.have_kernels():
            pytest.skip("kernels off (LLMCORE_NO_KERNELS=1)")
    else:
        monkeypatch.setattr(ssm, "_k", None)
    return request.param


# ---- conv1d ----------------------------------------------------------------------------

def _conv_case(rng, n=13, C=70, K=4):
    x = rng.standard_normal((n, C)).astype(np.float32)
    w = rng.uniform(-0.5, 0.5, (C, K)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, C).astype(np.float32)
    s0 = rng.standard_normal((K - 1, C)).astype(np.float32)
    return x, w, b, s0


@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("silu,use_bias", [(False, False), (True, True)])
def test_conv1d_matches_reference(impl, K, silu, use_bias):
    x, w, b, s0 = _conv_case(_rng(K), K=K)
    bias = b if use_bias else None
    ref = R.conv1d_causal(x.astype(np.float64), w.astype(np.float64), bias, s0.astype(np.float64))
    if silu:
        ref = R.silu(ref)
    st = s0.copy()
    y = ssm.conv1d(x, st, w, bias, silu=silu, n_threads=2)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(st, np.concatenate([s0, x])[-(K - 1):])


def test_conv1d_chunked_equals_one_call(impl):
    x, w, b, s0 = _conv_case(_rng(1))
    st1 = s0.copy()
    y1 = ssm.conv1d(x, st1, w, b, silu=True)
    st2 = s0.copy()
    y2 = np.concatenate([ssm.conv1d(x[sl], st2, w, b, silu=True) for sl in _chunks()])
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(st1, st2)


def test_conv1d_threads_identical_and_strided_input():
    if not ssm.have_kernels():
        pytest.skip("kernels off (LLMCORE_NO_KERNELS=1)")
    rng = _rng(2)
    x, w, b, s0 = _conv_case(rng, C=300)
    fused = np.concatenate([x, rng.standard_normal(x.shape).astype(np.float32)], 1)
    view = fused[:, :300]   # row-strided slice of a fused projection output
    ys = []
    for nt in (1, 2):
        st = s0.copy()
        ys.append((ssm.conv1d(view, st, w, b, n_threads=nt), st))
    np.testing.assert_array_equal(ys[0][0], ys[1][0])
    np.testing.assert_array_equal(ys[0][1], ys[1][1])
    st = s0.copy()
    np.testing.assert_array_equal(ssm.conv1d(x.copy(), st, w, b), ys[0][0])


# ---- mamba-1 scan ----------------------------------------------------------------------

def _mamba_case(rng, n=13, di=48, ds=16):
    x = rng.standard_normal((n, di)).astype(np.float32)
    dt = rng.standard_normal((n, di)).astype(np.float32) - 1.0
    dt[0, :4] = 25.0          # softplus pass-through branch (> 20)
    A = -np.tile(np.arange(1, ds + 1, dtype=np.float32), (di, 1)) * rng.uniform(0.5, 1.5, (di, 1)).astype(np.float32)
    B = rng.standard_normal((n, ds)).astype(np.float32)
    C = rng.standard_normal((n, ds)).astype(np.float32)
    D = rng.standard_normal(di).astype(np.float32)
    z = rng.standard_normal((n, di)).astype(np.float32)
    bias = rng.uniform(-1, 1, di).astype(np.float32)
    s0 = rng.standard_normal((di, ds)).astype(np.float32)
    return x, dt, A, B, C, D, z, bias, s0


def test_mamba_scan_matches_reference(impl):
    x, dt, A, B, C, D, z, bias, s0 = _mamba_case(_rng(3))
    sref = s0.astype(np.float64)
    yref = R.mamba_scan_ref(sref, x.astype(np.float64), (dt + bias).astype(np.float64),
                            A.astype(np.float64), B.astype(np.float64), C.astype(np.float64))
    yref = (yref + x * D) * R.silu(z.astype(np.float64))
    st = s0.copy()
    y = ssm.mamba_scan(st, x, dt, A, B, C, D=D, z=z, dt_bias=bias)
    np.testing.assert_allclose(y, yref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(st, sref, rtol=1e-4, atol=1e-4)
    # without the optional parts: the plain scan output
    st = s0.copy()
    sref = s0.astype(np.float64)
    y = ssm.mamba_scan(st, x, dt, A, B, C)
    yref = R.mamba_scan_ref(sref, x.astype(np.float64), dt.astype(np.float64), A.astype(np.float64),
                            B.astype(np.float64), C.astype(np.float64))
    np.testing.assert_allclose(y, yref, rtol=1e-4, atol=1e-4)


def test_mamba_scan_chunked_and_threads(impl):
    x, dt, A, B, C, D, z, bias, s0 = _mamba_case(_rng(4), di=64)
    st1 = s0.copy()
    y1 = ssm.mamba_scan(st1, x, dt, A, B, C, D=D, z=z, dt_bias=bias, n_threads=1)
    st2 = s0.copy()
    y2 = np.concatenate([ssm.mamba_scan(st2, x[sl], dt[sl], A, B[sl], C[sl], D=D, z=z[sl], dt_bias=bias,
                                        n_threads=2) for sl in _chunks()])
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(st1, st2)


# ---- mamba-2 scan ----------------------------------------------------------------------

def _mamba2_case(rng, n=13, nh=6, hd=8, ds=16, ng=2):
    x = rng.standard_normal((n, nh, hd)).astype(np.float32)
    dt = rng.standard_normal((n, nh)).astype(np.float32) - 1.0
    A = -rng.uniform(1, 16, nh).astype(np.float32)
    B = rng.standard_normal((n, ng, ds)).astype(np.float32)
    C = rng.standard_normal((n, ng, ds)).astype(np.float32)
    D = rng.standard_normal(nh).astype(np.float32)
    z = rng.standard_normal((n, nh, hd)).astype(np.float32)
    bias = rng.uniform(-1, 1, nh).astype(np.float32)
    s0 = rng.standard_normal((nh, hd, ds)).astype(np.float32)
    return x, dt, A, B, C, D, z, bias, s0


@pytest.mark.parametrize("ng", [1, 2, 3])
def test_mamba2_scan_matches_reference(impl, ng):
    x, dt, A, B, C, D, z, bias, s0 = _mamba2_case(_rng(5 + ng), ng=ng)
    sref = s0.astype(np.float64)
    yref = R.mamba2_scan_ref(sref, x.astype(np.float64), (dt + bias).astype(np.float64), A.astype(np.float64),
                             B.astype(np.float64), C.astype(np.float64))
    yref = (yref + x * D[None, :, None]) * R.silu(z.astype(np.float64))
    st = s0.copy()
    y = ssm.mamba2_scan(st, x, dt, A, B, C, D=D, z=z, dt_bias=bias)
    assert y.shape == x.shape
    np.testing.assert_allclose(y, yref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(st, sref, rtol=1e-4, atol=1e-4)


def test_mamba2_groups_are_contiguous_heads():
    """Heads 0..nh/ng-1 use group 0 (repeat_interleave), not h % ng."""
    x, dt, A, B, C, D, z, bias, s0 = _mamba2_case(_rng(9), nh=4, ng=2)
    B2 = B.copy()
    B2[:, 1] = 0.0          # group 1 gets no input
    st = np.zeros_like(s0)
    ssm.mamba2_scan(st, x, dt, A, B2, C)
    assert np.abs(st[:2]).max() > 0 and np.abs(st[2:]).max() == 0


def test_mamba2_scan_chunked_and_threads(impl):
    x, dt, A, B, C, D, z, bias, s0 = _mamba2_case(_rng(10))
    st1 = s0.copy()
    y1 = ssm.mamba2_scan(st1, x, dt, A, B, C, D=D, z=z, dt_bias=bias, n_threads=1)
    st2 = s0.copy()
    y2 = np.concatenate([ssm.mamba2_scan(st2, x[sl], dt[sl], A, B[sl], C[sl], D=D, z=z[sl], dt_bias=bias,
                                         n_threads=2) for sl in _chunks()])
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(st1, st2)


def test_kernel_equals_numpy_fallback(monkeypatch):
    if not ssm.have_kernels():
        pytest.skip("kernels off (LLMCORE_NO_KERNELS=1)")
    x, dt, A, B, C, D, z, bias, s0 = _mamba2_case(_rng(11))
    st_k = s0.copy()
    yk = ssm.mamba2_scan(st_k, x, dt, A, B, C, D=D, z=z, dt_bias=bias)
    monkeypatch.setattr(ssm, "_k", None)
    st_n = s0.copy()
    yn = ssm.mamba2_scan(st_n, x, dt, A, B, C, D=D, z=z, dt_bias=bias)
    np.testing.assert_allclose(yk, yn, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(st_k, st_n, rtol=2e-5, atol=2e-5)


def test_bad_state_rejected():
    x, w, b, s0 = _conv_case(_rng(12))
    with pytest.raises(ValueError):
        ssm.conv1d(x, s0.astype(np.float64), w, b)
    with pytest.raises(ValueError):
        ssm.conv1d(x, s0[:, :10], w, b)


def test_state_shapes():
    assert ssm.conv_state_shape(4, 384) == (3, 384)
    assert ssm.mamba_state_shape(256, 16) == (256, 16)
    assert ssm.mamba2_state_shape(4, 64, 64) == (4, 64, 64)


# ---- the ops drive the real architectures ----------------------------------------------

def _ssm_conv(x, w, bias=None, state=None):
    st = np.zeros((w.shape[1] - 1, w.shape[0]), np.float32) if state is None else state.astype(np.float32)
    return ssm.conv1d(x, st, w, bias).astype(np.float64)


def _ssm_mamba(state, x, dt, A, B, C):
    st = state.astype(np.float32)
    y = ssm.mamba_scan(st, x, dt, A, B, C)
    state[:] = st
    return y.astype(np.float64)


def _ssm_mamba2(state, x, dt, A, B, C):
    st = state.astype(np.float32)
    y = ssm.mamba2_scan(st, x, dt, A, B, C)
    state[:] = st
    return y.astype(np.float64)


@pytest.mark.parametrize("model", ["mamba", "mamba2", "lfm2"])
def test_ops_in_reference_forward(built_model, monkeypatch, model):
    """Swapping the reference conv/scan for llmcore.ssm keeps the logits (same weight
    layouts as loaded from the GGUF)."""
    W, meta = R.load_gguf(built_model(model))
    toks = [1, 50, 357, 282, 46, 314, 42, 7, 99, 100, 5, 6, 7]
    ref = R.forward(W, meta, toks, last_only=True)
    monkeypatch.setattr(R, "conv1d_causal", _ssm_conv)
    monkeypatch.setattr(R, "mamba_scan_ref", _ssm_mamba)
    monkeypatch.setattr(R, "mamba2_scan_ref", _ssm_mamba2)
    got = R.forward(W, meta, toks, last_only=True)
    d = got - ref
    assert d.std() / ref.std() < 1e-4
