"""qwen3moe: the model vs the NumPy reference (tests/reference_archs.py), cache consistency,
batching, expert statistics, and the conformance set vs llama.cpp."""
import numpy as np
import pytest

import reference_archs as R
from fixtures import N_VOCAB, QWEN3MOE, named_model_loader, rand_tokens
from oracle import PROMPTS, check, load_oracle, oracle_prompt

from llmcore.models import load_model, supported_architectures

N_LAYER, N_EXPERT, N_USED = QWEN3MOE["n_layer"], QWEN3MOE["n_expert"], QWEN3MOE["n_expert_used"]


@pytest.fixture(scope="module")
def moe_files(built_model):
    return {wt: built_model(f"qwen3moe-{wt}") for wt in ("f32", "q8_0")}


@pytest.fixture(scope="module")
def models(moe_files):
    return named_model_loader(moe_files)


def _tokens(n, seed=0):
    return rand_tokens(n, seed, N_VOCAB)


def _ref(path, toks, emulate=False):
    W, meta = R.load_gguf(path)
    return R.forward_qwen3moe(W, meta, list(map(int, toks)), emulate=emulate)


def test_registered(models):
    assert "qwen3moe" in supported_architectures()
    m = models("f32")
    assert type(m).__name__ == "Qwen3MoE"
    moe = m.blocks[0].ffn
    assert (moe.n_expert, moe.n_used) == (N_EXPERT, N_USED)


def test_full_sequence_matches_reference_f32(models, moe_files):
    toks = _tokens(40, seed=1)
    ref = _ref(moe_files["f32"], toks)
    m = models("f32", kv_type="f32")
    got = m.forward([(m.new_state(), toks)], all_logits=True)
    assert got.shape == (40, N_VOCAB)
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) < 2e-4


def test_full_sequence_matches_reference_q8_0(models, moe_files):
    toks = _tokens(40, seed=2)
    ref = _ref(moe_files["q8_0"], toks, emulate=True)
    m = models("q8_0", kv_type="f32")
    got = m.forward([(m.new_state(), toks)], all_logits=True)
    # activation rounding is emulated by the reference; expert choices may flip on near-ties
    assert float(np.std(got - ref) / np.std(ref)) < 0.03
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.3
    assert np.mean(got.argmax(1)[clear] == ref.argmax(1)[clear]) > 0.9


def test_token_by_token_equals_full(models):
    m = models("f32", block_size=8)
    toks = _tokens(21, seed=3)
    full = m.forward([(m.new_state(), toks)], all_logits=True)
    st = m.new_state()
    steps = np.concatenate([m.forward([(st, toks[i:i + 1])]) for i in range(len(toks))])
    np.testing.assert_allclose(steps, full, rtol=1e-3, atol=1e-3)
    st2 = m.new_state()
    parts = [m.forward([(st2, c)], all_logits=True) for c in np.split(toks, [5, 6, 17])]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=1e-3, atol=1e-3)


def test_batched_equals_alone(models):
    m = models("q8_0", block_size=8)
    prompts = [_tokens(n, seed=10 + n) for n in (3, 17, 9)]
    alone = []
    for p in prompts:
        st = m.new_state()
        alone.append(m.forward([(st, p)])[0])
        alone.append(m.forward([(st, np.array([7], np.int32))])[0])
        st.release()
    sts = [m.new_state() for _ in prompts]
    first = m.forward(list(zip(sts, prompts)))
    second = m.forward([(s, [7]) for s in sts])
    for i in range(3):
        np.testing.assert_allclose(first[i], alone[2 * i], rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(second[i], alone[2 * i + 1], rtol=1e-3, atol=1e-3)
    for s in sts:
        s.release()


def test_snapshot_restore_and_trim(models):
    m = models("f32", block_size=8)
    toks, other = _tokens(20, seed=4), _tokens(6, seed=5)
    st = m.new_state()
    m.forward([(st, toks)])
    snap = st.snapshot()
    want = m.forward([(st.fork(), other)], all_logits=True)
    m.forward([(st, _tokens(9, seed=6))])
    st.restore(snap)
    got = m.forward([(st, other)], all_logits=True)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    st.release_snapshot(snap)
    assert st.can_trim(13) and st.trim(13) == 13
    fresh = m.forward([(m.new_state(), np.concatenate([toks[:13], other]))], all_logits=True)[13:]
    np.testing.assert_allclose(m.forward([(st, other)], all_logits=True), fresh, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kv_type,tol", [("q8_0", 0.02), ("q4_0", 0.3)])
def test_quantized_kv_close_to_f16(models, kv_type, tol):
    # 4-bit KV is coarse, and on MoE its error also flips some expert choices: 0.3 for q4_0
    toks = _tokens(24, seed=7)
    ref = models("f32").forward([(models("f32").new_state(), toks)], all_logits=True)
    got = models("f32", kv_type=kv_type, block_size=8).forward(
        [(models("f32", kv_type=kv_type, block_size=8).new_state(), toks)], all_logits=True)
    assert float(np.std(got - ref) / np.std(ref)) < tol


def test_expert_stats_count_computed_and_skipped(models):
    m = models("f32")
    m.moe_stats.reset()
    m.forward([(m.new_state(), [5])])
    s = m.moe_stats
    # one token, k=2 experts per layer: 2 computed, 6 skipped in each of the 2 layers
    assert (s.calls, s.tokens, s.pairs) == (N_LAYER, N_LAYER, N_LAYER * N_USED)
    assert s.experts_computed == N_LAYER * N_USED and s.experts_skipped == N_LAYER * (N_EXPERT - N_USED)
    m.moe_stats.reset()
    m.forward([(m.new_state(), _tokens(64, seed=8))])
    assert s.experts_computed + s.experts_skipped == N_LAYER * N_EXPERT
    assert s.pairs == 64 * N_USED * N_LAYER and int(s.per_expert.sum()) == s.pairs
    # the model-level counters the engine reads
    st = m.stats()
    assert st["moe_experts_computed"] == s.experts_computed and st["moe_experts_skipped"] == s.experts_skipped
    assert st["moe_pairs"] == s.pairs


# ---- conformance: llama.cpp oracles ---------------------------------------------------------
CONF = {"tiny-qwen3moe-f16": dict(max_rel_std=2e-3, noise=0.1),
        "tiny-qwen3moe-q8_0": dict(max_rel_std=0.06, noise=0.3),
        "tiny-qwen3moe-q4_0": dict(max_rel_std=0.06, noise=0.3),
        "tiny-qwen3moe-q4_k": dict(max_rel_std=0.06, noise=0.3)}


@pytest.fixture(scope="module")
def conf_models(conformance):
    cache = {}

    def get(stem):
        if stem not in cache:
            cache[stem] = load_model(conformance / "models" / f"{stem}.gguf"), load_oracle(conformance, stem)
        return cache[stem]

    return get


@pytest.mark.parametrize("name", PROMPTS)
@pytest.mark.parametrize("stem", list(CONF))
def test_conformance(conf_models, stem, name):
    model, oracle = conf_models(stem)
    p, ref = oracle_prompt(oracle, name)
    check(model, p, ref, **CONF[stem])


def test_bf16_norms_and_routers_equal_their_f32_copy(built_model):
    """Files keep small tensors (norms, routers) in BF16: they load and give the logits of
    the same model with those values in F32."""
    from gguf import GGMLQuantizationType as QT

    from llmcore.gguf_file import GGUFFile

    bf16, f32 = built_model("qwen3moe-bf16"), built_model("qwen3moe-f32-bf16")
    types = {t.name: int(t.ggml_type) for t in GGUFFile(bf16).tensors.values()}
    assert types["blk.0.ffn_gate_inp.weight"] == types["blk.1.attn_q_norm.weight"] == QT.BF16
    assert types["blk.0.attn_q.weight"] == QT.F32
    assert int(GGUFFile(f32).tensors["blk.0.ffn_gate_inp.weight"].ggml_type) == QT.F32
    toks = _tokens(30, seed=6)
    got, want = (load_model(p, kv_type="f32") for p in (bf16, f32))
    a = got.forward([(got.new_state(), toks)], all_logits=True)
    b = want.forward([(want.new_state(), toks)], all_logits=True)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
