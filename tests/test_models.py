"""Model framework: kernels path vs the NumPy reference, cache consistency, batching."""
import numpy as np
import pytest

from fixtures import N_VOCAB, named_model_loader, rand_tokens
from reference import reference_logits

from llmcore.cache import KVCacheFullError
from llmcore.errors import ModelLoadError
from llmcore.gguf_file import GGUFFile
from llmcore.models import get_model_class, load_model, supported_architectures

ARCHS = ["llama", "qwen3"]


def _tokens(n, seed=0):
    return rand_tokens(n, seed, N_VOCAB)


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-9))


@pytest.fixture(scope="module")
def models(tiny_models):
    return named_model_loader(tiny_models)


def test_registry():
    assert {"llama", "qwen3"} <= set(supported_architectures())
    assert get_model_class("llama").__name__ == "Llama"
    with pytest.raises(ModelLoadError, match="supported: .*llama"):
        get_model_class("nope")


def test_args_from_gguf(models):
    m = models("qwen3-f32")
    a = m.args
    assert (a.n_layer, a.n_embd, a.n_head, a.n_head_kv, a.head_dim, a.n_ff, a.n_vocab) == (2, 64, 4, 2, 32, 128, 256)
    assert m.n_vocab == 256 and m.n_ctx_train == 512
    # K + V, f16, per layer per kv head
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 32 * 2


def test_model_contract(models):
    """What the engine reads: arch, the pools made at load, one cache per group in each new
    state, and model-level counters (none for a dense model)."""
    m = models("qwen3-f32")
    assert m.arch == "qwen3" and set(m.pools) == {"kv"}
    st = m.new_state()
    assert list(st.caches) == ["kv"] and st.caches["kv"].pool is m.pools["kv"]
    assert m.new_state().caches["kv"] is not st.caches["kv"]
    assert m.stats() == {}


def plain_blocks(blocks, x, fb):
    """The block recipe applied one block at a time (no fused residual adds, no scratch)."""
    for blk in blocks:
        x = blk(x, fb)
    return x


def check_fused_stream_is_the_recipe(m, toks, monkeypatch):
    """models.blocks.run_blocks gives, bit for bit, the logits of applying each block's
    recipe in turn: prefill (all logits), decode steps, and a batch of two sequences."""
    from llmcore.models import base

    def run():
        a, b = m.new_state(), m.new_state()
        out = [m.forward([(a, toks)], all_logits=True)]
        out += [m.forward([(a, [int(t)])]) for t in toks[:3]]
        out.append(m.forward([(a, toks[3:6]), (b, toks[:9])], all_logits=True))
        out.append(m.forward([(a, [1]), (b, [2])]))
        a.release()
        b.release()
        return out

    fused = run()
    with monkeypatch.context() as mp:
        mp.setattr(base, "run_blocks", plain_blocks)
        plain = run()
    for f, p in zip(fused, plain):
        assert f.dtype == np.float32 and np.array_equal(f, p)


@pytest.mark.parametrize("name", ["llama-f32", "qwen3-q8_0"])
def test_fused_residual_stream_is_the_block_recipe(models, name, monkeypatch):
    check_fused_stream_is_the_recipe(models(name), _tokens(23, seed=4), monkeypatch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("wtype", ["f32", "f16", "q8_0", "q4_0"])
def test_full_sequence_matches_reference(models, tiny_models, arch, wtype):
    name = f"{arch}-{wtype}"
    toks = _tokens(40, seed=1)
    ref = reference_logits(tiny_models[name], toks)
    m = models(name, kv_type="f32")
    st = m.new_state()
    got = m.forward([(st, toks)], all_logits=True)
    assert got.shape == (40, N_VOCAB) and got.dtype == np.float32
    if wtype in ("f32", "f16"):
        assert _rel(got, ref) < 2e-4
    else:
        # the kernels quantize activations to 8-bit blocks (like llama.cpp): a few % off
        diff = got - ref
        assert float(np.std(diff) / np.std(ref)) < 0.04
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 0.3
        assert np.array_equal(got.argmax(1)[clear], ref.argmax(1)[clear])
    assert st.n_tokens == 40 and st.tokens == toks.tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_f16_kv_close_to_reference(models, tiny_models, arch):
    toks = _tokens(20, seed=2)
    ref = reference_logits(tiny_models[f"{arch}-f32"], toks)
    m = models(f"{arch}-f32")
    got = m.forward([(m.new_state(), toks)], all_logits=True)
    assert _rel(got, ref) < 5e-3


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantized_kv_cache(models, tiny_models, kv_type):
    toks = _tokens(24, seed=7)
    ref = reference_logits(tiny_models["qwen3-f32"], toks)
    m = models("qwen3-f32", kv_type=kv_type, block_size=8)
    assert m.pools["kv"].k[0].dtype == np.uint8
    full = m.forward([(m.new_state(), toks)], all_logits=True)
    diff = full - ref
    assert float(np.std(diff) / np.std(ref)) < (0.02 if kv_type == "q8_0" else 0.2)  # 4-bit KV is coarse
    st = m.new_state()
    steps = np.concatenate([m.forward([(st, toks[i:i + 1])]) for i in range(len(toks))])
    np.testing.assert_allclose(steps, full, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_token_by_token_equals_full(models, arch):
    m = models(f"{arch}-f32", block_size=8)
    toks = _tokens(21, seed=3)
    full = m.forward([(m.new_state(), toks)], all_logits=True)
    st = m.new_state()
    steps = np.concatenate([m.forward([(st, toks[i:i + 1])]) for i in range(len(toks))])
    np.testing.assert_allclose(steps, full, rtol=1e-3, atol=1e-3)
    # chunked prefill (uneven chunks crossing block boundaries)
    st2 = m.new_state()
    parts = [m.forward([(st2, c)], all_logits=True) for c in np.split(toks, [5, 6, 17])]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_equals_alone(models, arch):
    m = models(f"{arch}-q8_0", block_size=8)
    prompts = [_tokens(n, seed=10 + n) for n in (3, 17, 9)]
    alone = []
    for p in prompts:
        st = m.new_state()
        alone.append(m.forward([(st, p)])[0])
        alone.append(m.forward([(st, np.array([7], np.int32))])[0])
    sts = [m.new_state() for _ in prompts]
    first = m.forward(list(zip(sts, prompts)))
    # mixed step: one decode token each, and one sequence gets 2 tokens
    second = m.forward([(sts[0], [7]), (sts[1], [7]), (sts[2], [7])])
    for i in range(3):
        np.testing.assert_allclose(first[i], alone[2 * i], rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(second[i], alone[2 * i + 1], rtol=1e-3, atol=1e-3)
    # segments with different lengths in one step, all logits
    a, b = m.new_state(), m.new_state()
    m.forward([(a, prompts[0])])
    allv = m.forward([(a, prompts[1][:4]), (b, prompts[2])], all_logits=True)
    assert allv.shape == (4 + 9, N_VOCAB)
    ref_b = m.forward([(m.new_state(), prompts[2])], all_logits=True)
    np.testing.assert_allclose(allv[4:], ref_b, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_trim_and_refeed_equals_fresh(models, arch):
    m = models(f"{arch}-f32", block_size=8)
    toks = _tokens(30, seed=4)
    other = _tokens(12, seed=5)
    st = m.new_state()
    m.forward([(st, toks)])
    used = m.pools["kv"].n_used
    assert st.can_trim(13)
    assert st.trim(13) == 13 and st.n_tokens == 13 and st.tokens == toks[:13].tolist()
    assert m.pools["kv"].n_used == used - (4 - 2)
    got = m.forward([(st, other)], all_logits=True)
    fresh = m.forward([(m.new_state(), np.concatenate([toks[:13], other]))], all_logits=True)[13:]
    np.testing.assert_allclose(got, fresh, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_snapshot_and_fork_share_blocks(models, arch):
    m = models(f"{arch}-f32", block_size=8)
    pool = m.pools["kv"]
    toks = _tokens(20, seed=6)   # 2.5 blocks: the last block is partially filled
    base = pool.n_used  # blocks held by other tests' states on this shared model
    st = m.new_state()
    m.forward([(st, toks)])
    used = pool.n_used
    assert used == base + 3
    snap = st.snapshot()
    blocks = st.caches["kv"].block_table.copy()
    assert pool.n_used == used and all(pool.refcount[blocks] == 2)
    child = st.fork()
    assert np.array_equal(child.caches["kv"].block_table, blocks) and all(pool.refcount[blocks] == 3)
    # divergent continuations: both write into the shared last block -> copy-on-write
    la = m.forward([(st, [1, 2])])
    lb = m.forward([(child, [3])])
    assert pool.n_used == used + 2  # one copied last block for each writer
    assert st.caches["kv"].block_table[-1] != blocks[-1] != child.caches["kv"].block_table[-1]
    sa, sb = m.new_state(), m.new_state()
    fa = m.forward([(sa, np.concatenate([toks, [1, 2]]))])
    fb = m.forward([(sb, np.concatenate([toks, [3]]))])
    sa.release()
    sb.release()
    np.testing.assert_allclose(la, fa, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(lb, fb, rtol=1e-3, atol=1e-3)
    # restoring the snapshot gives the original prefix back, unchanged by the writes
    st.restore(snap)
    assert st.tokens == toks.tolist()
    lr = m.forward([(st, [3])])
    np.testing.assert_allclose(lr, fb, rtol=1e-3, atol=1e-3)
    st.release_snapshot(snap)
    st.release()
    child.release()
    assert pool.n_used == base


def test_kv_limit_raises_and_rolls_back(tiny_models):
    m = load_model(tiny_models["llama-f32"], block_size=8, max_kv_blocks=4)
    a, b = m.new_state(), m.new_state()
    m.forward([(a, _tokens(20))])  # 3 blocks
    with pytest.raises(KVCacheFullError):
        m.forward([(a, [1]), (b, _tokens(17))])  # needs 3 more, 1 free
    assert a.n_tokens == 20 and b.n_tokens == 0 and m.pools["kv"].n_used == 3
    m.forward([(a, [1]), (b, [2])])  # still usable
    assert a.n_tokens == 21 and b.n_tokens == 1


def test_load_from_gguffile_and_errors(tiny_models, tmp_path):
    m = load_model(GGUFFile(tiny_models["qwen3-f32"]))
    assert m.args.arch == "qwen3"
    st = m.new_state()
    with pytest.raises(ValueError):
        m.forward([(st, [N_VOCAB])])
    with pytest.raises(ValueError):
        m.forward([(st, [])])
    assert st.n_tokens == 0 and m.pools["kv"].n_used == 0
