"""Stop strings and the hold-back (llmcore.engine.output) against a brute-force search."""
import random
import time

from llmcore.engine.output import StopMatcher, held_suffix


def brute_holdback(text: str, stops) -> int:
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def test_held_suffix_equals_brute_force():
    rng = random.Random(0)
    for _ in range(5000):
        stops = ["".join(rng.choice("ab<>") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice("ab<>") for _ in range(rng.randint(0, 12)))
        assert held_suffix(text, stops) == brute_holdback(text, stops), (text, stops)


def test_streaming_match_is_the_earliest_stop_completed():
    """Fed piece by piece: the first piece that completes a stop string reports the one
    that starts earliest (as a search of the whole text from the new piece would)."""
    rng = random.Random(1)
    for _ in range(3000):
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(1, 20)))
        m, acc = StopMatcher(stops), ""
        longest = max(map(len, stops))
        for i in range(0, len(text), 3):
            piece = text[i:i + 3]
            start = max(0, len(acc) - longest + 1)
            acc += piece
            hit = m.feed(piece)
            want = None
            for w in stops:
                j = acc.find(w, start)
                if j >= 0 and (want is None or j < want[0]):
                    want = (j, w)
            assert (hit is None) == (want is None), (acc, stops)
            if hit:
                assert hit[0] == want[0] and acc[hit[0]:].startswith(hit[1])
                break
            assert m.holdback == brute_holdback(acc, stops)


def test_many_long_stops_cost_linear_time():
    """128 stop strings of 3,000 characters: feeding 20,000 characters stays fast (the
    old rescan was O(count x length^2) per token)."""
    rng = random.Random(2)
    stops = ["".join(rng.choice("xyz") for _ in range(3000)) for _ in range(128)]
    m = StopMatcher(stops)
    t0 = time.perf_counter()
    for _ in range(5000):
        assert m.feed("abcd") is None
        assert m.holdback == 0
    assert time.perf_counter() - t0 < 2.0


def test_no_stops():
    m = StopMatcher([])
    assert m.empty and m.feed("anything") is None and m.holdback == 0
    assert held_suffix("abc", []) == 0
