"""The prefix policy: which cached state serves a request, and bringing a slot to it.

Three layers can give a request a prefix of its prompt without evaluating it:

1. the slot's own state (``cache_prompt``), trimmed back to the longest common prefix;
2. the RAM prompt cache (``llmcore.cache.prompt_cache``): states of idle or evicted slots,
   found by a token radix tree; a restore shares the KV blocks (reference counts); an
   entry read back from the disk tier (``llmcore.engine.disk_tier``) is served from here
   too, its first use counted as a disk hit (``CacheSource.DISK``);
3. context checkpoints (``llmcore.cache.checkpoints``) of a state that cannot be trimmed
   (sliding-window KV, recurrent state): the newest one at or before the divergence.

Always at least one prompt token is left to evaluate (its logits start the generation).
Slot choice: ``id_slot`` if given; else the idle slot whose state provides the longest
prefix (above ``slot_prompt_similarity`` of the prompt and at least what the RAM cache
offers); else the least recently used idle slot (empty ones first), whose state goes to
the RAM cache before it takes the best cached state.

Safety: the entry chosen for a restore is pinned from the moment it is chosen until its
blocks are in the slot, so saving the slot's own state first (which may push the cache
over its budget) can never evict it. A failed save or restore is a cache miss, a warning
and a counter; the request is still served.
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np

from ..cache import pool as _pool
from ..cache.checkpoints import CheckpointBudget, CheckpointList, restore_checkpoint, take_checkpoint
from ..cache.prompt_cache import CacheEntry, PromptCache
from .events import CacheSource
from .protocols import SequenceState
from .slot import Slot
from .stats import EngineCounters

log = logging.getLogger("llmcore.engine")

# a slot that would lose at least this many tokens past the kept prefix saves them first
SAVE_MIN_TAIL_TOKENS = 32


def _strict(e: BaseException) -> None:
    """A freed block touched is a bug: in strict mode it fails the request (tests)."""
    if _pool.STRICT_REFCOUNTS and isinstance(e, _pool.BlockRefcountError):
        raise e


def common_prefix(a, b) -> int:
    """Length of the common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


class PrefixPolicy:
    """Chooses and restores cached prefixes for the engine thread (see module docstring).

    ``new_state`` makes an empty sequence state; ``fault_hook`` (tests) is called with
    "save" | "restore" | "checkpoint" before each such operation and may raise.
    """

    def __init__(self, new_state: Callable[[], SequenceState], pcache: PromptCache | None,
                 counters: EngineCounters, *, max_checkpoints: int = 32,
                 slot_prompt_similarity: float = 0.1, needs_checkpoints: bool = False,
                 checkpoint_budget: CheckpointBudget | None = None):
        self.new_state = new_state
        self.checkpoint_budget = checkpoint_budget or CheckpointBudget(None)
        self.pcache = pcache
        self.c = counters
        self.max_checkpoints = max_checkpoints
        self.slot_prompt_similarity = slot_prompt_similarity
        self.needs_checkpoints = needs_checkpoints
        self.fault_hook: Callable[[str], None] | None = None

    def _fault(self, what: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(what)

    # ---- choosing ------------------------------------------------------------------------
    def usable_in_slot(self, slot: Slot, prompt: Sequence[int]) -> tuple[int, CacheSource]:
        """Prompt tokens the slot's own state (or one of its checkpoints) can provide."""
        st = slot.state
        if st is None or st.n_tokens == 0:
            return 0, CacheSource.NONE
        n = min(common_prefix(st.tokens, prompt), len(prompt) - 1)
        if n <= 0:
            return 0, CacheSource.NONE
        if n == st.n_tokens or n >= st.min_trim():
            return n, CacheSource.SLOT
        ck = slot.checkpoints.best_at_or_before(n)
        if ck is not None and ck.n_tokens > 0:
            return ck.n_tokens, CacheSource.CHECKPOINT
        return 0, CacheSource.NONE

    def ram_best(self, prompt: Sequence[int]) -> tuple[CacheEntry | None, int]:
        if self.pcache is None or len(prompt) < 2:
            return None, 0
        return self.pcache.best(prompt[:-1])

    def pick_slot(self, slots: Sequence[Slot], prompt: Sequence[int], id_slot: int | None,
                  cache_prompt: bool) -> Slot | None:
        """The slot a request should run on now, or None (it waits)."""
        idle = [s for s in slots if not s.busy]
        if not idle:
            return None
        if id_slot is not None and id_slot >= 0:
            s = slots[id_slot]
            return None if s.busy else s
        if cache_prompt:
            best, best_n = None, 0
            for s in idle:
                n, _ = self.usable_in_slot(s, prompt)
                if n > best_n:
                    best, best_n = s, n
            _, ram_n = self.ram_best(prompt)
            if best is not None and best_n > self.slot_prompt_similarity * len(prompt) \
                    and best_n >= ram_n:
                return best
        # least recently used (an empty slot first): its state goes to the RAM cache
        return min(idle, key=lambda s: (s.n_tokens > 0, s.t_last_used))

    # ---- bringing a slot to a prefix -----------------------------------------------------
    def prepare(self, slot: Slot, prompt: Sequence[int], cache_prompt: bool) -> tuple[int, CacheSource, int]:
        """Bring the slot's state to the longest prefix of `prompt` that the slot, the RAM
        cache or a checkpoint can provide. Returns (tokens kept, where they came from,
        checkpoints restored); tokens kept < len(prompt)."""
        if slot.state is None:
            slot.state = self.new_state()
            slot.checkpoints.clear()
        st = slot.state
        limit = len(prompt) - 1
        if not cache_prompt:
            if st.n_tokens:
                self.save(slot)
            self.bring_to(slot, 0)
            return 0, CacheSource.NONE, 0
        n_slot, how = self.usable_in_slot(slot, prompt)
        lcp_slot = min(common_prefix(st.tokens, prompt), limit) if st.n_tokens else 0
        entry, n_ram = self.ram_best(prompt)
        if self.pcache is not None and entry is None:
            self.c.ram_misses += 1
        if entry is not None and n_ram > n_slot:
            self.pcache.pin(entry)  # saving the slot below must not evict the choice
            try:
                self.save(slot)  # the slot's own content is about to be replaced
                got, n_ck = self.restore_entry(slot, entry, n_ram)
            finally:
                self.pcache.unpin(entry)
            if got > 0:
                if isinstance(entry.meta, dict) and entry.meta.pop("source", None) == "disk":
                    self.c.disk_hits += 1  # read back for this request; a RAM entry from now on
                    return got, CacheSource.DISK, n_ck
                self.c.ram_hits += 1
                return got, CacheSource.RAM, n_ck
            n_slot = 0  # the restore failed and cleared the slot: cold
        elif st.n_tokens and (n_slot < 0.5 * st.n_tokens or st.n_tokens - n_slot >= SAVE_MIN_TAIL_TOKENS):
            # it loses more than half (llama-server's rule), or a tail long enough to be
            # somebody's conversation (many chats behind one system prompt would otherwise
            # overwrite each other's histories): keep the whole in RAM; blocks are shared
            self.save(slot)
        got, used_ck = self.bring_to(slot, n_slot)
        if got > 0:
            self.c.slot_hits += 1
            return got, (CacheSource.CHECKPOINT if used_ck else CacheSource.SLOT), int(used_ck)
        self.c.slot_misses += 1
        if max(lcp_slot, n_ram) > 0 and self.needs_checkpoints:
            self.c.forced_reprefills += 1
            log.info("slot %d: forcing full prompt re-processing (%d tokens in common, no "
                     "checkpoint at or before them)", slot.id, max(lcp_slot, n_ram))
        return 0, CacheSource.NONE, 0

    def bring_to(self, slot: Slot, n: int) -> tuple[int, bool]:
        """Cut the slot's state back to its first n tokens, restoring a checkpoint where
        trimming cannot; clears it when neither works. Returns (tokens kept, checkpoint used)."""
        st = slot.state
        used = trying_ck = False
        n = max(0, min(n, st.n_tokens))
        try:
            if 0 < n < st.n_tokens:
                if n >= st.min_trim() and st.can_trim(n):
                    if st.trim(n) != n:
                        raise RuntimeError(f"trim to {n} failed")
                else:
                    ck = slot.checkpoints.best_at_or_before(n)
                    if ck is None or ck.n_tokens == 0:
                        n = 0
                    else:
                        trying_ck = True
                        self._fault("restore")
                        n = restore_checkpoint(st, ck)
                        used = True
                        self.c.checkpoints_restored += 1
        except Exception as e:  # noqa: BLE001 - a failed restore is a miss, never a crash
            _strict(e)
            log.warning("slot %d: restoring the cached state failed (%s); re-processing the prompt",
                        slot.id, e)
            if trying_ck:
                self.c.checkpoint_failures += 1
            else:
                self.c.cache_restore_failures += 1
            n, used = 0, False
        if n == 0 and st.n_tokens:
            self.clear(slot)
        self.c.checkpoints_erased += slot.checkpoints.erase_after(n)
        return n, used

    def clear(self, slot: Slot) -> None:
        """Drop the slot's state (and its checkpoints); it holds an empty state after."""
        st = slot.state
        if st is not None:
            try:
                st.release()
            except Exception:  # noqa: BLE001 - a state that cannot be released is replaced
                log.exception("releasing slot %d state failed", slot.id)
        if st is None or st.n_tokens:
            slot.state = self.new_state()
        self.c.checkpoints_erased += slot.checkpoints.clear()
        slot.published = False

    def drop(self, slot: Slot) -> None:
        """Forget the slot's state entirely (its content may be half-updated)."""
        if slot.state is not None:
            try:
                slot.state.release()
            except Exception:  # noqa: BLE001
                log.exception("releasing slot %d state failed", slot.id)
            slot.state = None
        self.c.checkpoints_erased += slot.checkpoints.clear()
        slot.published = False

    # ---- the RAM cache -------------------------------------------------------------------
    def save(self, slot: Slot) -> None:
        """Publish the slot's state (with its checkpoints) to the RAM cache. Blocks are
        shared, not copied. Any failure is a warning and a counter."""
        st = slot.state
        if self.pcache is None or st is None or st.n_tokens == 0 or slot.published:
            return
        snap = cks = None
        try:
            self._fault("save")
            snap = st.snapshot()
            cks = slot.checkpoints.share()
            fp = snap.footprint()
            for ck in cks:
                fp.add(ck.footprint())
            entry = self.pcache.insert(st.tokens, snap, checkpoints=cks, trim_floor=st.min_trim(),
                                       own_bytes=fp.own_bytes, blocks=fp.blocks,
                                       block_bytes=fp.block_bytes, meta={"slot": slot.id})
            snap = cks = None  # the cache owns (or already released) them now
            slot.published = True
            if entry is not None:
                log.debug("slot %d: saved %d tokens to the prompt cache (%d entries, %.1f MiB)",
                          slot.id, entry.n_tokens, self.pcache.n_entries, self.pcache.nbytes / 2**20)
        except Exception as e:  # noqa: BLE001 - never let a cache failure hurt a request
            _strict(e)
            self.c.cache_save_failures += 1
            log.warning("slot %d: saving the state to the prompt cache failed: %s", slot.id, e)
            try:
                if snap is not None:
                    st.release_snapshot(snap)
                if cks is not None:
                    cks.clear()
            except Exception:  # noqa: BLE001
                log.exception("cleanup after a failed save")

    def publish_idle(self, slots: Sequence[Slot]) -> None:
        """Save every idle slot's state that the RAM cache does not have yet."""
        if self.pcache is None:
            return
        for s in slots:
            if not s.busy and not s.published and s.n_tokens > 0:
                self.save(s)

    def restore_entry(self, slot: Slot, entry: CacheEntry, n: int) -> tuple[int, int]:
        """Make the slot hold `entry`'s state cut back to n tokens. Returns (tokens kept,
        checkpoints restored); (0, 0) on failure (the slot is then empty, the entry stays)."""
        st = slot.state
        try:
            self._fault("restore")
            self.c.checkpoints_erased += slot.checkpoints.clear()
            st.restore(entry.state)  # shares the blocks (copy-on-write)
            slot.checkpoints = entry.checkpoints.share() if entry.checkpoints is not None \
                else CheckpointList(self.max_checkpoints)
            slot.checkpoints.max_n = self.max_checkpoints
            self.pcache.touch(entry)
        except Exception as e:  # noqa: BLE001
            _strict(e)
            self.c.cache_restore_failures += 1
            log.warning("slot %d: restoring a cached state failed: %s", slot.id, e)
            self.clear(slot)
            return 0, 0
        got, used_ck = self.bring_to(slot, n)
        return got, int(used_ck)

    def release_entry(self, entry: CacheEntry) -> None:
        """PromptCache callback: drop the references an evicted entry holds."""
        try:
            if entry.state is not None:
                self.scratch().release_snapshot(entry.state)
        finally:
            if entry.checkpoints is not None:
                entry.checkpoints.clear()

    _scratch_state: SequenceState | None = None

    def scratch(self) -> SequenceState:
        """An empty state whose caches give snapshots' references back, export and import
        them (they only need the pools, which every state of the model shares)."""
        if self._scratch_state is None:
            self._scratch_state = self.new_state()
        return self._scratch_state

    # ---- checkpoints -----------------------------------------------------------------------
    def _make_checkpoint_room(self, slot: Slot, new, slots: Sequence[Slot]) -> bool:
        """Free checkpoints until the budget holds `new`: first those of idle slots (oldest
        first), then RAM-cache entries holding checkpoints (LRU; the whole entry goes, so
        its accounting stays exact), then this slot's own oldest. False: nothing left."""
        budget = self.checkpoint_budget
        while budget.over() > 0:
            victim, holder = None, None
            for s in slots:
                if s is slot or s.busy:
                    continue
                ck = s.checkpoints.oldest_unshared()
                if ck is not None and (victim is None or ck.seq < victim.seq):
                    victim, holder = ck, s.checkpoints
            if victim is not None:
                holder.drop(victim)
                self.c.checkpoints_erased += 1
                continue
            if self.pcache is not None and self.pcache.evict_lru(
                    where=lambda e: e.checkpoints is not None and len(e.checkpoints) > 0) is not None:
                continue
            ck = slot.checkpoints.oldest_unshared(keep=new)
            if ck is None:
                return False
            slot.checkpoints.drop(ck)
            self.c.checkpoints_erased += 1
        return True

    def take_checkpoint(self, slot: Slot, kind: str, slots: Sequence[Slot] = ()) -> None:
        """Snapshot the slot's untrimmable state at its position; within the server-wide
        checkpoint budget (freeing other checkpoints first, see `_make_checkpoint_room`)."""
        try:
            self._fault("checkpoint")
            ck = take_checkpoint(slot.state, kind)
        except Exception as e:  # noqa: BLE001
            _strict(e)
            self.c.checkpoint_failures += 1
            log.warning("slot %d: creating a context checkpoint failed: %s", slot.id, e)
            return
        if ck is None:
            return
        ck.charge(self.checkpoint_budget)
        if self.checkpoint_budget.over() > 0 and not self._make_checkpoint_room(slot, ck, slots):
            ck.release()
            self.c.checkpoints_skipped += 1
            log.debug("slot %d: checkpoint budget full (%d B); no checkpoint at %d tokens",
                      slot.id, self.checkpoint_budget.limit_bytes, ck.n_tokens)
            return
        self.c.checkpoints_created += 1
        self.c.checkpoints_erased += slot.checkpoints.add(ck)
        log.debug("slot %d: context checkpoint %d of %d at %d tokens (%s, %d B)", slot.id,
                  len(slot.checkpoints), slot.checkpoints.max_n, ck.n_tokens, kind, ck.nbytes)


__all__ = ["PrefixPolicy", "common_prefix"]
