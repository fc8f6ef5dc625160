import numpy as np
import pytest

from llmcore.sampling import Sampler, SamplingParams, apply_penalties, candidates


def _params(**kw):
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    base.update(kw)
    return SamplingParams(**base)


def _freq(sampler, logits, n=4000):
    counts = np.zeros(logits.shape[0])
    for _ in range(n):
        counts[sampler.sample(logits).token] += 1
    return counts / n


def test_greedy_is_argmax():
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(size=100).astype(np.float32)
        s = Sampler(_params(temperature=0.0))
        assert s.sample(logits).token == int(np.argmax(logits))


def test_temperature_one_matches_softmax():
    probs = np.array([0.5, 0.25, 0.15, 0.1])
    logits = np.log(probs).astype(np.float32)
    f = _freq(Sampler(_params()), logits)
    # 4000 draws: 4 sigma of a binomial with p=.5 is ~0.032
    np.testing.assert_allclose(f, probs, atol=0.035)


def test_temperature_sharpens_and_flattens():
    probs = np.array([0.5, 0.25, 0.15, 0.1])
    logits = np.log(probs)
    for t in (0.5, 2.0):
        expect = probs ** (1 / t)
        expect /= expect.sum()
        f = _freq(Sampler(_params(temperature=t)), logits)
        np.testing.assert_allclose(f, expect, atol=0.035)


def test_top_k_restricts_and_renormalises():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    logits = np.log(probs)
    f = _freq(Sampler(_params(top_k=2)), logits)
    assert f[2] == 0 and f[3] == 0
    np.testing.assert_allclose(f[:2], probs[:2] / probs[:2].sum(), atol=0.035)


def test_top_p_keeps_smallest_prefix():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    ids, p = candidates(np.log(probs), _params(top_p=0.75))
    assert list(ids) == [0, 1]  # 0.5 + 0.3 reaches 0.75
    ids, p = candidates(np.log(probs), _params(top_p=0.85))
    assert list(ids) == [0, 1, 2]
    np.testing.assert_allclose(p, probs[:3] / probs[:3].sum(), rtol=1e-6)
    ids, _ = candidates(np.log(probs), _params(top_p=0.0))
    assert list(ids) == [0]


def test_min_p_threshold_relative_to_max():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    ids, _ = candidates(np.log(probs), _params(min_p=0.3))  # keep p >= 0.15
    assert list(ids) == [0, 1, 2]


def test_seed_reproducible_and_different_seeds_differ():
    logits = np.zeros(1000, dtype=np.float32)
    a = [Sampler(_params(seed=7)).sample(logits).token for _ in range(1)]
    s1, s2, s3 = Sampler(_params(seed=7)), Sampler(_params(seed=7)), Sampler(_params(seed=8))
    seq1 = [s1.sample(logits).token for _ in range(50)]
    seq2 = [s2.sample(logits).token for _ in range(50)]
    seq3 = [s3.sample(logits).token for _ in range(50)]
    assert seq1 == seq2 and seq1 != seq3 and a[0] == seq1[0]


def test_repeat_penalty_llama_cpp_rule():
    logits = np.array([2.0, -2.0, 1.0, 3.0], dtype=np.float32)
    p = _params(repeat_penalty=2.0, repeat_last_n=2)
    out = apply_penalties(logits, [3, 0, 1, 1], p)  # only last 2 count: {1}
    np.testing.assert_allclose(out, [2.0, -4.0, 1.0, 3.0])
    out = apply_penalties(logits, [0, 1], p)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, 3.0])
    # penalty changes the greedy choice
    s = Sampler(_params(temperature=0, repeat_penalty=4.0, repeat_last_n=64))
    assert s.sample(logits, history=[3]).token == 0


def test_frequency_presence_penalties():
    logits = np.zeros(3, dtype=np.float32)
    out = apply_penalties(logits, [1, 1, 2], _params(frequency_penalty=0.5, presence_penalty=0.25))
    np.testing.assert_allclose(out, [0.0, -1.25, -0.75])


def test_n_probs_are_log_softmax_top_n():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=50).astype(np.float32)
    s = Sampler(_params(temperature=0, n_probs=5)).sample(logits)
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    order = np.argsort(-ref)[:5]
    assert [t.id for t in s.top] == list(order)
    np.testing.assert_allclose([t.logprob for t in s.top], ref[order], rtol=1e-6)
    assert s.logprob == pytest.approx(ref[s.token])


def test_logit_bias():
    logits = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    s = Sampler(_params(temperature=0, logit_bias={2: 5.0}))
    assert s.sample(logits).token == 2


@pytest.mark.skipif(not __import__("llmcore")._kernels.ENABLED, reason="LLMCORE_NO_KERNELS=1")
@pytest.mark.parametrize("n,k", [(49152, 40), (1000, 1), (37, 37), (10, 64), (5000, 300)])
def test_top_k_kernel_is_a_stable_descending_sort_prefix(n, k):
    """pyx/sampling.pyx top_k: the k largest, largest first, equal values by index, NaN last."""
    from llmcore._kernels import sampling as K

    rng = np.random.default_rng(n + k)
    x = np.round(rng.standard_normal(n) * 4).astype(np.float32)  # many ties
    x[rng.integers(0, n, size=max(1, n // 50))] = np.nan
    vals, ids = np.empty(k, np.float32), np.empty(k, np.int64)
    got = K.top_k(x, vals, ids)
    order = np.argsort(-np.nan_to_num(x, nan=-np.inf), kind="stable")
    order = order[~np.isnan(x[order])]
    want = order[:k]
    assert got == len(want)
    np.testing.assert_array_equal(ids[:got], want)
    np.testing.assert_array_equal(vals[:got], x[want])


def test_argmax_found_elsewhere_taken_only_when_greedy_and_plain():
    logits = np.array([0.1, 2.0, 1.5, -1.0], dtype=np.float32)
    plain = Sampler(_params(temperature=0.0))
    assert plain.takes_argmax
    assert plain.sample(logits, argmax=1).token == 1
    # the hint is taken as given (the caller's argmax is the row's)
    assert plain.sample(logits, argmax=2).token == 2
    for kw in (dict(temperature=0.7), dict(temperature=0.0, logit_bias={2: 5.0}),
               dict(temperature=0.0, n_probs=2), dict(temperature=0.0, repeat_penalty=1.3, repeat_last_n=8)):
        s = Sampler(_params(**kw))
        assert not s.takes_argmax, kw
        if kw.get("temperature") == 0.0:
            want = s.sample(logits, history=[1]).token
            assert s.sample(logits, history=[1], argmax=0).token == want, kw
    short = Sampler(_params(temperature=0.0), n_vocab=3)  # a tokenizer vocabulary under the model's
    assert short.sample(np.array([0.0, 1.0, 0.5, 9.0], np.float32), argmax=3).token == 1
