"""The three cache layers in the engine, on real (tiny) models: a reused or restored state
gives the same tokens and log-probabilities as computing from scratch.

All built in fixtures.py: dense tiny llama/qwen3 (with a byte-level fake tokenizer), sliding
window gemma3-swa (window 32) and recurrent mamba2 (both with the tiny BPE tokenizer and chat
template).
"""
import numpy as np
import pytest

from fixtures import TOKENIZER_VOCAB
from llmcore.engine import Engine, EngineConfig, GenParams
from llmcore.errors import ContextFullError
from llmcore.gguf_file import GGUFFile
from llmcore.metrics import parse_prometheus, to_prometheus
from llmcore.sampling import SamplingParams


def gp(**kw):
    kw.setdefault("sampling", SamplingParams(temperature=0.0, n_probs=4))
    kw.setdefault("n_predict", 4)
    kw.setdefault("ignore_eos", True)
    return GenParams(**kw)


def start(path, **cfg):
    cfg.setdefault("n_ctx", 1024)
    cfg.setdefault("n_ubatch", 64)
    if "tokenizer.ggml.model" not in GGUFFile(path).meta:  # a byte-level fake instead
        from fakes import FakeTokenizer
        from llmcore.models import load_model

        eng = Engine(EngineConfig(**cfg), model=load_model(path), tokenizer=FakeTokenizer())
    else:
        eng = Engine.from_path(path, EngineConfig(**cfg))
    eng.start()
    assert eng.wait_ready(120), eng.load_error
    return eng


def toks(seed, n, lo=3, hi=250):
    return np.random.default_rng(seed).integers(lo, hi, size=n).tolist()


def same_output(c, ref, atol=2e-3):
    assert c.tokens == ref.tokens
    for a, b in zip(c.samples, ref.samples):
        assert abs(a.logprob - b.logprob) < atol
        np.testing.assert_allclose([t.logprob for t in a.top], [t.logprob for t in b.top], atol=atol)


@pytest.fixture(scope="module")
def fresh_cache():
    """Outputs computed from scratch (cache_prompt off), per (model path, prompt)."""
    engines, memo = {}, {}

    def get(path, prompt, n_predict=4):
        key = (str(path), tuple(prompt), n_predict)
        if key not in memo:
            if str(path) not in engines:
                engines[str(path)] = start(path, cache_ram_mib=0, ctx_checkpoints=0)
            memo[key] = engines[str(path)].generate_sync(prompt, gp(cache_prompt=False, n_predict=n_predict))
        return memo[key]

    yield get
    for e in engines.values():
        e.stop()


# ---- layer 1: slot prefix reuse -----------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-f32", "qwen3-f32"])
def test_slot_reuse_equals_recompute(tiny_models, fresh_cache, name):
    path = tiny_models[name]
    eng = start(path, n_parallel=1)
    try:
        p1 = toks(1, 150)
        p2 = p1[:100] + toks(2, 40)
        eng.generate_sync(p1, gp())
        c = eng.generate_sync(p2, gp())
        t = c.final.timings
        assert t.cache_n == 100 and t.cache_source == "slot" and t.prompt_n == 40
        same_output(c, fresh_cache(path, p2))
        c = eng.generate_sync(p2, gp())  # identical: one token re-evaluated
        assert c.final.timings.cache_n == len(p2) - 1
        same_output(c, fresh_cache(path, p2))
    finally:
        eng.stop()


# ---- layer 2: RAM prompt cache ------------------------------------------------------------


def test_conversation_returns_from_ram_cache(tiny_models, fresh_cache):
    path = tiny_models["llama-f32"]
    eng = start(path, n_parallel=2, cache_ram_mib=64)
    try:
        a, b, c = toks(10, 120), toks(11, 90), toks(12, 90)
        eng.generate_sync(a, gp())
        eng.generate_sync(b, gp())
        eng.generate_sync(c, gp())  # takes a's slot (LRU): a's state goes to RAM
        assert all(common(s.state.tokens, a) < 10 for s in eng.slots)
        a2 = a + toks(13, 20)
        r = eng.generate_sync(a2, gp())
        t = r.final.timings
        assert t.cache_source == "ram" and t.cache_n == len(a)
        same_output(r, fresh_cache(path, a2))
        st = eng.stats()
        assert st.ram_hits == 1 and st.cache_ram_entries >= 1 and st.cache_ram_bytes > 0
    finally:
        eng.stop()


def common(x, y):
    n = 0
    for p, q in zip(x, y):
        if p != q:
            break
        n += 1
    return n


def test_ram_cache_lru_keeps_budget(tiny_models, fresh_cache):
    path = tiny_models["llama-f32"]
    eng = start(path, n_parallel=1, cache_ram_mib=64)
    try:
        pool = eng.model.pools["kv"]
        limit = 20 * pool.bytes_per_block
        eng.pcache.limit_bytes = limit
        prompts = [toks(100 + i, 200) for i in range(6)]  # 7 blocks each
        for p in prompts:
            eng.generate_sync(p, gp(n_predict=1))
            assert eng.pcache.nbytes <= limit
        st = eng.stats()
        assert st.cache_ram_evictions >= 2 and st.cache_ram_bytes <= limit
        # the newest saved prompt is still there, the oldest is gone
        assert eng.pcache.best(prompts[4])[1] > 0 and eng.pcache.best(prompts[0])[1] == 0
        # every cache block is really held in the pool (nothing leaked, nothing freed early)
        held = set()
        for e in eng.pcache.entries():
            held |= set(e.blocks.get("kv", np.zeros(0)).tolist())
        assert all(pool.refcount[b] >= 1 for b in held)
        r = eng.generate_sync(prompts[4] + [5, 6, 7], gp())
        assert r.final.timings.cache_source == "ram"
        same_output(r, fresh_cache(path, prompts[4] + [5, 6, 7]))
        eng.pcache.clear()
        for s in eng.slots:
            eng.prefix.clear(s)
        assert pool.n_used == 0  # every reference given back
    finally:
        eng.stop()


def test_save_and_restore_failures_are_misses(tiny_models, fresh_cache):
    path = tiny_models["llama-f32"]
    eng = start(path, n_parallel=1, cache_ram_mib=64)
    try:
        fail = {"save"}

        def hook(what):
            if what in fail:
                raise RuntimeError(f"injected {what} failure")

        eng.fault_hook = hook
        a, b = toks(20, 80), toks(21, 80)
        eng.generate_sync(a, gp())
        eng.generate_sync(b, gp())  # saving a fails: warning + counter, b still served
        assert eng.stats().cache_save_failures >= 1
        fail.clear()
        eng.generate_sync(a, gp())  # switching back saves b to RAM
        fail.add("restore")
        r = eng.generate_sync(b + [9], gp())  # b is in RAM, restoring it fails: cold prefill
        assert eng.stats().cache_restore_failures >= 1
        assert r.final.timings.cache_n == 0
        same_output(r, fresh_cache(path, b + [9]))
        fail.clear()
        r = eng.generate_sync(b + [9, 10], gp())
        same_output(r, fresh_cache(path, b + [9, 10]))
    finally:
        eng.stop()


# ---- layer 3: context checkpoints -----------------------------------------------------------


def test_swa_branch_restores_checkpoint(built_model, fresh_cache):
    path = built_model("gemma3-swa")
    eng = start(path, n_parallel=1, checkpoint_every_n_tokens=32, cache_ram_mib=0)
    try:
        base = toks(30, 200, hi=TOKENIZER_VOCAB)
        eng.generate_sync(base, gp())
        assert eng.stats().checkpoints_created >= 5
        branch = base[:110] + toks(31, 20, hi=TOKENIZER_VOCAB)  # diverges far outside the window
        r = eng.generate_sync(branch, gp())
        t = r.final.timings
        assert t.cache_source == "checkpoint" and t.checkpoint_restores == 1
        assert t.cache_n == 96 and eng.stats().forced_reprefills == 0
        same_output(r, fresh_cache(path, branch))
        # inside the window: plain trim still works
        near = branch[:-3] + [7, 8, 9]
        r = eng.generate_sync(near, gp())
        assert r.final.timings.cache_source == "slot" and r.final.timings.cache_n == len(branch) - 3
        same_output(r, fresh_cache(path, near))
    finally:
        eng.stop()


def test_swa_without_checkpoints_reprocesses_and_counts(built_model, fresh_cache):
    path = built_model("gemma3-swa")
    eng = start(path, n_parallel=1, ctx_checkpoints=0, cache_ram_mib=0)
    try:
        base = toks(30, 200, hi=TOKENIZER_VOCAB)
        eng.generate_sync(base, gp())
        branch = base[:110] + toks(31, 20, hi=TOKENIZER_VOCAB)
        r = eng.generate_sync(branch, gp())
        assert r.final.timings.cache_n == 0 and eng.stats().forced_reprefills == 1
        same_output(r, fresh_cache(path, branch))
    finally:
        eng.stop()


def test_swa_checkpoints_travel_with_ram_entry(built_model, fresh_cache):
    path = built_model("gemma3-swa")
    eng = start(path, n_parallel=1, checkpoint_every_n_tokens=32, cache_ram_mib=64)
    try:
        a, b = toks(40, 150, hi=TOKENIZER_VOCAB), toks(41, 60, hi=TOKENIZER_VOCAB)
        eng.generate_sync(a, gp())
        eng.generate_sync(b, gp())  # a (with its checkpoints) goes to RAM
        branch = a[:100] + toks(42, 10, hi=TOKENIZER_VOCAB)
        r = eng.generate_sync(branch, gp())
        t = r.final.timings
        assert t.cache_source == "ram" and t.checkpoint_restores == 1 and t.cache_n == 96
        same_output(r, fresh_cache(path, branch))
    finally:
        eng.stop()


def test_recurrent_repeat_and_branch(built_model, fresh_cache):
    path = built_model("mamba2")
    eng = start(path, n_parallel=1, checkpoint_every_n_tokens=32, cache_ram_mib=64)
    try:
        p = toks(50, 100, hi=TOKENIZER_VOCAB)
        eng.generate_sync(p, gp())
        r = eng.generate_sync(p, gp())  # identical: the state cannot drop one token
        t = r.final.timings
        assert t.cache_source == "checkpoint" and t.cache_n == len(p) - 4
        same_output(r, fresh_cache(path, p))
        br = p[:70] + toks(51, 10, hi=TOKENIZER_VOCAB)
        r = eng.generate_sync(br, gp())
        assert r.final.timings.cache_n == 64 and r.final.timings.checkpoint_restores == 1
        same_output(r, fresh_cache(path, br))
        # appending to the whole previous state needs no checkpoint at all
        full = list(eng.slots[0].state.tokens)
        ext = full + toks(52, 5, hi=TOKENIZER_VOCAB)
        r = eng.generate_sync(ext, gp())
        assert r.final.timings.cache_n == len(full) and r.final.timings.cache_source == "slot"
        same_output(r, fresh_cache(path, ext))
    finally:
        eng.stop()


# ---- memory pressure, observability -------------------------------------------------------


def test_kv_pool_full_waits_evicts_and_never_crashes(tiny_models, fresh_cache):
    path = tiny_models["llama-f32"]
    eng = start(path, n_parallel=3, cache_ram_mib=64, n_ubatch=32)
    try:
        pool = eng.model.pools["kv"]
        pool.max_blocks = 12  # 384 tokens for everyone
        eng.generate_sync(toks(60, 150), gp(n_predict=1))
        eng.generate_sync(toks(61, 150), gp(n_predict=1, id_slot=1))
        # two 200-token requests at once: cache entries and idle states must make room,
        # then one waits for the other
        ps = [toks(62, 200), toks(63, 200)]
        tasks = [eng.submit(p, gp(n_predict=8), sync=True) for p in ps]
        outs = [t.collect_sync() for t in tasks]
        for p, c in zip(ps, outs):
            same_output(c, fresh_cache(path, p, n_predict=8))
        st = eng.stats()
        assert st.idle_slot_evictions + st.cache_ram_evictions >= 1
        assert st.kv_used_bytes <= st.kv_limit_bytes
        # larger than the whole pool: a clean error, and the engine keeps serving
        with pytest.raises(ContextFullError):
            eng.generate_sync(toks(64, 420), gp(n_predict=1))
        c = eng.generate_sync(toks(65, 50), gp())
        same_output(c, fresh_cache(path, toks(65, 50)))
    finally:
        eng.stop()


def test_stats_feed_metrics_and_slots(tiny_models):
    eng = start(tiny_models["llama-f32"], n_parallel=2, cache_ram_mib=64)
    try:
        a = toks(70, 60)
        eng.generate_sync(a, gp())
        eng.generate_sync(a + [5], gp())
        st = eng.stats()
        m = parse_prometheus(to_prometheus(st))
        for k in ("llamacpp:prompt_tokens_total", "llamacpp:requests_deferred",
                  "llmcore:prompt_cache_bytes", "llmcore:prompt_cache_budget_bytes",
                  "llmcore:prompt_cache_hits_total", "llmcore:checkpoints_created_total",
                  "llmcore:forced_reprefills_total", "llmcore:queue_length",
                  "llmcore:slot_cache_hits_total"):
            assert k in m
        assert m["llmcore:slot_cache_hits_total"] == st.slot_hits == 1
        assert m["llmcore:prompt_cache_budget_bytes"] == 64 << 20
        s = [x for x in st.slots if x.n_tokens][0]
        assert s.cache_source == "slot" and s.n_cached == len(a)
    finally:
        eng.stop()


def test_checkpoint_at_last_user_message(built_model, fresh_cache):
    path = built_model("gemma3-swa")
    from llmcore.server.prompt import build_chat_prompt

    eng = start(path, n_parallel=1, checkpoint_every_n_tokens=-1, cache_ram_mib=0)
    try:
        assert eng.chat_template is not None and not eng.chat_template.is_fallback
        story = "tell me a very long story about " + " and ".join(f"cat number {i}" for i in range(12))

        def body(last):
            return {"messages": [
                {"role": "system", "content": "You are terse. " * 20},
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": last}]}

        prompt = build_chat_prompt(eng, body(story))
        p1, at = prompt.tokens, prompt.checkpoint_at
        assert at is not None and 0 < at < len(p1) - 32
        eng.generate_sync(p1, gp(checkpoint_at=at))
        assert at in eng.slots[0].checkpoints.positions()
        prompt = build_chat_prompt(eng, body(story.replace("very long", "short")))  # the client edits its last message
        p2 = prompt.tokens
        r = eng.generate_sync(p2, gp(checkpoint_at=prompt.checkpoint_at))
        t = r.final.timings
        assert t.cache_source == "checkpoint" and t.cache_n == at
        same_output(r, fresh_cache(path, p2))
    finally:
        eng.stop()


def test_kv_pools_capped_by_available_ram(tiny_models, monkeypatch):
    """-c far beyond the machine: the pools are capped at a share of the RAM available at
    start-up, the plan says so, and a request beyond the cap is refused cleanly."""
    import llmcore.engine.memory as engine_mod

    path = tiny_models["llama-f32"]
    monkeypatch.setattr(engine_mod, "host_memory", lambda: (4 << 20, 8 << 20))  # 4 MiB free
    eng = start(path, n_ctx=4_500_000, n_parallel=4, cache_ram_mib=8192)
    try:
        plan = eng.memory_plan
        assert plan["kv_capped_by_ram"]
        assert plan["kv_max_bytes"] <= engine_mod.KV_RAM_FRACTION * (4 << 20)
        pool_bytes = sum(p.max_blocks * p.bytes_per_block for p in eng.model.pools.values())
        assert pool_bytes == plan["kv_max_bytes"]
        per_tok = plan["kv_bytes_per_token"]
        too_long = int(plan["kv_max_bytes"] // per_tok) + 64
        with pytest.raises(ContextFullError):
            eng.generate_sync(toks(70, too_long), gp(n_predict=1))
        c = eng.generate_sync(toks(71, 40), gp())
        assert len(c.tokens) == 4
    finally:
        eng.stop()


def test_swa_full_trims_without_checkpoints(built_model, fresh_cache):
    """--swa-full: local layers keep every block, so a far branch is a plain slot trim."""
    path = built_model("gemma3-swa")
    eng = start(path, n_parallel=1, ctx_checkpoints=0, cache_ram_mib=0, swa_full=True)
    try:
        assert eng.model.swa_full
        base = toks(30, 200, hi=TOKENIZER_VOCAB)
        eng.generate_sync(base, gp())
        branch = base[:110] + toks(31, 20, hi=TOKENIZER_VOCAB)  # far outside the 32-token window
        r = eng.generate_sync(branch, gp())
        t = r.final.timings
        assert t.cache_source == "slot" and t.cache_n == 110 and t.checkpoint_restores == 0
        assert eng.stats().forced_reprefills == 0
        same_output(r, fresh_cache(path, branch))
    finally:
        eng.stop()
