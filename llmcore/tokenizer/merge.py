"""The merge loop BPE and SPM share: start from single characters and repeatedly join the
best-ranked adjacent pair (ties: the leftmost) until no pair ranks.

The two kinds differ only in how a pair is ranked. A pair's key (its two symbols joined
by ``separator``) names an entry, and entries are ordered by ``order[entry]``, lowest
first:

- BPE: ``"left right"`` -> its index in the GGUF's merge list, ordered by that index;
- SPM: ``"leftright"`` -> the token id, ordered by minus the token's score.

A heap holds candidate pairs; a candidate is stale once either side has grown, which the
lengths show (a symbol only ever grows to the right, so its length fixes its text).
"""
from __future__ import annotations

import heapq
from typing import Mapping, Sequence


def merge(text: str, entries: Mapping[str, int], order: Sequence[float], separator: str) -> list[str]:
    """The symbols `text` merges into (see the module docstring), in order."""
    syms = list(text)
    n = len(syms)
    if n < 2:
        return syms
    get = entries.get
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list[tuple[float, int, int, int]] = []
    for i in range(n - 1):
        e = get(syms[i] + separator + syms[i + 1])
        if e is not None:
            heap.append((order[e], i, i + 1, 2))
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop
    while heap:
        _, left, right, size = pop(heap)
        ls, rs = syms[left], syms[right]
        if not ls or not rs or len(ls) + len(rs) != size:
            continue
        merged = ls + rs
        syms[left] = merged
        syms[right] = ""
        nr = nxt[right]
        nxt[left] = nr
        if nr >= 0:
            prv[nr] = left
        pl = prv[left]
        if pl >= 0:
            s = syms[pl]
            e = get(s + separator + merged)
            if e is not None:
                push(heap, (order[e], pl, left, len(s) + size))
        if nr >= 0:
            s = syms[nr]
            e = get(merged + separator + s)
            if e is not None:
                push(heap, (order[e], left, nr, size + len(s)))
    return [s for s in syms if s]
