"""Which replica holds which prompt prefix, and the routing choice made from it.

The router cannot see a replica's caches; it remembers what it sent where. A prompt is
cut into blocks of `block_size` tokens, each block hashed together with the hash of the
blocks before it (a chain, like a prefix tree's path), so two prompts share their first k
hashes exactly when they share their first k blocks. Per replica the index keeps the
hashes it routed there, least recently used dropped first; the first block of a prompt is
touched last, so a chain loses its tail before its head.

`rank_replicas` is the policy, kept free of Ray so it is tested on plain numbers: among
the replicas whose queue is within `imbalance` of the shortest, the one holding the
longest prefix wins when that prefix is at least `match_rate` of the prompt; otherwise the
shortest queue, the replica holding less first (new conversations spread out).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Iterable, Mapping, Sequence, TypeVar

R = TypeVar("R", bound=Hashable)


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """One chained hash per whole block of `tokens` (a shorter tail is not hashed)."""
    out: list[int] = []
    h = 0
    for i in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, tuple(tokens[i:i + block_size])))
        out.append(h)
    return out


class PrefixIndex:
    """Per replica, the block hashes of the prompts routed to it (bounded, LRU)."""

    def __init__(self, block_size: int = 16, max_blocks_per_replica: int = 1 << 16):
        self.block_size = block_size
        self.max_blocks = max_blocks_per_replica
        self._held: dict[Hashable, OrderedDict[int, None]] = {}

    def hashes(self, tokens: Sequence[int]) -> list[int]:
        return block_hashes(tokens, self.block_size)

    def insert(self, replica: Hashable, hashes: Sequence[int]) -> None:
        held = self._held.setdefault(replica, OrderedDict())
        for h in reversed(hashes):  # the head last: most recently used, evicted last
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.max_blocks:
            held.popitem(last=False)

    def matched_blocks(self, replica: Hashable, hashes: Sequence[int]) -> int:
        """Leading blocks of `hashes` the replica holds."""
        held = self._held.get(replica)
        if not held:
            return 0
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def size(self, replica: Hashable) -> int:
        return len(self._held.get(replica, ()))

    def forget(self, replica: Hashable) -> None:
        self._held.pop(replica, None)

    def keep_only(self, replicas: Iterable[Hashable]) -> None:
        live = set(replicas)
        for r in [r for r in self._held if r not in live]:
            del self._held[r]


def rank_replicas(candidates: Sequence[R], queue_lens: Mapping[R, int | None],
                  matched: Mapping[R, int], held: Mapping[R, int], n_prompt_blocks: int,
                  imbalance: int, match_rate: float) -> list[list[R]]:
    """Ranked groups of replicas, most preferred first: the chosen replica alone, then the
    others that answered by load, then every candidate (the router sends to the first
    group with room). A replica whose queue length is unknown is only in the last group."""
    known = {r: q for r in candidates if (q := queue_lens.get(r)) is not None}
    if not known:
        return [list(candidates)]
    shortest = min(known.values())

    def load(r: R) -> tuple[int, int]:
        return known[r], held.get(r, 0)

    balanced = [r for r in known if known[r] - shortest <= imbalance]
    best = max(matched.get(r, 0) for r in balanced)
    if best > 0 and best >= match_rate * n_prompt_blocks:
        chosen = min((r for r in balanced if matched.get(r, 0) == best), key=load)
    else:
        chosen = min(known, key=load)
    rest = sorted((r for r in known if r != chosen), key=load)
    groups = [[chosen]] + ([rest] if rest else [])
    return groups + ([list(candidates)] if len(known) < len(candidates) else [])


__all__ = ["PrefixIndex", "block_hashes", "rank_replicas"]
