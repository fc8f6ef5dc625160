import asyncio
import threading
import time

import numpy as np
import pytest

from fakes import EOS, FakeModel, FakeTokenizer, expected_text, tid
from llmcore.engine import Engine, EngineConfig, FinalEvent, GenParams, TokenEvent, common_prefix
from llmcore.errors import ContextFullError, RequestError
from llmcore.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def make_engine(np_=1, model=None, **cfg):
    model = model or FakeModel()
    eng = Engine(EngineConfig(n_parallel=np_, **cfg), model=model, tokenizer=FakeTokenizer())
    eng.start()
    return eng


@pytest.fixture
def tok():
    return FakeTokenizer()


def gp(**kw):
    kw.setdefault("sampling", SamplingParams(temperature=0.0))
    return GenParams(**kw)


def run(eng, text, **kw):
    return eng.generate_sync(FakeTokenizer().encode(text), gp(**kw))


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_greedy_n_predict_limit():
    eng = make_engine()
    try:
        c = run(eng, "a", n_predict=5)
        assert c.text == expected_text("a", 5) == "bcdef"
        assert c.final.stop_type == "limit" and c.final.finish_reason == "length"
        assert c.final.n_predicted == 5 and len(c.tokens) == 5
        assert c.final.timings.prompt_n == 2  # BOS + 'a'
    finally:
        eng.stop()


def test_greedy_requests_take_the_argmax_the_model_found():
    """A step with a greedy request asks the model for each row's argmax (the decode step's
    head finds it) and samples that; a sampled request's step does not; the text is the
    same greedy continuation."""
    model = FakeModel()
    eng = make_engine(model=model)
    try:
        c = run(eng, "a", n_predict=5)
        assert c.text == expected_text("a", 5)
        assert model.argmax_calls == model.forward_calls > 0
        before = model.forward_calls, model.argmax_calls
        run(eng, "a", n_predict=5, sampling=SamplingParams(temperature=0.8, seed=1))
        assert model.forward_calls > before[0] and model.argmax_calls == before[1]
    finally:
        eng.stop()


def test_eos_and_ignore_eos():
    eng = make_engine()
    try:
        c = run(eng, "w", n_predict=10)
        assert c.text == "xyz" and c.final.stop_type == "eos"
        c = run(eng, "w", n_predict=6, ignore_eos=True)
        assert c.final.stop_type == "limit" and c.text == "xyz" + "ab"  # EOS emits no text
    finally:
        eng.stop()


def test_stop_string_and_holdback():
    eng = make_engine()
    tk = FakeTokenizer()
    try:
        c = run(eng, "a", n_predict=20, stop=["def"])
        assert c.text == "bc" and c.final.stop_type == "word" and c.final.stopping_word == "def"
        # a stop string that never completes: text held back while it could still match
        task = eng.submit(tk.encode("a"), gp(n_predict=6, stop=["dex"]), sync=True)
        evs = list(task)
        toks = [e for e in evs if isinstance(e, TokenEvent) and e.tokens]
        texts = [e.text for e in toks]
        assert texts == ["b", "c", "", "", "def", "g"]  # "d", "de" could start "dex": held back
        assert "".join(e.text for e in evs if isinstance(e, TokenEvent)) == "bcdefg"
    finally:
        eng.stop()


def test_prefix_reuse_evaluates_only_the_rest():
    model = FakeModel()
    eng = make_engine(model=model)
    tk = FakeTokenizer()
    try:
        p1 = tk.encode("hello world, this is a prompt")
        c1 = eng.generate_sync(p1, gp(n_predict=3))
        assert c1.final.timings.cache_n == 0 and c1.final.timings.prompt_n == len(p1)
        before = model.tokens_evaluated
        p2 = tk.encode("hello world, another prompt")
        c2 = eng.generate_sync(p2, gp(n_predict=3))
        n_common = common_prefix(p1, p2)
        assert c2.final.timings.cache_n == n_common
        assert c2.final.timings.prompt_n == len(p2) - n_common
        # prompt rest + 2 decode steps (the 3rd sampled token is never fed)
        assert model.tokens_evaluated - before == len(p2) - n_common + 2
        # identical prompt: still evaluates one token
        c3 = eng.generate_sync(p2, gp(n_predict=1))
        assert c3.final.timings.cache_n == len(p2) - 1 and c3.final.timings.prompt_n == 1
        assert c3.text == c2.text[:1]
        # cache_prompt false: full re-prefill
        c4 = eng.generate_sync(p2, gp(n_predict=1, cache_prompt=False))
        assert c4.final.timings.cache_n == 0 and c4.final.timings.prompt_n == len(p2)
    finally:
        eng.stop()


def test_slot_choice_longest_prefix_and_id_slot():
    eng = make_engine(np_=3)
    tk = FakeTokenizer()
    try:
        a = eng.generate_sync(tk.encode("aaaaaaaaaaaa"), gp(n_predict=1, id_slot=0))
        b = eng.generate_sync(tk.encode("bbbbbbbbbbbb"), gp(n_predict=1, id_slot=2))
        assert (a.final.slot_id, b.final.slot_id) == (0, 2)
        c = eng.generate_sync(tk.encode("bbbbbbbbbbbbxx"), gp(n_predict=1))
        assert c.final.slot_id == 2 and c.final.timings.cache_n == 13
        d = eng.generate_sync(tk.encode("zzzzzzzzzzzzzzz"), gp(n_predict=1))  # only BOS in common
        assert d.final.slot_id == 1  # least recently used
        with pytest.raises(RequestError):
            eng.submit(tk.encode("x"), gp(id_slot=7), sync=True)
    finally:
        eng.stop()


def test_too_long_prompt_rejected_before_work():
    model = FakeModel(n_ctx_train=64)
    eng = make_engine(model=model)
    try:
        with pytest.raises(ContextFullError):
            eng.submit([tid("a")] * 64, gp(), sync=True)
        assert model.forward_calls == 0
        # generation stops at the context end with 'limit'
        c = eng.generate_sync([tid("q")] * 60, gp(n_predict=-1, ignore_eos=True))
        assert c.final.stop_type == "limit" and c.final.n_predicted == 4
    finally:
        eng.stop()


def test_batched_decode_and_chunked_prefill():
    model = FakeModel(delay=0.002)
    eng = make_engine(np_=2, model=model, n_ubatch=8, n_batch=64)
    tk = FakeTokenizer()
    try:
        short = eng.submit(tk.encode("a"), gp(n_predict=40, ignore_eos=True), sync=True)
        time.sleep(0.02)
        long_prompt = tk.encode("x" * 100)
        longt = eng.submit(long_prompt, gp(n_predict=2), sync=True)
        c_short, c_long = short.collect_sync(), longt.collect_sync()
        assert c_short.text == (expected_text("a", 25) + "abcdefghijklmnopqrstuvwxyz")[:len(c_short.text)]
        assert c_short.final.n_predicted == 40
        assert c_long.final.timings.prompt_n == len(long_prompt)
        assert model.max_segment <= 8  # prompt went in chunks
        assert max(model.batch_sizes) == 2  # decode of one slot rode along with the prefill of the other
    finally:
        eng.stop()


def test_queue_all_complete_with_one_slot():
    eng = make_engine(np_=1)
    tk = FakeTokenizer()
    try:
        tasks = [eng.submit(tk.encode(ch), gp(n_predict=3), sync=True) for ch in "abcdefgh"]
        st = eng.stats()
        assert st.requests_deferred + st.requests_processing >= 1
        outs = [t.collect_sync() for t in tasks]
        assert [o.text for o in outs] == [expected_text(ch, 3) for ch in "abcdefgh"]
        st = eng.stats()
        assert st.requests_total == 8 and st.requests_deferred == 0 and st.requests_processing == 0
        assert st.tokens_predicted_total == 24
    finally:
        eng.stop()


def test_cancel_frees_slot():
    model = FakeModel(delay=0.005)
    eng = make_engine(np_=1, model=model)
    tk = FakeTokenizer()
    try:
        t1 = eng.submit(tk.encode("a"), gp(n_predict=-1, ignore_eos=True), sync=True)
        t2 = eng.submit(tk.encode("b"), gp(n_predict=2), sync=True)  # queued behind t1
        it = iter(t1)
        for _ in range(3):
            next(it)
        t1.cancel()
        c2 = t2.collect_sync()
        assert c2.text == "cd"
        deadline = time.time() + 2
        while eng.stats().requests_cancelled < 1 and time.time() < deadline:
            time.sleep(0.01)
        assert eng.stats().requests_cancelled == 1
    finally:
        eng.stop()


def test_forward_error_fails_request_and_engine_keeps_serving():
    model = FakeModel(fail_token=tid("!"))
    eng = make_engine(model=model)
    tk = FakeTokenizer()
    try:
        with pytest.raises(RuntimeError, match="fake model failure"):
            eng.generate_sync(tk.encode("boom!"), gp(n_predict=2))
        c = eng.generate_sync(tk.encode("a"), gp(n_predict=2))
        assert c.text == "bc"
        assert eng.stats().requests_errors == 1
    finally:
        eng.stop()


def test_seeded_sampling_reproducible():
    eng = make_engine()
    tk = FakeTokenizer()
    try:
        sp = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
        a = eng.generate_sync(tk.encode("a"), GenParams(n_predict=30, ignore_eos=True, sampling=SamplingParams(seed=42, **sp)))
        b = eng.generate_sync(tk.encode("a"), GenParams(n_predict=30, ignore_eos=True, sampling=SamplingParams(seed=42, **sp)))
        c = eng.generate_sync(tk.encode("a"), GenParams(n_predict=30, ignore_eos=True, sampling=SamplingParams(seed=43, **sp)))
        assert a.tokens == b.tokens and a.tokens != c.tokens
    finally:
        eng.stop()


async def test_async_iteration_and_n_probs():
    eng = make_engine()
    tk = FakeTokenizer()
    try:
        task = eng.submit(tk.encode("a"), gp(n_predict=3, sampling=SamplingParams(temperature=0, n_probs=2)))
        c = await task.collect()
        assert c.text == "bcd"
        assert len(c.samples) == 3 and all(s.top[0].id == s.token for s in c.samples)
        assert c.samples[0].top[0].id == tid("b")
    finally:
        eng.stop()


def test_loader_runs_on_engine_thread():
    ev = threading.Event()

    def loader():
        ev.wait(2)
        return FakeModel(), FakeTokenizer(), None, {"name": "fake"}

    eng = Engine(EngineConfig(), loader=loader)
    eng.start()
    try:
        assert eng.status == "loading"
        ev.set()
        assert eng.wait_ready(2)
        assert eng.generate_sync(FakeTokenizer().encode("a"), gp(n_predict=1)).text == "b"
    finally:
        eng.stop()


async def test_a_steps_events_reach_the_loop_in_one_wakeup_in_order(monkeypatch):
    """EventOutbox: while open, events of several tasks are gathered; closing it wakes the
    event loop once for all of them, each task's in order; closed, each event goes at once."""
    from llmcore.engine.task import EventOutbox, Task

    loop = asyncio.get_running_loop()
    calls = []
    real = loop.call_soon_threadsafe
    monkeypatch.setattr(loop, "call_soon_threadsafe", lambda *a: (calls.append(a), real(*a))[1])
    box = EventOutbox()
    t1, t2 = (Task([1], GenParams(), loop, lambda: None, box) for _ in range(2))
    with box:
        t1.put(TokenEvent([5], "a"))
        t2.put(TokenEvent([6], "b"))
        t1.put(TokenEvent([7], "c"))
        assert calls == []
    assert len(calls) == 1
    t2.put(TokenEvent([8], "d"))  # closed: delivered on its own
    assert len(calls) == 2
    assert [(await t1.next_event()).text for _ in range(2)] == ["a", "c"]
    assert [(await t2.next_event()).text for _ in range(2)] == ["b", "d"]


async def test_outbox_holds_later_tokens_for_the_stream_interval(monkeypatch):
    """EventOutbox(hold_s): a stream's first token and its end (a final event, an error) go
    out at the step that made them; its other tokens wait (gathered) until hold_s has passed since the last delivery,
    or until flush() (the engine flushes before it waits): nothing is lost or reordered."""
    from llmcore.engine.events import ErrorEvent
    from llmcore.engine.task import EventOutbox, Task

    loop = asyncio.get_running_loop()
    calls = []
    real = loop.call_soon_threadsafe
    monkeypatch.setattr(loop, "call_soon_threadsafe", lambda *a: (calls.append(a), real(*a))[1])
    clock = [100.0]
    monkeypatch.setattr("llmcore.engine.task.time.monotonic", lambda: clock[0])
    box = EventOutbox(hold_s=0.010)
    t = Task([1], GenParams(), loop, lambda: None, box)

    def step(ev, dt=0.002):
        clock[0] += dt
        with box:
            t.put(ev)

    step(TokenEvent([5], "a"))  # the first token: at once
    assert len(calls) == 1
    step(TokenEvent([6], "b"))
    step(TokenEvent([7], "c"))
    assert len(calls) == 1  # held: 4 ms since the last delivery
    step(TokenEvent([8], "d"), dt=0.007)  # 11 ms: b, c, d together
    assert len(calls) == 2
    step(TokenEvent([9], "e"))
    box.flush()  # the engine is about to wait
    assert len(calls) == 3
    box.flush()  # nothing held: no wake-up
    step(TokenEvent([10], "f"))
    step(ErrorEvent(ContextFullError("full")))  # an end goes out at once, after f
    assert len(calls) == 4
    assert [(await t.next_event()).text for _ in range(6)] == list("abcdef")
    with pytest.raises(ContextFullError):
        await t.next_event()


async def test_ready_events_take_what_is_queued_and_report_an_error_after_the_tokens():
    """Task.ready_events: the events already queued, no waiting; an error behind tokens
    comes out on the next call (the tokens are not lost to it); `limit` caps a batch."""
    from llmcore.engine.events import ErrorEvent
    from llmcore.engine.task import Task

    loop = asyncio.get_running_loop()
    t = Task([1], GenParams(), loop, lambda: None, None)
    assert t.ready_events() == []
    for i, s in enumerate("abc"):
        t.put(TokenEvent([i], s))
    t.put(ErrorEvent(ContextFullError("full")))
    await asyncio.sleep(0)  # call_soon_threadsafe deliveries
    assert (await t.next_event()).text == "a"  # already queued: returned at once
    assert [e.text for e in t.ready_events()] == ["b", "c"]
    with pytest.raises(ContextFullError):
        t.ready_events()
    u = Task([1], GenParams(), loop, lambda: None, None)
    u.put(TokenEvent([1], "x"))
    u.put(TokenEvent([2], "y"))
    await asyncio.sleep(0)
    assert [e.text for e in u.ready_events(limit=1)] == ["x"] and [e.text for e in u.ready_events()] == ["y"]
