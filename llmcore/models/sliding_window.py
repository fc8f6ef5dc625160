"""Sliding-window layer layout, shared by the architectures that mix local (windowed) and
global attention layers (gemma3, gpt-oss).

    layout = SlidingWindowLayers(model, is_local, window, full=swa_full)
    slot = layout.slots[i]          # pool, index within it, window (0 on global layers)
    model.make_cache() -> layout.make_cache()

Global layers share the "kv" pool and keep every token's K/V; local layers share the
"swa" pool, and each sequence keeps only the window there
(:class:`~llmcore.cache.swa.SWAKVCacheState`: when a step appends, the blocks its queries
cannot see are freed). ``full=True`` (the ``swa_full`` model option) gives local layers a
full :class:`~llmcore.cache.KVCacheState` instead: more memory, and every trim works.
``slack`` (tokens, the ``swa_slack`` option) keeps that many tokens beyond the window.
The model's ``max_kv_bytes`` is split between the two pools by layer count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..cache import BlockPool, CacheState, KVCacheState
from ..cache.swa import SWAKVCacheState

if TYPE_CHECKING:  # pragma: no cover
    from .base import Model


@dataclass(frozen=True)
class LayerSlot:
    """Where one attention layer keeps its K/V."""

    pool: BlockPool  # "kv" or "swa" (pool.name is the cache group)
    index: int  # the layer's index within that pool
    window: int  # attention window; 0 on global layers


def split_bytes(max_bytes: int | None, n_global: int, n_local: int) -> tuple[int | None, int | None]:
    """max_kv_bytes split between the full and the windowed pool, by layer count."""
    if max_bytes is None or max_bytes < 0:
        return max_bytes, max_bytes
    total = max(1, n_global + n_local)
    return max_bytes * n_global // total, max_bytes * n_local // total


class SlidingWindowLayers:
    """The pools of a local/global layer mix, each layer's slot, and the caches they need
    per sequence (see the module docstring)."""

    def __init__(self, model: "Model", is_local: Sequence[bool], window: int, *,
                 full: bool = False, slack: int = 0):
        self.is_local = [bool(x) for x in is_local]
        self.window = int(window)
        self.full = bool(full)
        self.slack = int(slack)
        n_local = sum(self.is_local)
        n_global = len(self.is_local) - n_local
        mb_global, mb_local = split_bytes(model.max_kv_bytes, n_global, n_local)
        self.kv_pool = model.add_pool("kv", n_global, max_bytes=mb_global) if n_global else None
        self.swa_pool = model.add_pool("swa", n_local, max_bytes=mb_local) if n_local else None
        self.slots: list[LayerSlot] = []
        n_seen = {"kv": 0, "swa": 0}
        for local in self.is_local:
            pool = self.swa_pool if local else self.kv_pool
            self.slots.append(LayerSlot(pool, n_seen[pool.name], self.window if local else 0))
            n_seen[pool.name] += 1

    def make_cache(self) -> dict[str, CacheState]:
        caches: dict[str, CacheState] = {}
        if self.kv_pool is not None:
            caches["kv"] = KVCacheState(self.kv_pool)
        if self.swa_pool is not None:
            caches["swa"] = (KVCacheState(self.swa_pool) if self.full
                             else SWAKVCacheState(self.swa_pool, self.window, self.slack))
        return caches


__all__ = ["LayerSlot", "SlidingWindowLayers", "split_bytes"]
