"""bench/serve_throughput.py's figures on synthetic streams: the decode figure counts only
the span where every stream is decoding (a prefill of the other prompts between the first
stream's first token and the others' does not dilute it), chunks carrying several tokens
count as their share, and one stream's decode figure is its burst figure."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from serve_load import Result  # noqa: E402
from serve_throughput import decode_rate, window_rate  # noqa: E402


def stream(start: float, n: int, step: float, per_chunk: int = 1) -> Result:
    """n tokens, the first at `start`, one every `step` seconds, delivered per_chunk at a time."""
    r = Result(kind="tput", ok=True)
    r.completion_tokens = n
    r.chunk_times = [start] + [start + step * i for i in range(per_chunk, n, per_chunk)]
    if (n - 1) % per_chunk:
        r.chunk_times.append(start + step * (n - 1))
    return r


def test_staggered_streams_decode_vs_burst():
    # stream 0 starts 0.15 s before the others (their prefill); then 8 streams at 100 steps/s
    res = [stream(0.0, 60, 0.01)] + [stream(0.15, 48, 0.01) for _ in range(7)]
    rate, span = decode_rate(res)
    assert span == pytest.approx(0.59 - 0.15)
    assert rate == pytest.approx(800.0, rel=0.03)  # 8 streams x 100 tokens/s
    burst, _ = window_rate(res)
    assert burst < 0.8 * rate  # the prefill gap counts against the burst figure


def test_chunks_of_several_tokens_count_as_tokens():
    res = [stream(0.0, 49, 0.01, per_chunk=4) for _ in range(4)]
    rate, _ = decode_rate(res)
    assert rate == pytest.approx(400.0, rel=0.1)


def test_one_stream_decode_is_burst():
    res = [stream(0.0, 48, 0.0025)]
    assert decode_rate(res)[0] == pytest.approx(window_rate(res)[0])


def test_no_overlap_or_missing_tokens_is_zero():
    assert decode_rate([stream(0.0, 10, 0.01), stream(0.5, 10, 0.01)]) == (0.0, 0.0)
    empty = Result(kind="tput")
    assert decode_rate([stream(0.0, 10, 0.01), empty]) == (0.0, 0.0)
