"""The prompt cache's disk tier, on the real tiny models: a conversation served by one
engine, stopped cleanly, comes back on a new engine over the same model and directory
from disk, with exactly the tokens and log-probabilities it gets without a restart;
damaged, truncated and foreign files are misses; the budget holds; no step waits on disk.

Dense llama (full KV), gemma3 with a 32-token sliding window (windowed KV: its blocks and
checkpoints round-trip) and mamba2 (recurrent state and checkpoints).
"""
import errno
import threading
import time

import numpy as np
import pytest

from llmcore.cache import disk as disk_mod
from llmcore.cache import state_file as sf
from llmcore.engine import Engine, EngineConfig, GenParams
from llmcore.gguf_file import GGUFFile
from llmcore.models import load_model
from llmcore.sampling import SamplingParams


def gp(**kw):
    kw.setdefault("sampling", SamplingParams(temperature=0.0, n_probs=4))
    kw.setdefault("n_predict", 4)
    kw.setdefault("ignore_eos", True)
    return GenParams(**kw)


def start(path, **cfg):
    cfg.setdefault("n_ctx", 1024)
    cfg.setdefault("n_ubatch", 64)
    cfg.setdefault("checkpoint_every_n_tokens", 64)
    if "tokenizer.ggml.model" not in GGUFFile(path).meta:  # a byte-level fake instead
        from fakes import FakeTokenizer

        ec = EngineConfig(**cfg)
        eng = Engine(ec, model=load_model(path, **ec.model_options()), tokenizer=FakeTokenizer())
    else:
        eng = Engine.from_path(path, EngineConfig(**cfg))
    eng.start()
    assert eng.wait_ready(120), eng.load_error
    return eng


def wait_indexed(eng, timeout=30):
    end = time.monotonic() + timeout
    while not eng.disk.ready and time.monotonic() < end:
        time.sleep(0.01)
    assert eng.disk.ready


def toks(seed, n, lo=3, hi=250):
    return np.random.default_rng(seed).integers(lo, hi, size=n).tolist()


def files(d):
    return sorted(p for p in d.iterdir() if p.name.endswith(sf.SUFFIX))


def identical(c, ref):
    assert c.tokens == ref.tokens
    assert [s.logprob for s in c.samples] == [s.logprob for s in ref.samples]
    for a, b in zip(c.samples, ref.samples):
        assert [(t.id, t.logprob) for t in a.top] == [(t.id, t.logprob) for t in b.top]


MODELS = {"llama": lambda tm, bm: tm["llama-f32"], "gemma3-swa": lambda tm, bm: bm("gemma3-swa"),
          "mamba2": lambda tm, bm: bm("mamba2")}


@pytest.fixture(params=list(MODELS))
def model_path(request, tiny_models, built_model):
    return MODELS[request.param](tiny_models, built_model)


def conversation(path, cache_dir):
    """Engine A serves turn 1 and stops; returns (turn 2 prompt, the reference: turn 2
    on an engine that served turn 1 and was not restarted)."""
    p1 = toks(1, 150)
    a = start(path, cache_dir=str(cache_dir))
    r1 = a.generate_sync(p1, gp())
    a.stop()
    p2 = p1 + r1.tokens + toks(2, 40)
    ref_eng = start(path)
    try:
        assert ref_eng.generate_sync(p1, gp()).tokens == r1.tokens
        ref = ref_eng.generate_sync(p2, gp())
    finally:
        ref_eng.stop()
    assert ref.final.timings.cache_n > 0
    return p2, ref


def test_conversation_comes_back_from_disk_after_a_restart(model_path, tmp_path):
    d = tmp_path / "cache"
    p2, ref = conversation(model_path, d)
    assert len(files(d)) == 1
    b = start(model_path, cache_dir=str(d))
    try:
        out = b.generate_sync(p2, gp())
        t = out.final.timings
        assert t.cache_source == "disk" and t.cache_n == ref.final.timings.cache_n > 100
        identical(out, ref)
        st = b.stats()
        assert st.disk_hits == 1 and st.disk_loads == 1 and st.disk_load_failures == 0
        # the same conversation again: now from the slot, the disk read happened once
        again = b.generate_sync(p2, gp())
        assert again.final.timings.cache_source in ("slot", "checkpoint") and b.stats().disk_loads == 1
    finally:
        b.stop()


def corrupt_payload(p):
    data = bytearray(p.read_bytes())
    data[-100] ^= 0xFF
    p.write_bytes(bytes(data))


def truncate(p):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 4096])


@pytest.mark.parametrize("damage", [corrupt_payload, truncate])
def test_damaged_file_is_a_miss(tiny_models, tmp_path, damage):
    path = tiny_models["llama-f32"]
    d = tmp_path / "cache"
    p2, ref = conversation(path, d)
    (f,) = files(d)
    damage(f)
    b = start(path, cache_dir=str(d))
    try:
        out = b.generate_sync(p2, gp())
        assert out.final.timings.cache_n == 0 and out.final.timings.cache_source == "none"
        assert out.tokens == ref.tokens  # recomputed: same greedy tokens
        st = b.stats()
        assert st.disk_load_failures == 1 and st.disk_hits == 0
        assert not f.exists()  # ours and useless: removed
    finally:
        b.stop()


def test_foreign_fingerprint_is_a_miss_and_left_alone(tiny_models, tmp_path):
    path = tiny_models["llama-f32"]
    d = tmp_path / "cache"
    p2, _ = conversation(path, d)
    (f,) = files(d)
    b = start(path, cache_dir=str(d), cache_type_k="f32", cache_type_v="f32")  # other KV bytes
    try:
        wait_indexed(b)
        out = b.generate_sync(p2, gp())
        assert out.final.timings.cache_n == 0 and b.stats().disk_loads == 0
        assert b.stats().cache_disk_entries == 0
    finally:
        b.stop()
    assert f.exists()  # another configuration's file: never deleted


def test_another_model_file_is_foreign(tiny_models, tmp_path):
    d = tmp_path / "cache"
    p2, _ = conversation(tiny_models["llama-f32"], d)
    b = start(tiny_models["llama-f16"], cache_dir=str(d))  # same shapes, other weights
    try:
        wait_indexed(b)
        assert b.stats().cache_disk_entries == 0
        assert b.generate_sync(p2, gp()).final.timings.cache_n == 0
    finally:
        b.stop()


def test_disk_budget_holds(tiny_models, tmp_path):
    path = tiny_models["llama-f32"]
    d = tmp_path / "cache"
    eng = start(path, cache_dir=str(d), cache_ram_mib=1, cache_disk_mib=1, n_parallel=1)
    try:
        wait_indexed(eng)
        for i in range(48):  # ~57 KB of KV each: far more than 1 MiB of RAM and of disk
            eng.generate_sync(toks(100 + i, 200), gp(n_predict=1))
        assert eng.sync_disk()
        st = eng.stats()
        assert st.cache_ram_evictions > 10 and st.disk_writes > 10 and st.cache_disk_evictions > 0
        assert 0 < st.cache_disk_bytes <= 1 << 20
    finally:
        eng.stop()
    on_disk = sum(p.stat().st_size for p in files(d))
    assert 0 < on_disk <= 1 << 20
    b = start(path, cache_dir=str(d), cache_disk_mib=1)
    try:  # the most recent ones survived the restart and are found
        wait_indexed(b)
        assert b.stats().cache_disk_bytes == on_disk
        out = b.generate_sync(toks(147, 200) + toks(5, 20), gp(n_predict=1))
        assert out.final.timings.cache_source == "disk" and out.final.timings.cache_n == 200
    finally:
        b.stop()


def test_a_slow_disk_never_stalls_a_step(tiny_models, tmp_path, monkeypatch):
    """A request waiting for its state from a slow disk lets another run meanwhile, then
    gets its state."""
    path = tiny_models["llama-f32"]
    d = tmp_path / "cache"
    p2, ref = conversation(path, d)
    gate = threading.Event()
    real = disk_mod.read_state_file

    def slow_read(*a, **kw):
        gate.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(disk_mod, "read_state_file", slow_read)
    b = start(path, cache_dir=str(d), n_parallel=2)
    try:
        wait_indexed(b)
        waiting = b.submit(p2, gp(), sync=True)
        other = b.generate_sync(toks(9, 60), gp(n_predict=8))  # served while the read hangs
        assert len(other.tokens) == 8 and not waiting.done
        gate.set()
        out = waiting.collect_sync()
        assert out.final.timings.cache_source == "disk"
        identical(out, ref)
    finally:
        gate.set()
        b.stop()


def test_a_read_slower_than_the_wait_is_a_miss(tiny_models, tmp_path, monkeypatch):
    path = tiny_models["llama-f32"]
    d = tmp_path / "cache"
    p2, ref = conversation(path, d)
    gate = threading.Event()
    real = disk_mod.read_state_file
    monkeypatch.setattr(disk_mod, "read_state_file", lambda *a, **kw: (gate.wait(30), real(*a, **kw))[1])
    b = start(path, cache_dir=str(d), cache_disk_wait_s=0.2)
    try:
        wait_indexed(b)
        out = b.generate_sync(p2, gp())
        assert out.final.timings.cache_n == 0 and out.tokens == ref.tokens
        assert b.stats().disk_wait_timeouts == 1
    finally:
        gate.set()
        b.stop()


def test_full_disk_is_a_counted_failure_not_a_crash(tiny_models, tmp_path, monkeypatch):
    path = tiny_models["llama-f32"]

    def enospc(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_mod, "write_state_file", enospc)
    eng = start(path, cache_dir=str(tmp_path / "cache"), cache_ram_mib=1, n_parallel=1)
    try:
        wait_indexed(eng)
        for i in range(30):
            assert len(eng.generate_sync(toks(200 + i, 200), gp(n_predict=2)).tokens) == 2
        assert eng.sync_disk()
        st = eng.stats()
        assert st.disk_write_failures > 0 and st.disk_writes == 0 and st.cache_disk_entries == 0
        assert st.cache_disk_pending_bytes == 0  # failed writes gave their states back
    finally:
        eng.stop()
    assert not any((tmp_path / "cache").iterdir())  # no temporary file left behind


def test_read_only_directory_serves_what_it_has(tiny_models, tmp_path, monkeypatch):
    path = tiny_models["llama-f32"]
    d = tmp_path / "cache"
    p2, ref = conversation(path, d)
    monkeypatch.setattr(disk_mod, "dir_writable", lambda _d: False)
    b = start(path, cache_dir=str(d))
    try:
        out = b.generate_sync(p2, gp())
        assert out.final.timings.cache_source == "disk"
        identical(out, ref)
    finally:
        b.stop()
    assert len(files(d)) == 1  # nothing written at stop
    assert b.stats().disk_write_failures >= 1


def test_stale_temporary_file_is_removed(tiny_models, tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    stale = d / ".x.llmstate.999999999.1.tmp"  # a writer that died (no such pid)
    stale.write_bytes(b"half a file")
    eng = start(tiny_models["llama-f32"], cache_dir=str(d))
    try:
        wait_indexed(eng)
        assert not stale.exists()
    finally:
        eng.stop()


# ---- the file format ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "gemma3-swa", "mamba2"])
def test_state_file_round_trip_is_exact(tiny_models, built_model, tmp_path, name):
    """A state with its checkpoints, written and read back into another instance of the
    model, continues exactly as the original (logits bit for bit), also from a checkpoint."""
    path = MODELS[name](tiny_models, built_model)
    from llmcore.cache.checkpoints import restore_checkpoint, take_checkpoint

    m = load_model(path, block_size=16)
    st = m.new_state()
    prompt = np.array(toks(3, 120, hi=200), dtype=np.int32)
    m.forward([(st, prompt[:70])])
    ck = take_checkpoint(st, "user")
    m.forward([(st, prompt[70:])])
    snap = st.snapshot()
    fp = sf.model_fingerprint(m, st)
    f = tmp_path / ("s" + sf.SUFFIX)
    size = sf.write_state_file(f, fp, sf.export_state(st, snap, [ck] if ck else [], st.min_trim()))
    assert f.stat().st_size == size
    h = sf.read_header(f)
    assert h.fingerprint == fp.digest and h.tokens.tolist() == prompt.tolist()
    assert h.checkpoint_positions == ((70,) if ck else ())

    m2 = load_model(path, block_size=16)
    st2 = m2.new_state()
    assert sf.model_fingerprint(m2, st2).digest == fp.digest
    snap2, cks2 = sf.import_state(st2, sf.read_state_file(f, fp))
    st2.restore(snap2)
    more = np.array(toks(4, 9, hi=200), dtype=np.int32)
    np.testing.assert_array_equal(m2.forward([(st2, more)]), m.forward([(st, more)]))
    if ck is not None:  # back to the checkpoint in both, then the same tokens
        st.restore(snap)
        st2.restore(snap2)
        restore_checkpoint(st, ck)
        restore_checkpoint(st2, cks2[0])
        np.testing.assert_array_equal(m2.forward([(st2, more)]), m.forward([(st, more)]))


def test_reading_checks_magic_length_checksums_and_fingerprint(tiny_models, tmp_path):
    m = load_model(tiny_models["llama-f32"])
    st = m.new_state()
    m.forward([(st, np.arange(3, 60, dtype=np.int32))])
    fp = sf.model_fingerprint(m, st)
    f = tmp_path / ("a" + sf.SUFFIX)
    sf.write_state_file(f, fp, sf.export_state(st, st.snapshot()))
    good = f.read_bytes()
    assert sf.read_state_file(f, fp).n_tokens == 57
    with pytest.raises(sf.StateFileForeign):
        sf.read_state_file(f, sf.Fingerprint("0" * 64))
    for bad in (b"NOTSTATE" + good[8:], good[:-1], good[:20]):
        f.write_bytes(bad)
        with pytest.raises(sf.StateFileCorrupt):
            sf.read_header(f)
    hdr = bytearray(good)
    hdr[60] ^= 1  # inside the JSON header
    f.write_bytes(bytes(hdr))
    with pytest.raises(sf.StateFileCorrupt):
        sf.read_header(f)
    body = bytearray(good)
    body[-1000] ^= 1
    f.write_bytes(bytes(body))
    sf.read_header(f)  # the header is fine: the index would list it
    with pytest.raises(sf.StateFileCorrupt, match="checksum"):
        sf.read_state_file(f, fp)


def test_import_refuses_a_state_of_other_shapes(tiny_models, tmp_path):
    from llmcore.cache.protocol import SnapshotFormatError

    a = load_model(tiny_models["llama-f32"])
    b = load_model(tiny_models["qwen3-f32"])  # other head dim
    st = a.new_state()
    a.forward([(st, np.arange(3, 40, dtype=np.int32))])
    contents = sf.export_state(st, st.snapshot()).loaded()
    sb = b.new_state()
    with pytest.raises(SnapshotFormatError):
        sf.import_state(sb, contents)
    assert all(p.n_used == 0 for p in b.pools.values())  # nothing taken


# ---- spilling without the engine thread (this test is the owner) ---------------------------

def spill_setup(path, tmp_path, ram_bytes):
    from llmcore.cache.disk import DiskCache
    from llmcore.cache.disk_io import IOWorker
    from llmcore.cache.prompt_cache import PromptCache
    from llmcore.engine.disk_tier import DiskTier
    from llmcore.engine.prefix import PrefixPolicy
    from llmcore.engine.slot import Slot
    from llmcore.engine.stats import EngineCounters

    m = load_model(path)
    c = EngineCounters()
    pol = None
    pc = PromptCache(ram_bytes, on_release=lambda e: pol.release_entry(e))
    pol = PrefixPolicy(m.new_state, pc, c)
    io = IOWorker()
    probe = m.new_state()
    disk = DiskCache(tmp_path / "cache", None, io, fingerprint=lambda: sf.model_fingerprint(m, probe))
    tier = DiskTier(disk, pol, c, wait_s=5)
    pc.on_evict = tier.on_evict
    disk.start()
    assert io.drain(30) and disk.ready

    def slot_state(seed, n=200):
        s = Slot(0, 4096)
        s.state = m.new_state()
        m.forward([(s.state, np.array(toks(seed, n), dtype=np.int32))])
        return s

    return m, pc, pol, io, disk, slot_state


def test_budget_eviction_keeps_blocks_until_written_urgent_gives_them_back_at_once(tiny_models, tmp_path):
    m, pc, pol, io, disk, slot_state = spill_setup(tiny_models["llama-f32"], tmp_path, None)
    pool = m.pools["kv"]
    try:
        s = slot_state(1)
        pol.save(s)
        pol.clear(s)
        held = pool.n_used
        assert held == pool.blocks_for(200) and pc.n_entries == 1
        pc.limit_bytes = 0  # the budget evicts it: written from the shared blocks
        pc.enforce()
        assert pc.n_entries == 0 and pool.n_used == held  # still referenced by the write
        assert io.drain(30)
        assert pool.n_used == 0 and disk.index.n_entries == 1 and disk.stats["writes"] == 1
        pc.limit_bytes = None
        s = slot_state(2)
        pol.save(s)
        pol.clear(s)
        assert pc.evict_lru() is not None  # urgent: the KV is needed now
        assert pool.n_used == 0  # copied, the blocks went back at once
        assert io.drain(30) and disk.index.n_entries == 2
        e, n = disk.best(toks(2, 200))
        assert n == 200
    finally:
        io.close()


def test_queued_writes_hold_at_most_their_share_of_the_pool(tiny_models, tmp_path):
    """Budget evictions keep their blocks until written only while the queued writes hold
    at most held_limit_bytes: a writer that falls behind must not fill the KV pool (under
    a fast load the queue held every block of a small pool and decodes failed)."""
    m, pc, pol, io, disk, slot_state = spill_setup(tiny_models["llama-f32"], tmp_path, None)
    pool = m.pools["kv"]
    tier = pc.on_evict.__self__
    try:
        for seed in (1, 2):
            s = slot_state(seed)
            pol.save(s)
            pol.clear(s)
        per = pool.blocks_for(200)
        assert pool.n_used == 2 * per and pc.n_entries == 2
        tier.held_limit_bytes = int(1.5 * 200 * pool.bytes_per_token)  # room for one entry's blocks
        pc.limit_bytes = 0  # the budget evicts both before the writer has run
        pc.enforce()
        assert pc.n_entries == 0 and pool.n_used == per  # the first holds its blocks, the second was copied
        assert 0 < tier.held_bytes <= tier.held_limit_bytes
        assert io.drain(30)
        assert pool.n_used == 0 and tier.held_bytes == 0 and disk.index.n_entries == 2
        for seed in (1, 2):
            assert disk.best(toks(seed, 200))[1] == 200
    finally:
        io.close()


def test_a_model_without_a_file_runs_without_the_tier(tmp_path):
    from fakes import FakeModel, FakeTokenizer

    eng = Engine(EngineConfig(cache_dir=str(tmp_path / "c")), model=FakeModel(), tokenizer=FakeTokenizer())
    eng.start()
    try:
        wait_indexed(eng)
        assert not eng.disk.enabled
        assert eng.generate_sync([1, 3, 4, 5], gp()).tokens
        assert eng.generate_sync([1, 3, 4, 5, 6], gp()).tokens
    finally:
        eng.stop()
