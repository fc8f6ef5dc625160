"""Speculative decoding by prompt lookup: draft tokens from n-grams of the sequence so far
(prompt and generated text), verified in one batched forward.

A coding agent's edit repeats most of a file it was shown; a chat answer quotes its
question. When the last n tokens occurred earlier in the sequence, the tokens that followed
them then are a cheap guess for what follows now (llama-server's `--spec-type ngram-*`,
vLLM's `[ngram]` proposer). The engine evaluates the last sampled token and the k drafted
ones in one segment (a forward of k+1 tokens costs about one of 1 token while decoding is
memory-bound), samples each position in turn exactly as plain decoding would, and keeps the
drafts up to the first that differs from what was sampled: greedy output is identical to
plain decoding, and with sampling the distribution is unchanged (a one-hot draft accepted iff
the token sampled from the model's distribution equals it is exact speculative sampling).

    d = NgramDrafter(SpecParams(n_max=16))
    draft = d.draft(history)        # [] when no n-gram of the suffix occurred before
    d.record(accepted, drafted)     # adapts: drafting stops paying when nothing is accepted
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class SpecParams:
    """How a request drafts (``speculative.*`` request fields, server defaults from
    ``--spec-type ngram --draft-max N --draft-min N --spec-ngram-size-n N``)."""

    n_max: int = 16  # most tokens drafted per step
    n_min: int = 0  # fewer found: no draft this step
    ngram_max: int = 4  # longest suffix n-gram looked up
    ngram_min: int = 2  # shortest
    window: int = 16384  # the lookup sees this many latest tokens (bounds the index's memory)

    def validate(self) -> "SpecParams":
        from ..errors import RequestError

        if not 0 <= self.n_min <= self.n_max <= 64:
            raise RequestError("'speculative.n_min' and 'speculative.n_max' must satisfy 0 <= n_min <= n_max <= 64")
        if not 1 <= self.ngram_min <= self.ngram_max <= 32:
            raise RequestError("speculative n-gram sizes must satisfy 1 <= min <= max <= 32")
        return self


class NgramDrafter:
    """Prompt-lookup drafter over one growing token sequence.

    An index maps every n-gram (for n in [ngram_min, ngram_max]) to the position right after
    its latest occurrence, built incrementally: each token is indexed once, so a step costs
    O(ngram_max) dictionary operations whatever the sequence's length. The n-grams ending at
    the last token are indexed only after the lookup, so a lookup finds an EARLIER occurrence.

    While the text keeps following the copy the last draft came from (its last ngram_max
    tokens still match there), the next draft continues that copy instead of jumping to the
    latest occurrence: an edit of a file whose lines differ only in names and numbers stays
    on the file's own lines, not on the lines just written that look alike.

    When only the last token differs from the copy, and the copy's token there was one of
    several seen after its context (a number or name that varies: the next function of a
    series, a renamed identifier), the copy goes on after it: the rest of the line is the
    copy's (a token of the copy left out, as by a shorter number, is skipped too). A fresh
    lookup of the whole suffix wins when it lands in the same part of the sequence (the
    prompt, or the text written since) as the copy: a model that copies a file's numbers.

    A draft stops before a token that followed its context (the ngram_max tokens before it)
    in fewer than half of that context's occurrences so far (the numbers of such a file: a
    verified row costs more than nothing, and a model that writes its own variation of the
    lines misses there), unless the text has been following its copy at such points: each
    time the sequence passes a point where the copy's token was such a minority, whether it
    wrote the copy's token decides whether the next drafts go through points with that
    context (and through any other, until one of them says otherwise).
    """

    def __init__(self, params: SpecParams):
        self.p = params
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # tokens whose ending n-grams are in the index
        self.drafted = 0
        self.accepted = 0
        self._miss_streak = 0  # steps in a row whose draft got nothing accepted
        # draft length: grows while whole drafts are kept, shrinks to what was kept otherwise
        # (a verified position costs more than nothing: long drafts pay only in a copy)
        self.k = min(self.p.n_max, 4)
        self._src = -1  # where the last draft was read from, and the sequence's length then
        self._src_len = 0
        # how often each ngram_max-gram was followed by each token (positions < _counted)
        self._follow: dict[tuple[int, ...], dict[int, int]] = {}
        self._counted = 0
        self._trust_copy = True  # the text wrote the copy's token where it was a minority
        self._origin = -1  # the sequence's length at the first draft: positions before it are the prompt's
        # the same, per context (its ngram_max tokens): a file's names are copied where its
        # numbers are not, and each comes back at the same context
        self._copy_ok: dict[tuple[int, ...], bool] = {}

    def _index_upto(self, seq: Sequence[int], end: int) -> None:
        idx, lo, hi = self._index, self.p.ngram_min, self.p.ngram_max
        for i in range(self._indexed, end):  # n-grams ending at position i
            for n in range(lo, min(hi, i + 1) + 1):
                idx[tuple(seq[i + 1 - n:i + 1])] = i + 1
        self._indexed = max(self._indexed, end)

    def _count_upto(self, seq: Sequence[int]) -> None:
        n, follow = self.p.ngram_max, self._follow
        for i in range(max(self._counted, n), len(seq)):  # token i after the n before it
            c = follow.setdefault(tuple(seq[i - n:i]), {})
            c[seq[i]] = c.get(seq[i], 0) + 1
        self._counted = max(self._counted, len(seq))

    def _minority(self, context: Sequence[int], token: int) -> bool:
        """`token` followed `context`'s last ngram_max tokens in fewer than half of their
        occurrences (counted so far)."""
        c = self._follow.get(tuple(context[-self.p.ngram_max:]))
        return bool(c) and 2 * c.get(token, 0) < sum(c.values())

    def _learn(self, seq: Sequence[int]) -> None:
        """The positions written since the last draft where its copy's token was a minority:
        did the text write it?"""
        n = self.p.ngram_max
        for i in range(self._src_len, len(seq)):
            j = self._src + (i - self._src_len)  # the copy's position for i
            if j >= self._src_len or (i > self._src_len and seq[i - 1] != seq[j - 1]):
                return  # past what was known then, or the copy was left before i
            ctx = seq[max(0, i - n):i]
            if self._minority(ctx, seq[j]):  # (the context only: no copy of seq)
                self._trust_copy = self._copy_ok[tuple(ctx)] = seq[i] == seq[j]
                if not self._trust_copy:
                    return

    def draft(self, seq: Sequence[int], limit: int | None = None) -> list[int]:
        """Up to n_max tokens that followed the longest earlier occurrence of the
        sequence's suffix (at most `limit`); [] when there is none or fewer than n_min."""
        k = self.k if limit is None else min(self.k, limit)
        if k <= 0 or len(seq) < self.p.ngram_min + 1:
            return []
        if self._miss_streak >= 8 and self._miss_streak % 8:  # it stopped paying: try now and then
            self._miss_streak += 1
            return []
        if self._origin < 0:
            self._origin = len(seq)
        if self._indexed == 0:
            self._indexed = max(0, len(seq) - self.p.window)
            self._counted = max(0, len(seq) - self.p.window)
        if self._src >= 0 and self._src_len >= self.p.ngram_max:
            self._learn(seq)
        self._index_upto(seq, len(seq) - 1)
        L = len(seq)
        at = self._following(seq)
        if at < 0:
            n_found = 0
            for n in range(min(self.p.ngram_max, L - 1), self.p.ngram_min - 1, -1):
                at = self._index.get(tuple(seq[L - n:]))
                if at is not None:
                    n_found = n
                    break
            else:
                at = -1
            # one token changed in the copy being followed: go on with the copy, unless the
            # whole suffix, changed token included, occurred in the same part of the sequence
            # (the prompt, or the text written since): the copy of the file at that name
            sub = self._substituted(seq)
            if sub >= 0 and not (n_found == self.p.ngram_max and (at < self._origin) == (sub < self._origin)):
                at = sub
        out = list(seq[at:at + k]) if at >= 0 else []
        self._index_upto(seq, L)
        self._count_upto(seq)
        if out:
            # each drafted token's context is the copy's (the same tokens, except right after
            # a changed token, whose new value the counts know nothing of yet)
            ctx = list(seq[max(0, at - self.p.ngram_max):at])
            for j, t in enumerate(out):
                if self._minority(ctx, t) and not self._copy_ok.get(tuple(ctx[-self.p.ngram_max:]), self._trust_copy):
                    out = out[:j]
                    break
                ctx.append(t)
        if at < 0 or (not out and self._trust_copy):
            self._src = -1
            return []
        # a draft cut to nothing keeps its copy: the next call learns whether it was right
        self._src, self._src_len = at, L
        return out if len(out) >= max(1, self.p.n_min) else []

    def _following(self, seq: Sequence[int]) -> int:
        """Where the copy the last draft came from stands now, when every token since
        followed it (its last ngram_max tokens match the sequence's); else -1."""
        p, n = self._copy_at(seq)
        return p if n and list(seq[p - n:p]) == list(seq[len(seq) - n:]) else -1

    def _substituted(self, seq: Sequence[int]) -> int:
        """Where that copy stands when the sequence left it at one token only (a name or
        number changed in a copied line: an edit, the next function of a series, whose line
        goes on as the copy's does); else -1."""
        p, n = self._copy_at(seq)
        L = len(seq)
        if n - 1 < self.p.ngram_min:
            return -1
        if self._changed_at(seq, L - 1, p - 1, n - 1):
            # the last token is the copy's next one: the copy's token was dropped (a shorter
            # number), and the copy goes on after that next token
            return p + 1 if seq[L - 1] == seq[p] else p
        if p - 1 - n >= 0 and self._changed_at(seq, L - 2, p - 2, n - 1):
            return p - 1  # and one token more after it (a longer number): the copy goes on
        return -1

    def _changed_at(self, seq: Sequence[int], i: int, j: int, m: int) -> bool:
        """Token i differs from the copy's token j, the m tokens before each are the same,
        and the copy's token was one of several seen after its context (a slot that varies:
        a number, a name; not free text that took another word)."""
        if seq[i] == seq[j] or list(seq[j - m:j]) != list(seq[i - m:i]):
            return False
        return self._minority(seq[max(0, j - self.p.ngram_max):j], seq[j])

    def _copy_at(self, seq: Sequence[int]) -> tuple[int, int]:
        """(the copy's position for the sequence's end, how many tokens before it compare)"""
        if self._src < 0:
            return -1, 0
        L = len(seq)
        p = self._src + (L - self._src_len)
        n = min(self.p.ngram_max, p)
        return (p, n) if n >= self.p.ngram_min and p < L else (-1, 0)

    def record(self, accepted: int, drafted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self._miss_streak = self._miss_streak + 1 if drafted and not accepted else 0
        if drafted:
            self.k = min(self.p.n_max, 2 * self.k) if accepted == drafted else max(2, accepted + 1)


__all__ = ["SpecParams", "NgramDrafter"]
