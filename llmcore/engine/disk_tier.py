"""The engine's side of the prompt cache's disk tier (:mod:`llmcore.cache.disk`).

- Spilling: an entry the RAM cache evicts is written to disk (``on_evict``, the RAM
  cache's hook), unless the disk already serves it. A budget eviction keeps the entry's
  KV blocks referenced until the I/O thread has written them (no copy; blocks a snapshot
  holds never change), as long as the writes in flight hold at most ``held_limit_bytes``
  (a quarter of the KV pools: under a fast load the writer falls behind, and queued
  writes holding blocks filled a small pool until decodes failed); beyond it, and for an
  urgent one (KV pool or checkpoint budget full: the memory is needed now), the arrays are
  copied first so the blocks go back at once.
- Serving: a waiting request whose prompt the disk can serve better than the slots and
  the RAM cache (by at least ``MIN_GAIN_TOKENS``) waits while its file is read
  (``must_wait``: the scheduler admits the requests behind it meanwhile, no step waits),
  at most ``wait_s`` seconds; the state read is brought into the RAM cache (``adopt``),
  and the ordinary RAM path restores it (``cache_source`` "disk").
- Stopping: every slot's state and every RAM entry not on disk yet is written
  (``save_all``), before the engine thread ends.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

from ..cache.checkpoints import CheckpointList
from ..cache.disk import DiskCache, DiskLoad
from ..cache.pool import KVCacheFullError
from ..cache.prompt_cache import CacheEntry
from ..cache.protocol import SnapshotFormatError
from ..cache.state_file import export_state, import_state
from .prefix import PrefixPolicy
from .slot import Slot
from .stats import EngineCounters
from .task import Task

log = logging.getLogger("llmcore.engine")

MIN_GAIN_TOKENS = 16  # a disk read must give at least this many more prompt tokens


@dataclass
class DiskWait:
    """A waiting request's dealings with the disk tier."""

    deadline: float
    load: DiskLoad | None = None
    settled: bool = False  # decided: it waits no more


class DiskTier:
    def __init__(self, disk: DiskCache, prefix: PrefixPolicy, counters: EngineCounters, wait_s: float,
                 held_limit_bytes: int | None = None):
        self.disk = disk
        self.prefix = prefix
        self.c = counters
        self.wait_s = max(0.0, wait_s)
        self.held_limit_bytes = held_limit_bytes  # None: no limit
        self.held_bytes = 0  # state bytes whose blocks queued writes hold

    # ---- spilling ------------------------------------------------------------------------
    def on_evict(self, entry: CacheEntry, urgent: bool) -> None:
        """The RAM cache's eviction hook: write `entry` (see module docstring)."""
        self._spill(entry, copy=urgent, bounded=True)

    def _spill(self, entry: CacheEntry, copy: bool, bounded: bool) -> bool:
        disk = self.disk
        if not (disk.enabled and disk.ready) or entry.state is None:
            return False
        cks = list(entry.checkpoints or ())
        if disk.covers(entry.tokens, entry.trim_floor, [c.n_tokens for c in cks]):
            return False
        st = self.prefix.scratch()
        contents = export_state(st, entry.state, cks, entry.trim_floor)
        if not disk.can_write(contents.nbytes, bounded):
            return disk.write(contents, bounded=bounded)  # counts the skip
        nbytes = contents.nbytes
        if self.held_limit_bytes is not None and self.held_bytes + nbytes > self.held_limit_bytes:
            copy = True  # the writer is behind: do not let its queue hold the pools
        if copy:  # read the arrays now: the blocks go back as the entry is released
            return disk.write(contents.loaded(), bounded=bounded)
        snap = st.retain_snapshot(entry.state)
        held = [ck.acquire() for ck in cks]
        self.held_bytes += nbytes

        def release() -> None:
            self.held_bytes -= nbytes
            st.release_snapshot(snap)
            for ck in held:
                ck.release()

        return disk.write(export_state(st, snap, held, entry.trim_floor), on_done=release, bounded=bounded)

    def save_all(self, slots: Sequence[Slot], timeout: float | None) -> None:
        """At a stop: every slot's state and every RAM entry not on disk yet, most recently
        used first, then wait for the writes (up to `timeout` seconds)."""
        pc = self.prefix.pcache
        if pc is None or not self.disk.enabled:
            return
        t0 = time.monotonic()
        if not self.disk.ready:  # still indexing: finish that first
            self.disk.flush(timeout)
        for s in slots:
            if not s.busy and s.n_tokens > 0:
                s.published = False
        self.prefix.publish_idle(slots)
        # the most recently used that fit the disk budget, written oldest first so that
        # the index's LRU order is the RAM cache's
        keep, total, limit = [], 0, self.disk.limit_bytes
        for e in reversed(list(pc)):
            total += e.own_bytes + sum(len(b) * e.block_bytes.get(k, 0) for k, b in e.blocks.items())
            if limit is not None and total > limit:
                break
            keep.append(e)
        n = 0
        for e in reversed(keep):
            n += self._spill(e, copy=False, bounded=False)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - t0))
        done = self.disk.flush(left)
        log.info("disk cache: %d entr%s written at stop in %.1f s%s (%d on disk, %.1f MiB)", n,
                 "y" if n == 1 else "ies", time.monotonic() - t0, "" if done else " (time out: some were not)",
                 self.disk.index.n_entries, self.disk.index.nbytes / 2**20)

    # ---- serving -------------------------------------------------------------------------
    def must_wait(self, task: Task, slots: Sequence[Slot]) -> bool:
        """Whether `task` waits for the disk now (see module docstring)."""
        if not task.params.cache_prompt or len(task.prompt) < 2 or not self.disk.enabled:
            return False
        w: DiskWait | None = task.disk_wait
        now = time.monotonic()
        if w is None:
            w = task.disk_wait = DiskWait(now + self.wait_s)
        if w.settled:
            return False
        if w.load is None and self.disk.ready:
            entry, n = self.disk.best(task.prompt[:-1])
            if entry is None:
                self.c.disk_misses += 1
            if entry is None or n < self._local_best(task.prompt, slots) + MIN_GAIN_TOKENS:
                w.settled = True
                return False
            w.load = self.disk.load(entry, on_loaded=self.adopt)
        if w.load is not None and w.load.done:
            w.settled = True
            return False
        if now >= w.deadline:
            w.settled = True
            self.c.disk_wait_timeouts += 1
            log.info("task %d: its cached state was not read from disk within %.1f s; processing "
                     "the prompt instead", task.id, self.wait_s)
            return False
        return True

    def _local_best(self, prompt, slots: Sequence[Slot]) -> int:
        best = self.prefix.ram_best(prompt)[1]
        for s in slots:
            if not s.busy:
                best = max(best, self.prefix.usable_in_slot(s, prompt)[0])
        return best

    def adopt(self, ld: DiskLoad) -> CacheEntry | None:
        """Bring a state read from disk into the RAM cache (marked as from disk); None when
        it could not be (no room, does not fit the model: then the file leaves the index)."""
        contents, ld.contents = ld.contents, None
        pc = self.prefix.pcache
        if contents is None or pc is None:
            return None
        st = self.prefix.scratch()
        while True:
            try:
                snap, cks = import_state(st, contents)
                break
            except KVCacheFullError:
                if pc.evict_lru() is None:
                    self.c.disk_adopt_failures += 1
                    log.info("disk cache: no KV room to bring a state of %d tokens back", contents.n_tokens)
                    return None
            except (SnapshotFormatError, ValueError) as e:
                self.c.disk_adopt_failures += 1
                self.disk.reject(ld.entry, e)
                return None
        lst = CheckpointList(self.prefix.max_checkpoints, cks)
        fp = snap.footprint()
        for ck in cks:
            ck.charge(self.prefix.checkpoint_budget)
            fp.add(ck.footprint())
        entry = pc.insert(snap.tokens, snap, checkpoints=lst, trim_floor=contents.trim_floor,
                          own_bytes=fp.own_bytes, blocks=fp.blocks, block_bytes=fp.block_bytes,
                          meta={"source": "disk"})
        if entry is not None:
            log.info("disk cache: %d tokens read back in %.0f ms", entry.n_tokens, 1e3 * ld.seconds)
        elif pc.best(snap.tokens)[1] < len(snap.tokens) - 1:  # not kept, and RAM has nothing as good
            self.c.disk_adopt_failures += 1
            log.info("disk cache: a state of %d tokens read back does not fit the RAM cache's budget",
                     len(snap.tokens))
        return entry


__all__ = ["DiskTier", "DiskWait", "MIN_GAIN_TOKENS"]
