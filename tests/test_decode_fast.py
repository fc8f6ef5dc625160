"""Decode fast paths: few query rows per kv head against an f16 cache (keys/values read in
place, 16-key reductions), and batched decode through the model (one forward for several
sequences == one forward per sequence)."""
import numpy as np
import pytest

from llmcore import nn

from test_nn import F16_P_ATOL, build_case


@pytest.mark.parametrize("H,KVH,D", [(9, 3, 64), (4, 1, 256), (10, 2, 32), (8, 8, 64), (6, 2, 48)])
def test_f16_decode_rows_match_reference(H, KVH, D):
    # G = 3, 4, 5 (4 + 1 rows), 1; D = 48: 16-multiple not a 64-multiple (masked tail chunk)
    lens = [600, 37, 16, 1, 250]
    case = build_case("f16", seq_lens=lens, n_q=[1, 1, 1, 1, 2], H=H, KVH=KVH, D=D, bs=32, seed=5)
    q, k_pool, v_pool, tables, seg, q_pos = case
    got = nn.attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 1.0 / np.sqrt(D))
    want = nn._ref_attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 1.0 / np.sqrt(D))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=F16_P_ATOL)
    assert (np.abs(got - want) < 1e-5).mean() > 0.99


def test_f16_decode_window_softcap_sinks():
    case = build_case("f16", seq_lens=[300, 70], n_q=[1, 1], H=8, KVH=2, D=64, bs=32, window=50,
                      free_outside=True, seed=9)
    q, k_pool, v_pool, tables, seg, q_pos = case
    sinks = np.linspace(-1, 1, 8).astype(np.float32)
    kw = dict(window=50, softcap=20.0, sinks=sinks)
    got = nn.attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 0.125, **kw)
    want = nn._ref_attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 0.125, **kw)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=F16_P_ATOL)
