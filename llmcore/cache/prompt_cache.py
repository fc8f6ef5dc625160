"""Prompt cache in RAM (cache layer 2): states of idle or evicted slots, usable by any slot.

Entries are indexed by a token radix tree (compressed trie): a lookup walks the prompt
once, O(prompt length), whatever the number of entries, and yields the entries sharing the
longest prefix with it. Eviction is least-recently-used by bytes.

Every byte is counted against the budget: an entry declares the bytes it owns outright
(``own_bytes``: recurrent copies, checkpoint copies) and the KV blocks it references
(``blocks``: pool key -> block ids, ``block_bytes``: pool key -> bytes per block). Blocks
shared by several entries are counted once; blocks shared with live slots are counted too
(the cache pins them). ``nbytes`` is therefore what evicting everything could give back at
most.

The handle stored in an entry (``state``: e.g. a SeqSnapshot) and its checkpoints are
opaque here; ``on_release(entry)`` is called exactly once when an entry leaves the cache
(eviction, replacement, clear) so the owner can drop the references it holds. Before an
eviction for the budget (or for memory: ``evict_lru``, ``urgent``) ``on_evict(entry,
urgent)`` sees the entry while its state is still alive (the disk tier writes it).

    pc = PromptCache(limit_bytes=8 << 30, on_release=lambda e: ...)
    e = pc.insert(tokens, snap, own_bytes=0, blocks={"kv": ids}, block_bytes={"kv": 4096})
    for entry, lcp in pc.lookup(prompt): ...       # longest common prefix first
    pc.touch(entry)                                # used: most recent in LRU order
"""
from __future__ import annotations

import collections
import itertools
import logging
import time
from typing import Any, Callable, Iterable

import numpy as np

log = logging.getLogger("llmcore.cache")


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    d = np.flatnonzero(a[:n] != b[:n])
    return int(d[0]) if len(d) else n


class _Node:
    __slots__ = ("edge", "children", "entries", "parent", "count")

    def __init__(self, edge: np.ndarray, parent: "_Node | None"):
        self.edge = edge  # int32 tokens on the edge from the parent
        self.children: dict[int, _Node] = {}
        self.entries: list[CacheEntry] = []  # entries whose tokens end exactly here
        self.parent = parent
        self.count = 0  # entries in this subtree


_ids = itertools.count(1)


class CacheEntry:
    """One cached state. ``tokens``: int32 array; ``state``: opaque handle; ``checkpoints``:
    opaque (travels with the state); ``trim_floor``: shortest prefix the state can be cut
    back to without a checkpoint (0 = any)."""

    __slots__ = ("id", "tokens", "state", "checkpoints", "trim_floor", "own_bytes", "blocks",
                 "block_bytes", "t_used", "t_created", "hits", "meta", "pins", "_node", "_alive")

    def __init__(self, tokens, state, checkpoints, trim_floor, own_bytes, blocks, block_bytes, meta):
        self.id = next(_ids)
        self.tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        self.state = state
        self.checkpoints = checkpoints
        self.trim_floor = int(trim_floor)
        self.own_bytes = int(own_bytes)
        self.blocks = {k: np.unique(np.asarray(v, dtype=np.int64)) for k, v in (blocks or {}).items()}
        self.block_bytes = dict(block_bytes or {})
        self.t_created = self.t_used = time.monotonic()
        self.hits = 0
        self.meta = meta
        self.pins = 0  # holders that are about to use the state: never evicted meanwhile
        self._node: _Node | None = None
        self._alive = True

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def checkpoint_positions(self) -> list[int]:
        cks = self.checkpoints
        return [int(c.n_tokens) for c in cks] if cks else []

    def can_serve(self, n: int) -> bool:
        """Whether this entry's state can be brought to exactly n of its tokens."""
        return n == self.n_tokens or (0 <= n <= self.n_tokens and
                                       (n >= self.trim_floor or n in self.checkpoint_positions()))

    def usable(self, lcp: int) -> int:
        """Tokens of a prompt sharing `lcp` tokens with this entry that its state (or one of
        its checkpoints) can provide."""
        lcp = min(lcp, self.n_tokens)
        if lcp == self.n_tokens or lcp >= self.trim_floor:
            return lcp
        best = 0
        for p in self.checkpoint_positions():
            if p <= lcp:
                best = max(best, p)
        return best

    def __repr__(self) -> str:
        return f"<CacheEntry #{self.id} {self.n_tokens} tokens floor={self.trim_floor}>"


class PromptCache:
    """Radix-tree-indexed, LRU-by-bytes cache of sequence states (see module docstring).

    ``limit_bytes``: None or < 0 = no byte limit, 0 = nothing is kept.
    """

    def __init__(self, limit_bytes: int | None, on_release: Callable[[CacheEntry], Any] | None = None,
                 max_entries: int | None = None,
                 on_evict: Callable[[CacheEntry, bool], Any] | None = None):
        self.limit_bytes = None if limit_bytes is None or limit_bytes < 0 else int(limit_bytes)
        self.max_entries = max_entries
        self.on_release = on_release
        self.on_evict = on_evict
        self._root = _Node(np.zeros(0, dtype=np.int32), None)
        self._lru: collections.OrderedDict[int, CacheEntry] = collections.OrderedDict()
        self._block_refs: dict[Any, collections.Counter] = {}
        self._own_bytes = 0
        self._bpb: dict = {}  # pool key -> bytes per block
        self.stats = collections.Counter(inserts=0, hits=0, misses=0, evictions=0, skipped=0,
                                         replaced=0, release_errors=0)

    # ---- accounting ------------------------------------------------------------------------
    @property
    def n_entries(self) -> int:
        return len(self._lru)

    def __len__(self) -> int:
        return len(self._lru)

    def __bool__(self) -> bool:  # an empty cache is still a cache
        return True

    def __iter__(self):
        return iter(list(self._lru.values()))

    @property
    def nbytes(self) -> int:
        tot = self._own_bytes
        for key, cnt in self._block_refs.items():
            tot += len(cnt) * self._bpb.get(key, 0)
        return tot

    @property
    def n_tokens(self) -> int:
        return sum(e.n_tokens for e in self._lru.values())

    def _new_bytes(self, entry: CacheEntry) -> int:
        """Bytes the cache grows by when `entry` joins (blocks already counted are free)."""
        add = entry.own_bytes
        for key, ids in entry.blocks.items():
            have = self._block_refs.get(key)
            n_new = len(ids) if not have else sum(1 for b in ids.tolist() if b not in have)
            add += n_new * entry.block_bytes.get(key, 0)
        return add

    def _account(self, entry: CacheEntry, sign: int) -> None:
        self._own_bytes += sign * entry.own_bytes
        for key, ids in entry.blocks.items():
            self._bpb[key] = entry.block_bytes.get(key, self._bpb.get(key, 0))
            cnt = self._block_refs.setdefault(key, collections.Counter())
            if sign > 0:
                cnt.update(ids.tolist())
            else:
                cnt.subtract(ids.tolist())
                for b in ids.tolist():
                    if cnt[b] <= 0:
                        del cnt[b]

    def blocks_held(self, key) -> int:
        cnt = self._block_refs.get(key)
        return len(cnt) if cnt else 0

    # ---- radix tree ------------------------------------------------------------------------
    def _tree_insert(self, entry: CacheEntry) -> None:
        toks = entry.tokens
        node, i = self._root, 0
        path = [node]
        while i < len(toks):
            child = node.children.get(int(toks[i]))
            if child is None:
                leaf = _Node(toks[i:].copy(), node)
                node.children[int(toks[i])] = leaf
                node = leaf
                path.append(node)
                i = len(toks)
                break
            k = _lcp(child.edge, toks[i:])
            if k < len(child.edge):  # split the edge at k
                mid = _Node(child.edge[:k].copy(), node)
                mid.count = child.count
                node.children[int(toks[i])] = mid
                child.edge = child.edge[k:].copy()
                child.parent = mid
                mid.children[int(child.edge[0])] = child
                child = mid
            node = child
            path.append(node)
            i += k
        node.entries.append(entry)
        entry._node = node
        for n in path:
            n.count += 1

    def _tree_remove(self, entry: CacheEntry) -> None:
        node = entry._node
        entry._node = None
        if node is None:
            return
        node.entries.remove(entry)
        n = node
        while n is not None:
            n.count -= 1
            n = n.parent
        # prune empty branches; merge a node left with one child and no entries
        n = node
        while n is not self._root and n.count == 0:
            parent = n.parent
            del parent.children[int(n.edge[0])]
            n = parent
        if n is not self._root and not n.entries and len(n.children) == 1:
            (only,) = n.children.values()
            only.edge = np.concatenate([n.edge, only.edge])
            only.parent = n.parent
            n.parent.children[int(n.edge[0])] = only

    def _walk(self, tokens: np.ndarray) -> tuple[_Node, int, list[tuple[_Node, int]]]:
        """Deepest node whose subtree shares the longest prefix with `tokens`, that prefix's
        length, and the (node, depth) pairs fully matched along the way."""
        node, i = self._root, 0
        path = [(node, 0)]
        while i < len(tokens):
            child = node.children.get(int(tokens[i]))
            if child is None:
                return node, i, path
            k = _lcp(child.edge, tokens[i:])
            if k < len(child.edge):
                return child, i + k, path
            node = child
            i += k
            path.append((node, i))
        return node, i, path

    def _subtree_entries(self, node: _Node, limit: int) -> list[CacheEntry]:
        out: list[CacheEntry] = []
        stack = [node]
        while stack and len(out) < limit:
            n = stack.pop()
            out.extend(n.entries)
            stack.extend(n.children.values())
        return out[:limit]

    # ---- public API ------------------------------------------------------------------------
    def lookup(self, tokens, max_candidates: int = 8) -> list[tuple[CacheEntry, int]]:
        """Entries sharing a prefix with `tokens`, as (entry, common prefix length), the
        longest first: entries below the deepest match (they share all of it), then entries
        that are themselves prefixes of `tokens` (deepest first). Does not count a hit."""
        toks = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if not self._lru or len(toks) == 0:
            return []
        node, depth, path = self._walk(toks)
        out: list[tuple[CacheEntry, int]] = []
        seen = set()
        if depth > 0:
            for e in self._subtree_entries(node, max_candidates):
                out.append((e, min(depth, e.n_tokens)))
                seen.add(e.id)
        for n, d in reversed(path):
            if d == 0 or len(out) >= 2 * max_candidates:
                break
            for e in n.entries:
                if e.id not in seen:
                    out.append((e, d))
                    seen.add(e.id)
        out.sort(key=lambda x: (-x[1], -x[0].t_used))
        return out

    def best(self, tokens, min_tokens: int = 1) -> tuple[CacheEntry | None, int]:
        """The entry whose state can provide the most of `tokens` (see CacheEntry.usable)."""
        best, best_n = None, 0
        for e, lcp in self.lookup(tokens):
            u = e.usable(lcp)
            if u > best_n or (u == best_n and best is not None and u and e.t_used > best.t_used):
                best, best_n = e, u
        if best_n < min_tokens:
            return None, 0
        return best, best_n

    def touch(self, entry: CacheEntry) -> None:
        if entry._alive and entry.id in self._lru:
            entry.t_used = time.monotonic()
            entry.hits += 1
            self._lru.move_to_end(entry.id)

    # ---- pinning ---------------------------------------------------------------------------
    def pin(self, entry: CacheEntry) -> None:
        """Keep `entry` (and its blocks) alive until ``unpin``: a slot that chose it to
        restore may save its own state first, and that insert must not evict the choice."""
        if not entry._alive:
            raise RuntimeError(f"pin of a released cache entry {entry!r}")
        entry.pins += 1

    def unpin(self, entry: CacheEntry) -> None:
        if entry.pins <= 0:
            raise RuntimeError(f"unpin of an entry that is not pinned {entry!r}")
        entry.pins -= 1
        if entry.pins == 0 and entry._alive:
            self.enforce()  # what the pin kept over budget goes now

    def _evictable(self, keep: CacheEntry | None = None, where=None) -> CacheEntry | None:
        """The least recently used entry that may go (not pinned, not `keep`, `where(e)`)."""
        for e in self._lru.values():
            if e is not keep and e.pins == 0 and (where is None or where(e)):
                return e
        return None

    def insert(self, tokens, state, *, checkpoints=None, trim_floor: int = 0, own_bytes: int = 0,
               blocks: dict | None = None, block_bytes: dict | None = None,
               meta: Any = None) -> CacheEntry | None:
        """Add a state. Returns the entry, or None when it was not kept (already covered by
        an entry, or larger than the whole budget); then ``on_release`` is called for it
        right away, so the caller never has to release a refused state itself."""
        entry = CacheEntry(tokens, state, checkpoints, trim_floor, own_bytes, blocks, block_bytes, meta)
        if entry.n_tokens == 0:
            self._release(entry)
            self.stats["skipped"] += 1
            return None
        # an existing entry that already serves this prompt: keep it, refresh it
        for e, lcp in self.lookup(entry.tokens, max_candidates=4):
            if lcp == entry.n_tokens and e.can_serve(entry.n_tokens):
                self.touch(e)
                self._release(entry)
                self.stats["skipped"] += 1
                return None
        # entries that are prefixes of this one and that it can serve: obsolete
        node, depth, path = self._walk(entry.tokens)
        for n, d in path:
            for e in list(n.entries):
                if d == e.n_tokens and entry.can_serve(d) and e.pins == 0:
                    self._remove(e)
                    self.stats["replaced"] += 1
        need = self._new_bytes(entry)
        if self.limit_bytes is not None and need > self.limit_bytes:
            log.info("prompt state of %d tokens (%.1f MiB) exceeds the cache limit (%.1f MiB), "
                     "not cached", entry.n_tokens, need / 2**20, self.limit_bytes / 2**20)
            self._release(entry)
            self.stats["skipped"] += 1
            return None
        self._tree_insert(entry)
        self._lru[entry.id] = entry
        self._account(entry, +1)
        self.stats["inserts"] += 1
        self.enforce(keep=entry)
        return entry

    def enforce(self, keep: CacheEntry | None = None) -> int:
        """Evict least recently used entries until within the byte (and entry) limit;
        pinned entries and `keep` stay (the budget is then exceeded until they are unpinned)."""
        n = 0
        while self._lru and self._over():
            victim = self._evictable(keep)
            if victim is None:
                break
            self._evict(victim, urgent=False)
            n += 1
        return n

    def _evict(self, entry: CacheEntry, urgent: bool) -> None:
        """An entry leaves for the budget (``urgent``: memory is needed now): ``on_evict``
        sees it (the disk tier writes it) before it is released."""
        if self.on_evict is not None:
            try:
                self.on_evict(entry, urgent)
            except Exception:  # noqa: BLE001 - the eviction itself must happen
                log.exception("prompt cache eviction hook failed")
        self._remove(entry)
        self.stats["evictions"] += 1

    def _over(self) -> bool:
        if self.max_entries is not None and len(self._lru) > self.max_entries:
            return True
        return self.limit_bytes is not None and self.nbytes > self.limit_bytes

    def evict_lru(self, where=None) -> CacheEntry | None:
        """Evict the least recently used unpinned entry (for which `where(entry)` holds, if
        given); returns it (released), or None when nothing can go."""
        victim = self._evictable(where=where)
        if victim is None:
            return None
        self._evict(victim, urgent=True)
        return victim

    def remove(self, entry: CacheEntry) -> None:
        if entry.pins:
            raise RuntimeError(f"remove of a pinned cache entry {entry!r}")
        if entry._alive and entry.id in self._lru:
            self._remove(entry)

    @property
    def n_evictable(self) -> int:
        return sum(1 for e in self._lru.values() if e.pins == 0)

    def _remove(self, entry: CacheEntry) -> None:
        del self._lru[entry.id]
        self._tree_remove(entry)
        self._account(entry, -1)
        self._release(entry)

    def _release(self, entry: CacheEntry) -> None:
        if not entry._alive:
            return
        entry._alive = False
        if self.on_release is not None:
            try:
                self.on_release(entry)
            except Exception:  # noqa: BLE001 - a failed release must not break the cache
                self.stats["release_errors"] += 1
                log.exception("releasing prompt cache entry failed")

    def clear(self) -> int:
        n = len(self._lru)
        for e in list(self._lru.values()):
            self._remove(e)
        return n

    def entries(self) -> Iterable[CacheEntry]:
        return list(self._lru.values())

    def snapshot_stats(self) -> dict:
        s = dict(self.stats)
        s.update(bytes=self.nbytes, entries=self.n_entries, tokens=self.n_tokens,
                 limit_bytes=-1 if self.limit_bytes is None else self.limit_bytes)
        return s


__all__ = ["PromptCache", "CacheEntry"]
