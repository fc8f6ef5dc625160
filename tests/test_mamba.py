"""mamba and mamba2: the NumPy reference, recurrent state through the cache (token-by-token =
full sequence, checkpoints, refused trims, batched sequences) on the tiny models of
fixtures.py, and llama.cpp's oracle on the conformance set."""
import numpy as np
import pytest

from fixtures import TOKENIZER_VOCAB
from llmcore.cache.recurrent import RecurrentState
from llmcore.models import load_model
from oracle import PROMPTS, check, load_oracle, oracle_prompt

ARCHS = ["mamba", "mamba2"]


def _tokens(n, seed=0):
    return np.random.default_rng(seed).integers(1, TOKENIZER_VOCAB, size=n).astype(np.int32)


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, built_model):
    path = built_model(request.param)
    return path, load_model(path)


@pytest.fixture(scope="module")
def conf_models(conformance):
    cache = {}

    def get(stem):
        if stem not in cache:
            cache[stem] = load_model(conformance / "models" / f"{stem}.gguf"), load_oracle(conformance, stem)
        return cache[stem]

    return get


@pytest.mark.parametrize("name", PROMPTS)
@pytest.mark.parametrize("stem", ["tiny-mamba", "tiny-mamba2"])
def test_oracle(conf_models, stem, name):
    model, oracle = conf_models(stem)
    p, ref = oracle_prompt(oracle, name)
    # Q8_0 weights: ~2 % from llama.cpp (README: 1.5-5 % without exact activation rounding)
    check(model, p, ref, max_rel_std=0.05, noise=0.3)


def test_numpy_reference(tiny):
    ra = pytest.importorskip("reference_archs")
    path, model = tiny
    w, meta = ra.load_gguf(path)
    toks = _tokens(40, 1)
    want = ra.forward(w, meta, toks.tolist(), emulate=True)
    got = model.forward([(model.new_state(), toks)], all_logits=True)
    assert float(np.std(got - want) / np.std(want)) < 0.03


def test_state_is_recurrent(tiny):
    _, model = tiny
    st = model.new_state()
    rec = st.caches["rec"]
    assert isinstance(rec, RecurrentState) and model.pools == {}  # no KV at all
    model.forward([(st, _tokens(7))])
    assert rec.n_tokens == 7 and rec.nbytes == model.state_bytes
    model.forward([(st, _tokens(50, 2))])
    assert rec.nbytes == model.state_bytes  # fixed size, whatever the length


def test_token_by_token_equals_full(tiny):
    _, model = tiny
    toks = _tokens(24)
    full = model.forward([(model.new_state(), toks)], all_logits=True)
    st = model.new_state()
    steps = np.stack([model.forward([(st, [t])])[0] for t in toks])
    assert _rel(steps, full) < 1e-4
    st2 = model.new_state()  # uneven chunks
    chunks = [model.forward([(st2, c)], all_logits=True) for c in np.split(toks, [5, 6, 17])]
    assert _rel(np.concatenate(chunks), full) < 1e-4


def test_snapshot_restore_same_next_logits(tiny):
    _, model = tiny
    toks = _tokens(20, 3)
    st = model.new_state()
    model.forward([(st, toks[:12])])
    snap = st.snapshot()  # context checkpoint at 12
    assert snap.nbytes == model.state_bytes
    want = model.forward([(st, toks[12:])])[0]  # never left
    model.forward([(st, _tokens(9, 4))])  # diverge: the state moves on in place
    assert not st.can_trim(12) and st.trim(12) == st.n_tokens == 29  # refused, not wrong
    st.restore(snap)
    assert st.n_tokens == 12
    got = model.forward([(st, toks[12:])])[0]
    assert _rel(got, want) < 1e-5
    other = model.new_state()  # a checkpoint restores into another sequence too
    other.restore(snap)
    assert _rel(model.forward([(other, toks[12:])])[0], want) < 1e-5


def test_trim_zero_and_fork(tiny):
    _, model = tiny
    toks = _tokens(15, 5)
    st = model.new_state()
    first = model.forward([(st, toks)])[0]
    fork = st.fork()
    a = model.forward([(fork, [7])])[0]
    b = model.forward([(st, [7])])[0]
    assert _rel(a, b) < 1e-6  # the fork carried the same state, independently
    assert st.trim(0) == 0 and st.caches["rec"].nbytes == 0
    assert _rel(model.forward([(st, toks)])[0], first) < 1e-5


def test_batched_equals_alone(tiny):
    _, model = tiny
    a, b, c = _tokens(9, 6), _tokens(4, 7), _tokens(13, 8)
    sa, sb = model.new_state(), model.new_state()
    model.forward([(sa, a)])  # sa is mid-conversation, sb fresh
    alone_a = model.forward([(sa.fork(), c)])[0]
    alone_b = model.forward([(model.new_state(), b)])[0]
    got = model.forward([(sa, c), (sb, b)])
    assert _rel(got[0], alone_a) < 1e-5 and _rel(got[1], alone_b) < 1e-5
    # and the states carried on correctly: one decode step each, batched vs alone
    ra = model.forward([(sa.fork(), [3])])[0]
    rb = model.forward([(sb.fork(), [5])])[0]
    got = model.forward([(sb, [5]), (sa, [3])])
    assert _rel(got[0], rb) < 1e-5 and _rel(got[1], ra) < 1e-5


def _greedy(model, prompt, n):
    st = model.new_state()
    logits, out = model.forward([(st, np.asarray(prompt, np.int32))])[0], []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = model.forward([(st, [out[-1]])])[0]
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_checkpoint_on_divergence(built_model, arch):
    """Through the engine: a request that diverges from the slot's tokens restores the
    newest recurrent checkpoint before the divergence and generates what a fresh run does."""
    from llmcore.engine import Engine, EngineConfig, GenParams
    from llmcore.sampling import SamplingParams

    eng = Engine.from_path(built_model(arch), EngineConfig(n_parallel=1, checkpoint_every_n_tokens=16, cache_ram_mib=0))
    eng.start()
    try:
        assert eng.wait_ready(60)
        gp = GenParams(n_predict=4, ignore_eos=True, sampling=SamplingParams(temperature=0.0))
        p1 = _tokens(40, 20).tolist()
        p2 = p1[:30] + _tokens(10, 21).tolist()
        c1 = eng.generate_sync(p1, gp)
        c2 = eng.generate_sync(p2, gp)
        model = eng.model
        assert c1.tokens == _greedy(model, p1, 4)
        assert c2.tokens == _greedy(model, p2, 4)
        s = eng.stats()
        # resumed from the checkpoint at 16, not re-prefilled from 0
        assert s.checkpoints_restored >= 1 and s.forced_reprefills == 0 and s.checkpoints_bytes > 0
    finally:
        eng.stop()
