"""The engine's protocols are implemented in full by the real classes and by the fakes:
every member the protocol names exists (runtime_checkable isinstance), so the engine never
needs to probe what it holds."""
import numpy as np

from fakes import FakeModel, FakeTokenizer
from fixtures import built_model, tiny_models  # noqa: F401
from llmcore.cache.pool import BlockPool
from llmcore.cache.protocol import CacheState, Snapshot
from llmcore.cache.recurrent import RecurrentState
from llmcore.cache.state import KVCacheState
from llmcore.cache.swa import SWAKVCacheState
from llmcore.engine.protocols import LanguageModel, SequenceSnapshot, SequenceState, TextTokenizer


def test_fakes_implement_the_protocols():
    m = FakeModel()
    st = m.new_state()
    assert isinstance(m, LanguageModel) and isinstance(st, SequenceState)
    assert isinstance(st.snapshot(), SequenceSnapshot) and isinstance(FakeTokenizer(), TextTokenizer)


def test_real_model_and_states_implement_the_protocols(tiny_models):
    from llmcore.models import load_model

    m = load_model(tiny_models["llama-f32"])
    st = m.new_state()
    assert isinstance(m, LanguageModel) and isinstance(st, SequenceState)
    m.forward([(st, np.array([3, 4, 5], np.int32))])
    snap = st.snapshot()
    assert isinstance(snap, SequenceSnapshot)
    fp = snap.footprint()
    assert fp.blocks["kv"].tolist() == st.caches["kv"].block_table.tolist()
    st.release_snapshot(snap)


def test_real_tokenizer_implements_the_protocol(built_model):
    from llmcore.loader import load_gguf

    tok = load_gguf(built_model("chat")).tokenizer
    assert isinstance(tok, TextTokenizer)
    longest = max(len(tok.token_to_piece(i)) for i in range(tok.vocab_size))
    assert tok.max_piece_bytes == longest
    assert all(tok.is_eog(t) for t in tok.eog_ids)


def test_every_cache_kind_is_a_cache_state():
    pool = BlockPool(2, 1, 32, block_size=4, name="p")
    for c in (KVCacheState(pool), SWAKVCacheState(pool, window=8), RecurrentState([(3, 4)], [(4, 2)])):
        assert isinstance(c, CacheState), type(c)
        c.append(5)
        if isinstance(c, RecurrentState):
            c.layer(0)
        s = c.snapshot()
        assert isinstance(s, Snapshot) and s.n_tokens == 5
        fp = s.footprint()
        assert fp.own_bytes + sum(len(v) for v in fp.blocks.values()) > 0
        c.release_snapshot(s)
        c.release()
    assert pool.n_used == 0
