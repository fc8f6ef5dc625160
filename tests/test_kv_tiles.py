"""A Q4_0 K pool in 16-key tiles (the decode scores kernel's layout, pyx/simd_kv_rows.h): it
holds the rows' bytes rearranged, so it gives the same values, the same attention bits and the
same logits as a pool of rows; the NumPy reference reads and writes the same layout."""
import numpy as np
import pytest

from llmcore import _kernels, nn

from test_nn import build_case, rng

pytestmark = pytest.mark.skipif(not _kernels.ENABLED,
                                reason="LLMCORE_NO_KERNELS=1: nothing to compare the NumPy references with")


def tiled_copy(rows_pool: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(nn._ref_tiles_from_rows(rows_pool))


@pytest.mark.parametrize("D", [32, 64, 96, 128])
@pytest.mark.parametrize("bs,KVH", [(16, 1), (32, 3), (64, 2)])
def test_store_and_load_give_the_rows_values(D, bs, KVH):
    r = rng(5)
    n = 2 * bs + 7
    rows = nn.make_kv_pool("q4_0", 5, bs, KVH, D)
    tiles = nn.make_kv_pool("q4_0", 5, bs, KVH, D, k_tiles=True)
    assert nn.pool_tiled(tiles) and not nn.pool_tiled(rows) and tiles.nbytes == rows.nbytes
    assert nn.pool_block_size(tiles) == bs
    table = np.array([3, 0, 4], np.int32)
    vals = r.standard_normal((n, KVH, D), dtype=np.float32)
    pos = np.arange(n, dtype=np.int32)
    nn.kv_store(rows, "q4_0", table, pos, vals)
    nn.kv_store(tiles, "q4_0", table, pos, vals)
    # the kernels' tiles are the rows' bytes in the layout the NumPy reference knows
    np.testing.assert_array_equal(tiles, nn._ref_tiles_from_rows(rows))
    np.testing.assert_array_equal(nn._ref_rows_from_tiles(tiles), rows)
    want = nn.kv_load(rows, "q4_0", table, n)
    np.testing.assert_array_equal(nn.kv_load(tiles, "q4_0", table, n), want)
    np.testing.assert_array_equal(nn._ref_kv_load(tiles, "q4_0", table, n), want)
    ref = nn.make_kv_pool("q4_0", 5, bs, KVH, D, k_tiles=True)
    nn._ref_kv_store(ref, "q4_0", table, pos, vals)
    np.testing.assert_array_equal(ref, tiles)


def test_tiles_only_where_the_format_allows():
    assert nn.make_kv_pool("q4_0", 2, 8, 1, 64, k_tiles=True).ndim == 4  # block size 8: rows
    assert nn.make_kv_pool("q8_0", 2, 32, 1, 64, k_tiles=True).ndim == 4
    assert nn.make_kv_pool("f16", 2, 32, 1, 64, k_tiles=True).ndim == 4
    with pytest.raises(ValueError):  # a 5-d pool of another type is refused
        nn.kv_load(np.zeros((2, 2, 1, 16, 34), np.uint8), "q8_0", np.array([0], np.int32), 1)


@pytest.mark.parametrize("H,KVH,D", [(9, 3, 64), (4, 1, 128), (8, 2, 96)])
@pytest.mark.parametrize("bs", [16, 32, 64])
def test_attention_gives_the_rows_bits(H, KVH, D, bs):
    # prefill tiles, decode rows of one and several tokens, a window that starts inside a
    # 16-key group, softcap and sinks; then ten one-token decodes (items over all kv heads)
    sinks = rng(42).standard_normal(H).astype(np.float32)
    cases = [build_case("q4_0", seq_lens=[150, 90, 33, 300, 7], n_q=[150, 20, 1, 2, 1], H=H, KVH=KVH, D=D,
                        bs=bs, seed=41),
             build_case("q4_0", seq_lens=[40 + 37 * i for i in range(10)], n_q=[1] * 10, H=H, KVH=KVH, D=D,
                        bs=bs, seed=43)]
    for q, k_pool, v_pool, tables, seg, q_pos in cases:
        kt = tiled_copy(k_pool)
        for kw in (dict(), dict(window=40), dict(softcap=8.0, sinks=sinks)):
            want = nn.attention(q, k_pool, v_pool, "q4_0", tables, seg, q_pos, 0.3, **kw)
            got = nn.attention(q, kt, v_pool, "q4_0", tables, seg, q_pos, 0.3, **kw)
            assert np.isfinite(got).all()
            np.testing.assert_array_equal(got, want)
            ref = nn._ref_attention(q, kt, v_pool, "q4_0", tables, seg, q_pos, 0.3, **kw)
            # (atol: on AMX-BF16 the prompt tiles' products are good to ~16 bits, not 24)
            np.testing.assert_allclose(got, ref, rtol=2e-4, atol=4e-5)


def test_a_long_decode_over_key_chunks():
    q, k_pool, v_pool, tables, seg, q_pos = build_case("q4_0", seq_lens=[2600, 2500], n_q=[1, 3], H=8, KVH=2,
                                                       D=64, bs=32, seed=44)
    kt = tiled_copy(k_pool)
    for kw in (dict(), dict(window=1100)):
        np.testing.assert_array_equal(nn.attention(q, kt, v_pool, "q4_0", tables, seg, q_pos, 0.125, **kw),
                                      nn.attention(q, k_pool, v_pool, "q4_0", tables, seg, q_pos, 0.125, **kw))


def _decode(m, prompts, steps):
    states = [m.new_state() for _ in prompts]
    out = [m.forward([(s, p)]) for s, p in zip(states, prompts)]
    nxt = [int(np.argmax(o[-1])) for o in out]
    for _ in range(steps):
        lg = m.forward([(s, [t]) for s, t in zip(states, nxt)])
        out.append(lg)
        nxt = np.argmax(lg, axis=1).tolist()
    for s in states:
        s.release()
    return out


def test_model_logits_and_state_layout(tiny_models, monkeypatch):
    """A q4_0 cache: the same logits with K in tiles as in rows (prefill, the fused decode
    step of 1 and 9 sequences); the pool's fingerprint names the layout, so a state file
    of one layout is never read as the other."""
    from llmcore.cache import pool as pool_mod
    from llmcore.models import load_model

    path = dict(tiny_models)["qwen3-q4_0"]
    r = rng(45)
    prompts = [r.integers(0, 200, 20 + 7 * i).tolist() for i in range(9)]
    out, layouts = {}, {}
    for tiles in (True, False):
        monkeypatch.setattr(pool_mod, "K_TILES", tiles)
        m = load_model(path, kv_type="q4_0", block_size=16)
        pools = list(m.pools.values())
        assert all(p.k_tiled == tiles for p in pools)
        assert all(nn.pool_tiled(k) == tiles for p in pools for k in p.k)
        assert m.decode_step() is not None
        out[tiles] = _decode(m, prompts[:1], 3) + _decode(m, prompts, 3)
        layouts[tiles] = pools[0].layout()
    for a, b in zip(out[True], out[False]):
        np.testing.assert_array_equal(a, b)
    assert layouts[True] != layouts[False] and layouts[True]["k_layout"] == "tiles16"
