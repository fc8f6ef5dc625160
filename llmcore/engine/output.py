"""What a generation shows: stop strings found as the text streams, and the hold-back.

A stop string must never reach the client, not even in part: text that could still grow
into one is held back until the next token decides. ``StopMatcher`` keeps one
Aho-Corasick automaton over all stop strings, so each new character costs O(1) amortised
whatever the number and length of the stop strings (llama.cpp rescans every stop string
at every token: O(count x length^2) per token).

    m = StopMatcher(["</s>", "\\n\\nUser:"])
    hit = m.feed(piece)      # None, or (start, stop) of the first stop string found,
                             # start counted in characters of everything fed so far
    m.holdback               # characters at the end that could still start a stop string

``held_suffix(text, markers)`` is the same question asked of one whole text (tool-call
parsers hold back a marker that may be arriving): linear in the text it scans.
"""
from __future__ import annotations

import functools
from typing import Iterable, Sequence

from .protocols import StreamDecoder


class _Automaton:
    """Aho-Corasick over a set of strings: goto (dict per state), fail links, and at each
    state the patterns that end there (by index, via output links)."""

    __slots__ = ("goto", "fail", "depth", "out", "patterns")

    def __init__(self, patterns: Sequence[str]):
        self.patterns = tuple(p for p in patterns if p)
        self.goto: list[dict[str, int]] = [{}]
        self.depth = [0]
        self.out: list[tuple[int, ...]] = [()]
        ends: list[list[int]] = [[]]
        for i, p in enumerate(self.patterns):
            s = 0
            for ch in p:
                nxt = self.goto[s].get(ch)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto[s][ch] = nxt
                    self.goto.append({})
                    self.depth.append(self.depth[s] + 1)
                    ends.append([])
                s = nxt
            ends[s].append(i)
        self.fail = [0] * len(self.goto)
        order = []
        queue = list(self.goto[0].values())
        while queue:
            order.extend(queue)
            nxt_q = []
            for s in queue:
                for ch, t in self.goto[s].items():
                    f = self.fail[s]
                    while f and ch not in self.goto[f]:
                        f = self.fail[f]
                    cand = self.goto[f].get(ch, 0)
                    self.fail[t] = cand if cand != t else 0
                    nxt_q.append(t)
            queue = nxt_q
        out: list[tuple[int, ...]] = [()] * len(self.goto)
        for s in order:  # breadth first: a state's fail target is done before it
            out[s] = tuple(ends[s]) + out[self.fail[s]]
        self.out = out

    def open_depth(self, s: int) -> int:
        """Length of the longest suffix of state s's string that is a proper prefix of a
        pattern (a state without children is a complete pattern only: look further)."""
        goto, fail = self.goto, self.fail
        while s and not goto[s]:
            s = fail[s]
        return self.depth[s]

    def step(self, s: int, ch: str) -> int:
        goto, fail = self.goto, self.fail
        while True:
            t = goto[s].get(ch)
            if t is not None:
                return t
            if s == 0:
                return 0
            s = fail[s]


_CACHED_CHARS = 256  # stop sets up to this size are kept (the same few come back all the time)


@functools.lru_cache(maxsize=256)
def _cached_automaton(patterns: tuple[str, ...]) -> _Automaton:
    return _Automaton(patterns)


def _automaton(patterns: tuple[str, ...]) -> _Automaton:
    """Built once per stop set when small; a long one (a few MB of states at the stop
    limits, engine/config.py) lives only as long as its request."""
    if sum(len(p) for p in patterns) <= _CACHED_CHARS:
        return _cached_automaton(patterns)
    return _Automaton(patterns)


class StopMatcher:
    """Incremental stop-string search over a growing text (see module docstring)."""

    __slots__ = ("_ac", "_state", "_pos")

    def __init__(self, stops: Iterable[str]):
        self._ac = _automaton(tuple(dict.fromkeys(s for s in stops if s)))
        self._state = 0
        self._pos = 0  # characters fed so far

    @property
    def empty(self) -> bool:
        return not self._ac.patterns

    def feed(self, text: str) -> tuple[int, str] | None:
        """Scan new text; the earliest-starting stop string among those completed in it
        (start position over all text fed so far, the stop string), or None."""
        ac = self._ac
        if not ac.patterns:
            self._pos += len(text)
            return None
        s, pos, best = self._state, self._pos, None
        pats, out = ac.patterns, ac.out
        for ch in text:
            s = ac.step(s, ch)
            pos += 1
            for i in out[s]:
                start = pos - len(pats[i])
                if best is None or start < best[0]:
                    best = (start, pats[i])
        self._state, self._pos = s, pos
        return best

    @property
    def holdback(self) -> int:
        """Characters at the end of the text fed so far that could still become a stop
        string (the longest suffix that is a proper prefix of one)."""
        return self._ac.open_depth(self._state)


def held_suffix(text: str, markers: Iterable[str]) -> int:
    """How many characters at the end of `text` could start one of `markers` (a marker
    that is complete in `text` is not held). Scans at most the longest marker's length."""
    ms = tuple(dict.fromkeys(m for m in markers if m))
    if not ms or not text:
        return 0
    ac = _automaton(ms)
    longest = max(len(m) for m in ms)
    s = 0
    for ch in text[max(0, len(text) - longest + 1):] if longest > 1 else "":
        s = ac.step(s, ch)
    return ac.open_depth(s)


class StreamOutput:
    """One generation's text as it streams: detokenised incrementally (UTF-8 safe), cut at
    the first stop string, with what could still become one held back.

        out = StreamOutput(tokenizer.stream_decoder(), ["\n\n"])
        text, stop = out.feed(token)   # text safe to show now; stop: the stop string hit
        rest = out.flush()             # at the end: held-back text and partial UTF-8
    """

    __slots__ = ("decoder", "matcher", "text", "n_sent")

    def __init__(self, decoder: StreamDecoder, stops: Iterable[str] = ()):
        self.decoder = decoder
        self.matcher = StopMatcher(stops)
        self.text = ""  # everything decoded so far (cut at a stop string)
        self.n_sent = 0  # characters of self.text already shown

    def feed(self, token: int) -> tuple[str, str | None]:
        piece = self.decoder.feed(token)
        self.text += piece
        hit = self.matcher.feed(piece)
        if hit is not None:
            start, word = hit
            out = self.text[self.n_sent:start]
            self.text = self.text[:start]
            self.n_sent = start
            return out, word
        upto = len(self.text) - self.matcher.holdback
        if upto <= self.n_sent:
            return "", None
        out = self.text[self.n_sent:upto]
        self.n_sent = upto
        return out, None

    def flush(self) -> str:
        """Text held back for stop strings plus what the decoder still buffers."""
        rest = self.text[self.n_sent:] + self.decoder.flush()
        self.text += rest[len(self.text) - self.n_sent:]
        self.n_sent = len(self.text)
        return rest


__all__ = ["StopMatcher", "StreamOutput", "held_suffix"]
