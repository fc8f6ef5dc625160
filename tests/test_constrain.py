"""Constrained decoding (llmcore.constrain) through the engine, on the fake model: the
output fits its grammar whatever the model prefers, masks are computed beside the
forward without holding up unconstrained slots, min_tokens holds EOS back."""
import json
import threading
import time

import numpy as np
import pytest

from fakes import EOS, FakeChatTemplate, FakeModel, FakeTokenizer, tid
from llmcore.constrain import (Constraint, GrammarError, GrammarVocab, MaskBatch, gbnf_grammar,
                               json_schema_grammar, lark_grammar, regex_grammar)
from llmcore.engine import Engine, EngineConfig, GenParams
from llmcore.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
TOK = FakeTokenizer()


@pytest.fixture
def engine():
    eng = Engine(EngineConfig(n_parallel=3, sampling=GREEDY), model=FakeModel(), tokenizer=TOK,
                 chat_template=FakeChatTemplate())
    eng.start()
    yield eng
    eng.stop()


def vocab():
    return GrammarVocab.of(TOK)


def run(eng, grammar, prompt="x", n=60, **kw):
    c = Constraint(vocab(), grammar)
    return eng.generate_sync(TOK.encode(prompt), GenParams(n_predict=n, constraint=c, sampling=GREEDY, **kw))


def test_json_schema_output_fits_the_schema(engine):
    schema = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 6},
                                               "n": {"enum": [1, 2, 3]}}, "required": ["word", "n"]}
    r = run(engine, json_schema_grammar(schema))
    d = json.loads(r.text)  # the fake model only wants letters: the grammar wrote the rest
    assert set(d) == {"word", "n"} and len(d["word"]) <= 6 and d["n"] in (1, 2, 3)
    assert r.final.stop_type == "eos"  # complete: it stops at once, no token past the object


def test_gbnf_lark_and_regex_grammars(engine):
    assert run(engine, gbnf_grammar('root ::= "yes" | "no"')).text in ("yes", "no")
    assert run(engine, lark_grammar('start: "ab" NUM\nNUM: /[0-9]{3}/')).text[:2] == "ab"
    out = run(engine, regex_grammar("[0-9]{4}-[0-9]{2}")).text
    assert len(out) == 7 and out[4] == "-" and out.replace("-", "").isdigit()


def test_an_invalid_grammar_is_a_grammar_error():
    with pytest.raises(GrammarError, match="Invalid type"):
        Constraint(vocab(), json_schema_grammar({"type": "frobnicate"}))
    with pytest.raises(GrammarError):
        gbnf_grammar("root ::= (")
    with pytest.raises(GrammarError):
        Constraint(vocab(), lark_grammar("start: undefined_rule"))
    with pytest.raises(GrammarError, match="not valid JSON"):
        json_schema_grammar("{nope")


def test_masks_refuse_what_the_grammar_refuses():
    c = Constraint(vocab(), gbnf_grammar('root ::= "q" [0-9]+'))
    pending = MaskBatch(1).start([c])
    ok = pending.allowed(0)
    assert ok[tid("q")] and ok.sum() == 1
    row = pending.apply(0, np.zeros(TOK.vocab_size + 5, dtype=np.float32))  # padded rows refused too
    assert np.isfinite(row).sum() == 1 and np.isneginf(row[TOK.vocab_size:]).all()
    assert c.consume(tid("q")) and not c.consume(tid("x"))


def test_min_tokens_holds_eos_back(engine):
    p = TOK.encode("w")  # greedy: x y z, then EOS
    free = engine.generate_sync(p, GenParams(n_predict=20, sampling=GREEDY))
    held = engine.generate_sync(p, GenParams(n_predict=20, min_tokens=6, sampling=GREEDY))
    assert free.text == "xyz" and free.final.stop_type == "eos"
    assert held.text.startswith("xyz") and len(held.tokens) >= 6 and EOS not in held.tokens[:6]
    # a grammar that is complete ends the output even before min_tokens
    r = run(engine, gbnf_grammar('root ::= "ok"'), min_tokens=10)
    assert r.text == "ok" and r.final.stop_type == "eos"


def test_constrained_and_free_slots_run_in_the_same_steps():
    model = FakeModel(delay=0.002)
    eng = Engine(EngineConfig(n_parallel=2, sampling=GREEDY), model=model, tokenizer=TOK,
                 chat_template=FakeChatTemplate())
    eng.start()
    try:
        c = Constraint(vocab(), regex_grammar("[0-9]{40}"))
        t1 = eng.submit(TOK.encode("x"), GenParams(n_predict=40, constraint=c, sampling=GREEDY), sync=True)
        t2 = eng.submit(TOK.encode("a"), GenParams(n_predict=40, ignore_eos=True, sampling=GREEDY), sync=True)
        r1, r2 = t1.collect_sync(), t2.collect_sync()
        assert r1.text.isdigit() and len(r1.text) == 40
        assert len(r2.tokens) == 40
        assert max(model.batch_sizes) == 2  # decoded side by side, one forward a step
    finally:
        eng.stop()


def test_mask_computation_runs_beside_the_forward():
    """The masks of a step are computed on a helper thread: the engine thread is free
    (it runs the forward) while they are."""
    seen = []
    c = Constraint(vocab(), json_schema_grammar({"type": "object"}))
    batch = MaskBatch(1)
    main = threading.get_ident()
    import llguidance.numpy as lln

    real = lln.fill_next_token_bitmask_par

    def spy(*a, **k):
        seen.append(threading.get_ident())
        time.sleep(0.05)
        return real(*a, **k)

    lln.fill_next_token_bitmask_par = spy
    try:
        t0 = time.perf_counter()
        pending = batch.start([c])
        started = time.perf_counter() - t0
        assert pending.allowed(0)[tid("{")]
    finally:
        lln.fill_next_token_bitmask_par = real
        batch.close()
    assert started < 0.04 and seen and seen[0] != main


def test_a_grammar_restarts_with_its_request():
    c = Constraint(vocab(), gbnf_grammar('root ::= "ab"'))
    assert c.consume(tid("a"))
    c.reset()
    assert c.consume(tid("a")) and c.consume(tid("b")) and c.stopped


def test_a_spent_thinking_budget_closes_the_block(engine):
    """After `tokens` tokens inside the think block, its closing tokens are forced."""
    from llmcore.engine.budget import ReasoningBudget

    close = tuple(TOK.encode("</think>", add_special=False))
    b = ReasoningBudget(4, close=close, open=tuple(TOK.encode("<think>", add_special=False)), starts_inside=True)
    r = engine.generate_sync(TOK.encode("a"), GenParams(n_predict=20, reasoning_budget=b, sampling=GREEDY))
    assert r.text.startswith("bcde</think>")  # 4 thinking tokens, then the close; then free again
    assert not b.inside
    free = ReasoningBudget(4, close=close, starts_inside=False)  # never inside: nothing forced
    r = engine.generate_sync(TOK.encode("a"), GenParams(n_predict=6, reasoning_budget=free, sampling=GREEDY))
    assert r.text == "bcdefg"
