"""Decode paths: few query rows per kv head against an f16 cache (keys/values read in
place, 16-key reductions), and batched decode through the model (one forward for several
sequences == one forward per sequence)."""
import numpy as np
import pytest

from llmcore import _kernels, nn

from test_nn import build_case

# the kernels' fast paths against the NumPy references; with the kernels off both are the reference
needs_kernels = pytest.mark.skipif(not _kernels.ENABLED, reason="LLMCORE_NO_KERNELS=1: no fast path to compare")


@needs_kernels
@pytest.mark.parametrize("H,KVH,D", [(9, 3, 64), (4, 1, 256), (10, 2, 32), (8, 8, 64), (6, 2, 48)])
def test_f16_decode_rows_match_reference(H, KVH, D):
    # G = 3, 4, 5 (4 + 1 rows), 1; D = 48: 16-multiple not a 64-multiple (masked tail chunk)
    lens = [600, 37, 16, 1, 250]
    case = build_case("f16", seq_lens=lens, n_q=[1, 1, 1, 1, 2], H=H, KVH=KVH, D=D, bs=32, seed=5)
    q, k_pool, v_pool, tables, seg, q_pos = case
    got = nn.attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 1.0 / np.sqrt(D))
    want = nn._ref_attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 1.0 / np.sqrt(D))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    assert (np.abs(got - want) < 1e-5).mean() > 0.99


@needs_kernels
def test_f16_decode_window_softcap_sinks():
    case = build_case("f16", seq_lens=[300, 70], n_q=[1, 1], H=8, KVH=2, D=64, bs=32, window=50,
                      free_outside=True, seed=9)
    q, k_pool, v_pool, tables, seg, q_pos = case
    sinks = np.linspace(-1, 1, 8).astype(np.float32)
    kw = dict(window=50, softcap=20.0, sinks=sinks)
    got = nn.attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 0.125, **kw)
    want = nn._ref_attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 0.125, **kw)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


# ---- model level ------------------------------------------------------------------------------

from fixtures import rand_tokens  # noqa: E402


def test_q8_0_kv_needs_head_dim_multiple_of_32(tiny_models):
    from llmcore.models import load_model

    with pytest.raises(ValueError, match="head_dim % 32"):  # tiny llama: head_dim 16
        load_model(tiny_models["llama-q4_0"], kv_type="q8_0", block_size=16)


@needs_kernels
@pytest.mark.parametrize("name,kv_type", [("llama-q4_0", "f16"), ("qwen3-q8_0", "f16"), ("qwen3-f32", "f16"),
                                          ("qwen3-q8_0", "q8_0"), ("qwen3-f32", "q8_0")])
def test_fused_attention_matches_unfused_path(tiny_models, name, kv_type, monkeypatch):
    """The fused decode path (qkv_post: q/k norms + rope + KV store in one kernel, scratch
    activations) gives the logits of the per-op path (rms_norm, rope, kv_store, attention)."""
    from llmcore.models import layers, load_model

    m = load_model(tiny_models[name], kv_type=kv_type, block_size=16)
    prompt = rand_tokens(37, seed=1)

    def run():
        st = m.new_state()
        out = [m.forward([(st, prompt[:30])])[0]]
        for t in prompt[30:]:
            out.append(m.forward([(st, [int(t)])])[0])
        st.release()
        return np.stack(out)

    fused = run()
    monkeypatch.setattr(layers, "_FUSED_QKV", False)
    plain = run()
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["llama-q4_0", "qwen3-f16"])
def test_batched_decode_equals_one_at_a_time(tiny_models, name):
    """B sequences of different lengths decoded in one forward per step give the logits of
    decoding each alone (scratch buffers shared by the layers are not mixed up)."""
    from llmcore.models import load_model

    m = load_model(tiny_models[name], block_size=16)
    prompts = [rand_tokens(n, seed=n) for n in (3, 40, 17, 70, 1)]
    steps = [rand_tokens(4, seed=100 + i) for i in range(len(prompts))]
    alone = []
    for p, s in zip(prompts, steps):
        st = m.new_state()
        m.forward([(st, p)])
        alone.append(np.stack([m.forward([(st, [int(t)])])[0] for t in s]))
        st.release()
    sts = [m.new_state() for _ in prompts]
    for st, p in zip(sts, prompts):
        m.forward([(st, p)])
    got = np.stack([m.forward([(st, [int(s[k])]) for st, s in zip(sts, steps)]) for k in range(4)], axis=1)
    np.testing.assert_allclose(got, np.stack(alone), rtol=1e-4, atol=1e-4)


@needs_kernels
def test_shared_rope_tables_give_the_same_bits(tiny_models, monkeypatch):
    """A prefill step computes each rope cos/sin table once for all its layers
    (rope.cos_sin_table, ForwardBatch.rope_tables): the logits are the bits of computing the
    table per token in every layer, and rope.cos_sin_table is qkv_post's own table."""
    from llmcore import _kernels
    from llmcore.models import layers, load_model

    rope = _kernels.load("rope")
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    tab = np.empty((len(pos), 16), np.float32)
    rope.cos_sin_table(pos, 16, 10000.0, 0.5, tab, 2)
    theta = (pos[:, None].astype(np.float64) * 0.5 * 10000.0 ** (-np.arange(8) / 8))
    np.testing.assert_allclose(tab[:, 0::2], np.cos(theta), atol=1e-3)
    np.testing.assert_allclose(tab[:, 1::2], np.sin(theta), atol=1e-3)

    m = load_model(tiny_models["qwen3-q8_0"], block_size=16)
    prompt = rand_tokens(40, seed=3)

    def run():
        st = m.new_state()
        out = m.forward([(st, prompt)])[0]
        st.release()
        return out

    shared = run()
    monkeypatch.setattr(layers, "ROPE_TABLE_MIN_ROWS", 10 ** 9)
    np.testing.assert_array_equal(shared, run())
