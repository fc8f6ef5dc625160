"""gemma3: interleaved sliding-window attention vs the NumPy reference (banded mask) and
llama.cpp's oracle; windowed cache behaviour (token-by-token, batching, snapshot/restore,
refused trims, swa_full, quantized KV)."""
import numpy as np
import pytest

import reference_archs as R
from fixtures import GEMMA3, N_VOCAB, check_batched_equals_alone, model_loader, rand_tokens
from fixtures import rel_err as _rel
from oracle import PROMPTS, check, check_within_own_variation, load_oracle, oracle_prompt

from llmcore.cache.swa import SWAKVCacheState
from llmcore.models import load_model

WINDOW = GEMMA3["window"]
BS = 4  # block size in these tests: windows span several blocks, blocks get freed


@pytest.fixture(scope="module")
def tiny(built_model):
    return built_model("gemma3")


@pytest.fixture(scope="module")
def ref(tiny):
    W, meta = R.load_gguf(tiny)
    return lambda toks: R.forward_gemma3(W, meta, np.asarray(toks)).astype(np.float32)


@pytest.fixture(scope="module")
def models(tiny):
    return model_loader(tiny, BS)


def _toks(n, seed=0):
    return rand_tokens(n, seed, N_VOCAB)


def test_layout(models):
    m = models()
    assert m.is_local == [True] * 5 + [False]
    assert m.pools["swa"].n_layers == 5 and m.pools["kv"].n_layers == 1
    assert isinstance(m.new_state().caches["swa"], SWAKVCacheState)


@pytest.mark.parametrize("kv_type,tol", [("f32", 2e-4), ("f16", 1e-2)])
def test_longer_than_window_matches_banded_reference(models, ref, kv_type, tol):
    toks = _toks(40, seed=1)  # 5 windows
    want = ref(toks)
    m = models(kv_type=kv_type)
    got = m.forward([(m.new_state(), toks)], all_logits=True)
    assert _rel(got, want) < tol
    # the window matters: an unwindowed reference is far away
    assert _rel(got, want) * 10 < _rel(got, _ref_no_window(ref, toks))


def _ref_no_window(ref, toks):
    orig = R.attention

    def full(ctx, q, k, v, scale, window=0, **kw):
        return orig(ctx, q, k, v, scale, 0, **kw)

    R.attention = full
    try:
        return ref(toks)
    finally:
        R.attention = orig


def test_token_by_token_equals_full_and_memory_stays_bounded(models):
    m = models(kv_type="f32")
    toks = _toks(40, seed=2)
    used = (m.pools["swa"].n_used, m.pools["kv"].n_used)
    s0 = m.new_state()
    full = m.forward([(s0, toks)], all_logits=True)
    s0.release()
    st = m.new_state()
    steps = []
    for t in toks:
        steps.append(m.forward([(st, [int(t)])])[0])
        assert st.caches["swa"].n_blocks <= WINDOW // BS + 1
    np.testing.assert_allclose(np.stack(steps), full, rtol=1e-4, atol=1e-4)
    # chunked prefill (chunks not aligned to blocks or windows) too
    st2 = m.new_state()
    outs = [m.forward([(st2, toks[i:i + 7])], all_logits=True) for i in range(0, 40, 7)]
    np.testing.assert_allclose(np.concatenate(outs), full, rtol=1e-4, atol=1e-4)
    # full layers keep everything, local ones only the window
    assert st.caches["kv"].n_tokens == 40 and st.caches["kv"].n_blocks == 10
    assert (st.caches["swa"].block_table[:6] == -1).all()
    for s in (st, st2):
        s.release()
    assert (m.pools["swa"].n_used, m.pools["kv"].n_used) == used


def test_fused_residual_stream_is_the_block_recipe(models, monkeypatch):
    """With post norms on both sublayers, run_blocks still gives the recipe bit for bit."""
    from test_models import check_fused_stream_is_the_recipe

    check_fused_stream_is_the_recipe(models(kv_type="f32"), _toks(23, seed=4), monkeypatch)


def test_batched_equals_alone(models):
    check_batched_equals_alone(models(kv_type="f32"), _toks)


def test_snapshot_restore_same_next_logits(models):
    m = models(kv_type="f32")
    toks = _toks(30, 6)
    st = m.new_state()
    m.forward([(st, toks)])
    snap = st.snapshot()
    want = m.forward([(st.fork(), [7])])[0]
    m.forward([(st, _toks(25, 7))])  # wander off, well past the window
    st.restore(snap)
    assert st.n_tokens == 30
    got = m.forward([(st, [7])])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert snap.nbytes < m.pools["kv"].bytes_per_block * 8 * 5  # window, not history
    st.release_snapshot(snap)
    st.release()


def test_trim_refused_where_window_is_gone(models, ref):
    m = models(kv_type="f32")
    toks = _toks(30, 8)
    st = m.new_state()
    m.forward([(st, toks[:-1])])
    assert st.can_trim(10)  # a step frees only what its own queries cannot see...
    m.forward([(st, toks[-1:])])  # ...so the blocks that left the window go with the next one
    assert not st.can_trim(10)
    got = st.trim(10)
    assert got > 10 and st.n_tokens == got and st.tokens == toks[:got].tolist()
    # what remains is really the state of the first `got` tokens
    nxt = m.forward([(st, [5])])[0]
    want = ref(np.concatenate([toks[:got], [5]]))[-1]
    assert _rel(nxt, want) < 2e-4
    # inside the window trimming works
    assert st.can_trim(st.n_tokens - 1)
    st.release()


def test_swa_full_keeps_everything_and_trims(models, ref):
    m = models(kv_type="f32", swa_full=True)
    toks = _toks(30, 9)
    st = m.new_state()
    m.forward([(st, toks)])
    assert not isinstance(st.caches["swa"], SWAKVCacheState)
    assert st.can_trim(3) and st.trim(3) == 3
    got = m.forward([(st, toks[3:20])], all_logits=True)
    assert _rel(got, ref(toks[:20])[3:]) < 2e-4
    st.release()


@pytest.mark.parametrize("kv_type,tol", [("q8_0", 0.03), ("q4_0", 0.3)])
def test_quantized_kv_close_to_f16(models, kv_type, tol):
    """Stated tolerance: std(logits - f16-KV logits) / std(f16-KV logits) < 3 % (q8_0), 30 % (q4_0: 4-bit KV is coarse)."""
    toks = _toks(40, 10)
    ref16 = models(kv_type="f16").forward([(models(kv_type="f16").new_state(), toks)], all_logits=True)
    m = models(kv_type=kv_type)
    got = m.forward([(m.new_state(), toks)], all_logits=True)
    assert float(np.std(got - ref16) / np.std(ref16)) < tol
    st = m.new_state()
    steps = np.stack([m.forward([(st, [int(t)])])[0] for t in toks[:20]])
    np.testing.assert_allclose(steps, got[:20], rtol=1e-3, atol=1e-3)


# ---- llama.cpp oracle ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_swa(conformance):
    return (load_model(conformance / "models" / "tiny-gemma3-swa.gguf"),
            load_oracle(conformance, "tiny-gemma3-swa"))


@pytest.mark.parametrize("name", PROMPTS)
def test_tiny_gemma3_swa_oracle(tiny_swa, name):
    model, oracle = tiny_swa
    p, ref = oracle_prompt(oracle, name)
    check(model, p, ref, max_rel_std=0.03, noise=0.3)


def test_tiny_gemma3_swa_window_is_strict(conformance, tiny_swa):
    """llama.cpp: key j visible to query p iff p - j < window (not <=): 31 or 33 is far off."""
    model, oracle = tiny_swa
    p, ref = oracle_prompt(oracle, "long")
    assert len(p["prompt_tokens"]) > 4 * model.window
    m = load_model(conformance / "models" / "tiny-gemma3-swa.gguf", swa_full=True)
    toks = np.asarray(p["prompt_tokens"], np.int32)
    rel = {}
    for w in (model.window - 1, model.window, model.window + 1):
        for blk in m.blocks:
            if blk.mixer.group == "swa":
                blk.mixer.window = w
        lg = m.forward([(m.new_state(), toks)])[0]
        rel[w] = float(np.std(lg - ref) / np.std(ref))
    assert rel[model.window] < 0.03 and min(rel[model.window - 1], rel[model.window + 1]) > 3 * rel[model.window]


@pytest.fixture(scope="module")
def gemma3_270m(conformance, gemma3_path):
    return load_model(gemma3_path), load_oracle(conformance, "gemma-3-270m-q4_k_m")


@pytest.mark.slow
@pytest.mark.parametrize("name", PROMPTS)
def test_gemma3_270m_oracle(gemma3_270m, name):
    model, oracle = gemma3_270m
    p, ref = oracle_prompt(oracle, name)
    last = check(model, p, ref, max_rel_std=0.06, noise=1.0)
    check_within_own_variation(last, p, ref)
