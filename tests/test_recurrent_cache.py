"""Recurrent state cache kind: in-place state, refused trims, checkpoints by copy, fork."""
import numpy as np
import pytest

from llmcore.cache import BlockPool, KVCacheState, SeqState
from llmcore.cache.recurrent import RecurrentSnapshot, RecurrentState

CONV = [(3, 8), (3, 8)]
SSM = [(8, 4), None]  # layer 1 is conv-only (lfm2-style)


def advance(st: RecurrentState, n: int, seed: int) -> None:
    """What a model does in one step: reserve n positions, then update every layer."""
    st.append(n)
    rng = np.random.default_rng(seed)
    for i in range(st.n_layers):
        conv, ssm = st.layer(i)
        conv += rng.standard_normal(conv.shape).astype(np.float32)
        if ssm is not None:
            ssm *= 0.5
            ssm += rng.standard_normal(ssm.shape).astype(np.float32)


def arrays(st: RecurrentState):
    out = []
    for i in range(st.n_layers):
        c, s = st.layer(i)
        out.append(c.copy())
        if s is not None:
            out.append(s.copy())
    return out


def test_lazy_allocation_and_bytes():
    st = RecurrentState(CONV, SSM)
    assert st.n_tokens == 0 and st.nbytes == 0  # nothing until used
    assert st.state_bytes == (3 * 8 + 8 * 4 + 3 * 8) * 4
    advance(st, 5, 0)
    assert st.n_tokens == 5 and st.nbytes == st.state_bytes
    conv, ssm = st.layer(1)
    assert conv.shape == (3, 8) and conv.dtype == np.float32 and ssm is None


def test_trim_only_to_current_length_or_zero():
    st = RecurrentState(CONV, SSM)
    advance(st, 5, 0)
    advance(st, 3, 1)
    before = arrays(st)
    assert st.can_trim(8) and not st.can_trim(5) and not st.can_trim(7)
    assert st.trim(5) == 8  # refused, reports the length it really has
    assert st.n_tokens == 8
    assert all(np.array_equal(a, b) for a, b in zip(before, arrays(st)))  # state untouched
    assert st.trim(100) == 8
    assert st.can_trim(0) and st.trim(0) == 0  # reset to the zero state is always possible
    assert st.n_tokens == 0 and st.nbytes == 0


def test_append_can_be_undone_until_the_state_moves():
    st = RecurrentState(CONV, SSM)
    advance(st, 4, 0)
    st.append(3)  # e.g. another cache of the same batch then fails to allocate
    assert st.can_trim(4) and st.trim(4) == 4 and st.n_tokens == 4
    st.append(3)
    st.layer(0)  # the model started writing: the old state is gone
    assert not st.can_trim(4) and st.trim(4) == 7


def test_snapshot_restore_is_a_copy():
    st = RecurrentState(CONV, SSM)
    advance(st, 6, 0)
    snap = st.snapshot()
    assert isinstance(snap, RecurrentSnapshot) and snap.n_tokens == 6
    assert snap.nbytes == st.state_bytes
    saved = arrays(st)
    advance(st, 2, 1)  # the running state moves on in place
    assert not np.array_equal(arrays(st)[0], saved[0])
    st.restore(snap)
    assert st.n_tokens == 6
    assert all(np.array_equal(a, b) for a, b in zip(saved, arrays(st)))
    advance(st, 2, 1)
    st.restore(snap)  # a snapshot can be restored again
    assert all(np.array_equal(a, b) for a, b in zip(saved, arrays(st)))
    st.release_snapshot(snap)
    # an empty state's snapshot restores to empty
    empty = RecurrentState(CONV, SSM)
    es = empty.snapshot()
    st.restore(es)
    assert st.n_tokens == 0 and st.nbytes == 0


def test_snapshot_in_the_middle_of_a_step_is_refused():
    st = RecurrentState(CONV, SSM)
    st.append(2)
    with pytest.raises(RuntimeError):
        st.snapshot()


def test_fork_is_independent():
    st = RecurrentState(CONV, SSM)
    advance(st, 4, 0)
    other = st.fork()
    saved = arrays(st)
    advance(other, 1, 5)
    assert other.n_tokens == 5 and st.n_tokens == 4
    assert all(np.array_equal(a, b) for a, b in zip(saved, arrays(st)))
    other.release()
    assert other.n_tokens == 0 and st.n_tokens == 4


def test_seqstate_trim_with_kv_and_recurrent():
    """A hybrid sequence (KV + recurrent) cannot go back where the recurrent part cannot."""
    pool = BlockPool(1, 1, 8, block_size=4)
    seq = SeqState({"kv": KVCacheState(pool), "rec": RecurrentState(CONV, SSM)})
    for c in seq.caches.values():
        c.append(10)
    seq.tokens.extend(range(10))
    seq.caches["rec"].layer(0)
    assert not seq.can_trim(6) and seq.can_trim(10) and seq.can_trim(0)
    assert seq.trim(6) == 10  # refused: every cache keeps all 10
    assert seq.caches["kv"].n_tokens == 10 and seq.n_tokens == 10
    assert seq.trim(0) == 0 and pool.n_used == 0
