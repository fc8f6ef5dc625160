"""Speculative decoding by prompt lookup (llmcore.engine.speculative): the drafter, and the
engine's verification giving exactly what plain decoding gives (greedy and sampled)."""
import numpy as np
import pytest

from fakes import FakeModel, FakeTokenizer, tid
from llmcore.engine import Engine, EngineConfig, GenParams
from llmcore.engine.speculative import NgramDrafter, SpecParams
from llmcore.errors import RequestError
from llmcore.sampling import SamplingParams


def test_drafter_proposes_what_followed_the_latest_earlier_occurrence():
    d = NgramDrafter(SpecParams(n_max=4, ngram_max=3, ngram_min=2))
    seq = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3]
    assert d.draft(seq) == [4, 5, 6, 9]  # the 3-gram [1, 2, 3] occurred at 0..2
    seq += [4, 7, 7]
    assert d.draft(seq) == []  # [4, 7, 7] / [7, 7] never occurred before
    seq += [1, 2]
    assert d.draft(seq, limit=2) == [3, 4]  # the latest earlier [1, 2] is at 11..12
    assert NgramDrafter(SpecParams(n_max=4, n_min=5)).draft([1, 2, 3, 1, 2]) == []


def test_drafter_keeps_following_the_copy_it_drafts_from():
    """Functions that differ only in a number: after the edit reaches a stretch all of them
    share, the latest occurrence of the last n-gram is the function just written (the wrong
    number); the drafter stays on the copy it has been following."""
    common = [10, 11, 12, 13, 14, 15]

    def fn(i):
        return [1, 20 + i] + common + [30 + i]

    seq = fn(1) + fn(2) + fn(3) + fn(1) + [1, 22]  # the file, then its copy so far
    d = NgramDrafter(SpecParams(n_max=2, ngram_min=2, ngram_max=4))
    assert d.draft(seq) == [10, 11]
    seq += [10, 11, 12]  # both kept, then the model's own next token
    d.record(2, 2)
    assert d.draft(seq) == [13, 14]
    seq += [13, 14, 15]
    d.record(2, 2)
    assert d.draft(seq) == [32, 1]  # a fresh lookup of [12, 13, 14, 15] would say [31, 1]
    seq += [32, 1, 27]  # the copy is left (an edit): back to the index
    d.record(2, 2)
    assert d.draft(seq) == []  # [32, 1, 27] never occurred
    assert d.draft(seq + [10, 11]) == [12, 13]


def test_drafter_stops_before_minority_tokens_until_the_copy_proves_right_there():
    """Functions that differ in a number: a model that writes its own numbers misses every
    draft that runs through one, so once the text left its copy at such a point, drafts
    stop before tokens that followed that context in a minority of its occurrences; the
    copy itself goes on after the changed number (the next function); once the text writes
    the copy's token at such a point again, drafts go through them."""
    def fn(i):
        return [1, 20 + i, 10, 11, 12, 13, 30 + i]

    seq = fn(1) + fn(2) + fn(3) + [1, 21]  # the file, then its copy begins
    d = NgramDrafter(SpecParams(n_max=8, ngram_min=2, ngram_max=4))
    assert d.draft(seq) == [10, 11, 12, 13]  # k starts at 4
    d.record(4, 4)
    seq += [10, 11, 12, 13, 35]  # the model's own number where the copy had 31
    # [13, 35] never occurred, but 31 was one of three numbers seen after [10, 11, 12, 13]:
    # the copy goes on after it, up to its next number (32: at that context the text just
    # wrote its own)
    assert d.draft(seq) == [1, 22, 10, 11, 12, 13]
    d.record(6, 6)
    seq += [1, 22, 10, 11, 12, 13, 32]  # this time the copy's number: drafts go through again
    assert d.draft(seq) == [1, 23, 10, 11, 12, 13, 33, 1]


def test_drafter_resumes_its_copy_after_a_changed_token_only_where_the_copy_varies():
    """A rename in a copied line (the copy's token was one of several seen after its
    context): the copy goes on after it, and after the shorter spelling of a number it
    skips the copy's extra token. Where the copy's token was the only one ever seen there
    (free text taking another word), the drafter goes back to the index."""
    def fn(i, tail):
        return [1, 50 + i, 2, 3, 4] + tail + [5, 6, 7, 8]

    file = fn(0, [40, 41]) + fn(1, [40, 42]) + fn(2, [40, 43])
    d = NgramDrafter(SpecParams(n_max=4, ngram_min=2, ngram_max=4))
    seq = file + [1, 50, 2]
    assert d.draft(seq) == [3, 4, 40, 41]
    d.record(4, 4)
    seq += [3, 4, 40, 41, 9]  # the copy has 5 here, always: another word, not a variant
    assert d.draft(seq) == []
    d = NgramDrafter(SpecParams(n_max=4, ngram_min=2, ngram_max=4))
    seq = file + [1, 50, 2]
    assert d.draft(seq) == [3, 4, 40, 41]
    d.record(4, 4)
    seq += [3, 4, 40, 99]  # 41 was one of three after [2, 3, 4, 40]: the line goes on
    assert d.draft(seq, limit=3) == [5, 6, 7]
    d = NgramDrafter(SpecParams(n_max=4, ngram_min=2, ngram_max=4))
    seq = file + [1, 50, 2]
    assert d.draft(seq) == [3, 4, 40, 41]
    d.record(4, 4)
    seq += [3, 4, 40, 5]  # the copy's 41 left out: its next token comes now
    assert d.draft(seq, limit=3) == [6, 7, 8]
    d = NgramDrafter(SpecParams(n_max=4, ngram_min=2, ngram_max=4))
    seq = file + [1, 50, 2]
    assert d.draft(seq) == [3, 4, 40, 41]
    d.record(3, 4)
    seq += [3, 4, 40, 99]
    assert d.draft(seq, limit=3) == [5, 6, 7]
    d.record(0, 3)
    seq += [98]  # 99 98 where the copy had 41: one token more, then the copy's line again
    assert d.draft(seq) == [5, 6]  # (two tokens: the last draft missed)


def test_drafter_backs_off_when_nothing_is_accepted():
    d = NgramDrafter(SpecParams(n_max=2, ngram_min=1, ngram_max=1))
    seq = [1, 2, 1, 2, 1]
    tried = 0
    for i in range(40):
        dr = d.draft(seq)
        if dr:
            tried += 1
            d.record(0, len(dr))  # the model always said otherwise
        seq.append(1 + (i + 1) % 2)  # the pattern goes on, so a draft is always found
    assert 8 <= tried < 20  # eight misses in a row, then one try in eight


def test_spec_params_are_validated():
    with pytest.raises(RequestError):
        SpecParams(n_max=2, n_min=3).validate()
    with pytest.raises(RequestError):
        SpecParams(ngram_min=0).validate()


def _engine(model=None, **cfg):
    eng = Engine(EngineConfig(**cfg), model=model or FakeModel(), tokenizer=FakeTokenizer())
    eng.start()
    return eng


def _prompt(text):
    return FakeTokenizer().encode(text)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_fake_model_output_is_identical_with_and_without_drafts(temperature):
    """The prompt holds the alphabet, so after "bc" the drafter proposes "defgh...", which the
    fake model (next letter) accepts. With the same seed the sampled path is identical: a
    verified position is sampled from the same logits with the same random draw."""
    prompt = _prompt("xyzabcdefghijklmnopqrstuvw zzabc")
    spec = SpecParams(n_max=6, ngram_min=2, ngram_max=3)
    outs = {}
    for on in (False, True):
        eng = _engine()
        try:
            p = GenParams(n_predict=20, ignore_eos=True, speculative=spec if on else False,
                          sampling=SamplingParams(temperature=temperature, seed=7, n_probs=2))
            outs[on] = eng.generate_sync(prompt, p)
            st = eng.stats()
        finally:
            eng.stop()
        if on:
            assert st.spec_draft_tokens > 0 and st.spec_accepted_tokens > 0
            t = outs[on].final.timings
            assert t.draft_n == st.spec_draft_tokens and t.draft_n_accepted == st.spec_accepted_tokens
    assert outs[True].tokens == outs[False].tokens and len(outs[True].tokens) == 20
    assert outs[True].text == outs[False].text
    for a, b in zip(outs[True].samples, outs[False].samples):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-6


def test_drafts_never_pass_the_limits_and_stop_strings_still_cut():
    prompt = _prompt("abcdefghijklmnopqrstuvwxy abcd")
    eng = _engine(speculative=SpecParams(n_max=8, ngram_min=2, ngram_max=4))  # server-wide default
    try:
        g = SamplingParams(temperature=0.0)
        c = eng.generate_sync(prompt, GenParams(n_predict=5, sampling=g))
        assert c.text == "efghi" and len(c.tokens) == 5 and c.final.stop_type == "limit"
        c = eng.generate_sync(prompt, GenParams(n_predict=20, stop=["ijk"], sampling=g))
        assert c.text == "efgh" and c.final.stop_type == "word"
        # the slot's state holds the evaluated tokens only: prompt + generated minus the last
        st = eng.slots[c.final.slot_id].state
        assert st.tokens == prompt + c.tokens[:-1]
        assert eng.stats().spec_accepted_tokens > 0
    finally:
        eng.stop()


def test_greedy_real_model_identical_and_state_exact(tiny_models):
    """A tiny llama on a prompt that repeats itself: drafts are accepted, the greedy tokens
    are plain decoding's, and the state after is the one plain decoding leaves (a later
    request reusing it gives the same output as from scratch)."""
    from llmcore.models import load_model

    rng = np.random.default_rng(3)
    body = rng.integers(3, 250, size=40).tolist()
    prompt = body + body[:12]
    outs, engines = {}, {}
    for on in (False, True):
        eng = Engine(EngineConfig(n_ctx=512, cache_ram_mib=0), model=load_model(tiny_models["llama-f32"]),
                     tokenizer=FakeTokenizer())
        eng.start()
        engines[on] = eng
        p = GenParams(n_predict=24, ignore_eos=True, speculative=SpecParams(n_max=8) if on else False,
                      sampling=SamplingParams(temperature=0.0, n_probs=3))
        outs[on] = eng.generate_sync(prompt, p)
    try:
        assert outs[True].tokens == outs[False].tokens
        for a, b in zip(outs[True].samples, outs[False].samples):
            assert abs(a.logprob - b.logprob) < 2e-3
        assert engines[True].stats().spec_draft_tokens > 0
        nxt = prompt + outs[True].tokens + [7, 8, 9]
        p = GenParams(n_predict=4, ignore_eos=True, speculative=False, sampling=SamplingParams(temperature=0.0))
        reused = engines[True].generate_sync(nxt, p)
        assert reused.final.timings.cache_n > len(prompt)
        assert reused.tokens == engines[False].generate_sync(nxt, GenParams(
            n_predict=4, ignore_eos=True, cache_prompt=False, sampling=SamplingParams(temperature=0.0))).tokens
    finally:
        for e in engines.values():
            e.stop()


def test_no_drafts_for_recurrent_state():
    """A state that cannot be trimmed back (recurrent layers) is never given drafts."""

    class Recurrent(FakeModel):
        def new_state(self):
            st = super().new_state()
            st.fixed_state_nbytes = 64
            return st

    eng = _engine(Recurrent(), speculative=SpecParams())
    try:
        c = eng.generate_sync(_prompt("abcdefgh abc"), GenParams(n_predict=6, sampling=SamplingParams(temperature=0.0)))
        assert c.text == "defghi" and eng.stats().spec_draft_tokens == 0
    finally:
        eng.stop()


def test_drafts_batch_with_other_slots():
    """Two slots, one drafting and one not, in the same steps: both give plain output."""
    eng = _engine(n_parallel=2)
    try:
        g = SamplingParams(temperature=0.0)
        t1 = eng.submit(_prompt("abcdefghijklmnopqrstu abc"), GenParams(n_predict=12, speculative=SpecParams(), sampling=g), sync=True)
        t2 = eng.submit(_prompt("q"), GenParams(n_predict=6, speculative=False, sampling=g), sync=True)
        c1, c2 = t1.collect_sync(), t2.collect_sync()
        assert c1.text == "defghijklmno" and c2.text == "rstuvw"
    finally:
        eng.stop()


def _code_file(n_lines: int) -> str:
    lines, i = [], 0
    while len(lines) < n_lines:
        lines += [f"def scale_{i}(values, factor={i % 5 + 2}):", "    out = []", "    for v in values:",
                  f"        out.append(v * factor + {i})", "    return out", ""]
        i += 1
    return "\n".join(lines[:n_lines])


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["code edit", "free text"])
def test_greedy_smollm2_speculative_output_is_plain_decoding(smollm2_path, workload):
    """The real model, where a verify segment of many tokens once summed attention in another
    order than one-token decode and greedy output drifted on free text: now the verified
    positions get decode's bits, so the output is the same token for token (and the
    log-probabilities the same)."""
    from llmcore.loader import load_gguf

    lm = load_gguf(smollm2_path)
    if workload == "code edit":
        text = ("Here is a file:\n```python\n" + _code_file(60) + "\n```\nRepeat the whole file exactly, "
                "changing only the name scale_2 to scale_two. Output only the code.")
    else:
        text = "Write a short story about a lighthouse keeper who finds a message in a bottle."
    prompt = lm.tokenizer.encode(lm.chat_template.render([{"role": "user", "content": text}],
                                                         add_generation_prompt=True),
                                 add_special=True, parse_special=True)
    eng = Engine(EngineConfig(n_ctx=4096, n_threads=2, cache_ram_mib=0), model=lm.model, tokenizer=lm.tokenizer,
                 chat_template=lm.chat_template)
    eng.start()
    try:
        outs = {}
        for on in (False, True):
            p = GenParams(n_predict=160, ignore_eos=False, cache_prompt=False,
                          speculative=SpecParams(n_max=16) if on else False,
                          sampling=SamplingParams(temperature=0.0, n_probs=1))
            outs[on] = eng.generate_sync(prompt, p)
        assert outs[True].tokens == outs[False].tokens, (outs[True].text, outs[False].text)
        for a, b in zip(outs[True].samples, outs[False].samples):
            assert a.logprob == b.logprob
        t = outs[True].final.timings
        assert t.draft_n > 0  # drafts were verified (a free-text answer still repeats n-grams)
        if workload == "code edit":
            assert t.draft_n_accepted > len(outs[True].tokens) // 2
    finally:
        eng.stop()
