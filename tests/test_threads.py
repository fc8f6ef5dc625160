from llmcore.threads import AdaptiveThreads, resolve


def test_resolve():
    assert resolve(3) == 3 and resolve(-100) == 1 and resolve(0) >= 1


def _drive(at, cost, steps, n_tokens=1):
    used = []
    for _ in range(steps):
        n = at.choose(n_tokens)
        used.append(n)
        at.record(n_tokens, n, cost[n])
    return used


def test_adaptive_prefers_the_faster_count_and_keeps_exploring():
    at = AdaptiveThreads(2, explore_every=8)
    used = _drive(at, {1: 1.0, 2: 3.0}, 64)  # one thread is faster (a busy machine)
    assert used.count(1) > 50 and 2 in used[8:]  # mostly 1, but 2 is re-measured now and then
    # the machine goes quiet: two threads become faster, and the choice follows
    used = _drive(at, {1: 1.0, 2: 0.4}, 64)
    assert used[-20:].count(2) >= 17


def test_adaptive_buckets_and_single_thread():
    at = AdaptiveThreads(2, explore_every=4)
    _drive(at, {1: 1.0, 2: 2.0}, 16, n_tokens=1)
    _drive(at, {1: 2.0, 2: 1.0}, 16, n_tokens=8)
    # each bucket keeps its own measurements: 1 thread for single tokens, 2 for 8-token
    # steps (one explore step in every 4 picks the other count)
    picks1 = [at.choose(1) for _ in range(8)]
    picks8 = [at.choose(8) for _ in range(8)]
    assert picks1.count(1) == 6 and picks8.count(2) == 6
    assert AdaptiveThreads(1).choose(5) == 1
