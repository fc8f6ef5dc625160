"""Memory: the plan made at start-up, admission of new requests, and KV pressure.

``-c`` (n_ctx) is the total number of KV tokens all slots may hold together (llama-server's
unified KV); KV blocks are taken on demand, up to n_ctx tokens plus the RAM cache's budget.
The plan caps the pools at ``KV_RAM_FRACTION`` of the RAM available at start-up, so a full
pool means "wait or refuse", never an out-of-memory kill, and says so in the log.

Under pressure during a step (a pool cannot give the blocks a batch needs): evict RAM-cache
entries (LRU), then idle slots' states; then let the youngest prefilling request wait
(preemption: it has emitted nothing yet); a lone request that still does not fit fails
with ContextFullError (HTTP 400). Nothing aborts.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping, Sequence

from ..cache.pool import BlockPool
from .protocols import SequenceState

log = logging.getLogger("llmcore.engine")

# share of the RAM available at start-up that the KV pools (slots + prompt cache) may take
KV_RAM_FRACTION = 0.75
# share of it that context checkpoints may take when no budget is given
CHECKPOINT_RAM_FRACTION = 0.25


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of host RAM; (0, 0) when unknown."""
    try:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                info[k] = int(v.split()[0]) * 1024
        return info.get("MemAvailable", info.get("MemFree", 0)), info.get("MemTotal", 0)
    except (OSError, ValueError):
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        except (ValueError, OSError, AttributeError):
            return 0, 0


@dataclass
class MemoryPlan:
    """What the engine may take, announced at start-up (/props shows it)."""

    kv_bytes_per_token: int = 0
    kv_max_bytes: int = 0  # the pools' limit (slots + prompt cache blocks)
    kv_slots_max_bytes: int = 0  # what n_ctx tokens of live slots may take
    cache_ram_max_bytes: int | None = 0  # None: bounded only by the pools
    checkpoint_bytes: int = 0  # one context checkpoint of one sequence, at most
    checkpoints_max_bytes: int = 0  # the server-wide checkpoint budget (slots + RAM cache)
    state_bytes_per_seq: int = 0  # fixed-size (recurrent) state of one sequence, f32
    state_max_bytes: int = 0  # of all slots together (not in the KV pools; -ctk/-ctv do not apply)
    host_total_bytes: int = 0
    host_available_bytes: int = 0
    kv_capped_by_ram: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _mib(b: int | None) -> str:
    return "unbounded" if b is None else f"{b / 2**20:.0f} MiB"


def cache_budget_bytes(cache_ram_mib: int, available: int) -> int | None:
    """The RAM prompt cache's byte budget: -1 "no limit" is half the available RAM."""
    if cache_ram_mib < 0:
        return available // 2 if available else None
    return cache_ram_mib << 20


def plan_memory(pools: Mapping[str, BlockPool], probe: SequenceState, *, n_ctx: int, n_slots: int,
                cache_budget: int | None, cache_on: bool, n_checkpoints: int,
                host: tuple[int, int], checkpoint_budget_mib: int = -1) -> MemoryPlan:
    """Set each pool's block limit and return the plan (logged by the caller)."""
    avail, total = host
    bpb_total = sum(p.bytes_per_block for p in pools.values()) or 1
    extra = (cache_budget or 0) // bpb_total if cache_on else 0
    kv_max = kv_live = 0
    for p in pools.values():
        if p.max_blocks is None:
            p.max_blocks = p.blocks_for(n_ctx) + 2 * n_slots + extra
        kv_max += p.max_blocks * p.bytes_per_block
        kv_live += min(p.max_blocks, p.blocks_for(n_ctx) + 2 * n_slots) * p.bytes_per_block
    # -c is a ceiling, not a reservation; but a ceiling beyond the machine's RAM would be a
    # promise the process cannot keep: cap the pools at most of what is available now (the
    # model is already loaded), so a full pool means "wait or refuse", never OOM.
    ram_cap = int(avail * KV_RAM_FRACTION) if avail else 0
    capped = bool(ram_cap and kv_max > ram_cap)
    if capped:
        scale = ram_cap / kv_max
        kv_max = kv_live = 0
        for p in pools.values():
            p.max_blocks = max(2 * n_slots, int(p.max_blocks * scale))
            kv_max += p.max_blocks * p.bytes_per_block
            kv_live += min(p.max_blocks, p.blocks_for(n_ctx) + 2 * n_slots) * p.bytes_per_block
    ck_bytes = probe.checkpoint_nbytes
    n_ck = max(0, n_checkpoints) if probe.needs_checkpoints else 0
    if n_ck == 0:
        ck_max = 0
    elif checkpoint_budget_mib >= 0:
        ck_max = checkpoint_budget_mib << 20
    else:  # what every slot's full list would take, within a share of the RAM
        ck_max = n_ck * ck_bytes * n_slots
        if avail:
            ck_max = min(ck_max, max(n_ck * ck_bytes, int(avail * CHECKPOINT_RAM_FRACTION)))
    state = probe.fixed_state_nbytes
    return MemoryPlan(
        kv_bytes_per_token=sum(p.bytes_per_token for p in pools.values()),
        kv_max_bytes=kv_max, kv_slots_max_bytes=kv_live,
        cache_ram_max_bytes=cache_budget if cache_on else 0,
        checkpoint_bytes=ck_bytes, checkpoints_max_bytes=ck_max,
        state_bytes_per_seq=state, state_max_bytes=state * n_slots,
        host_total_bytes=total, host_available_bytes=avail, kv_capped_by_ram=capped)


def log_plan(plan: MemoryPlan, *, n_ctx: int, n_slots: int, cache_on: bool, needs_checkpoints: bool,
             n_checkpoints: int) -> None:
    avail = plan.host_available_bytes
    ck = ("not needed" if not needs_checkpoints else
          f"up to {_mib(plan.checkpoints_max_bytes)} for all slots and the prompt cache together "
          f"({n_checkpoints} per slot, {_mib(plan.checkpoint_bytes)} each)"
          if n_checkpoints > 0 else "off")
    state = (f"; recurrent state {_mib(plan.state_max_bytes)} ({_mib(plan.state_bytes_per_seq)} per "
             f"slot, f32: -ctk/-ctv apply to attention KV only)" if plan.state_bytes_per_seq else "")
    log.info("memory: KV for the slots up to %s (%d tokens x %d B/token over %d slot(s), taken "
             "on demand); prompt cache %s (its KV blocks live in the same pools, pool limit "
             "%s)%s; checkpoints %s; host RAM %s total, %s available",
             _mib(plan.kv_slots_max_bytes), n_ctx, plan.kv_bytes_per_token, n_slots,
             _mib(plan.cache_ram_max_bytes) if cache_on else "off", _mib(plan.kv_max_bytes), state, ck,
             _mib(plan.host_total_bytes), _mib(avail))
    if plan.kv_capped_by_ram:
        log.warning("memory: -c %d and the prompt cache would need more than %.0f%% of the %s "
                    "available; KV pools capped at %s (%d tokens): requests beyond that wait "
                    "or are refused with the numbers", n_ctx, KV_RAM_FRACTION * 100, _mib(avail),
                    _mib(plan.kv_max_bytes), plan.kv_max_bytes // max(1, plan.kv_bytes_per_token))
    most = plan.kv_max_bytes + plan.checkpoints_max_bytes + plan.state_max_bytes
    if avail and most > avail:
        log.warning("KV + recurrent state + checkpoints may use up to %s, more than the %s "
                    "available: requests will wait or be refused when memory runs out",
                    _mib(most), _mib(avail))


_malloc_trim = None


def trim_heap() -> bool:
    """Give the malloc heap's free pages back to the OS (glibc's malloc_trim). A step's
    temporaries (logits, activations) are freed into the heap, where free pages stay
    resident; the engine calls this when it goes idle. False where there is no glibc."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
            _malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _malloc_trim = False
    if not _malloc_trim:
        return False
    _malloc_trim(0)
    return True


def shortfall(batch: Sequence[tuple[SequenceState, object]]) -> dict[BlockPool, int]:
    """Pools that lack blocks for `batch` (state, tokens) segments: pool -> blocks missing."""
    need: dict[BlockPool, int] = {}
    for st, toks in batch:
        for pool, n in st.blocks_needed(len(toks)).items():
            need[pool] = need.get(pool, 0) + n
    return {p: n - p.n_free for p, n in need.items() if n > p.n_free}


def admissible(n_prompt: int, active: Sequence[SequenceState], probe: SequenceState,
               pools: Mapping[str, BlockPool], chunk: int) -> bool:
    """Whether a prompt of n_prompt tokens can get its KV blocks now: free, or held by the
    RAM cache or idle slots (those can be evicted). Always true when nothing else runs
    (then it fits or fails on its own)."""
    if not active or not pools:
        return True
    held: dict[BlockPool, int] = {}
    for st in active:
        for pool, n in st.blocks_held().items():
            held[pool] = held.get(pool, 0) + n
    for pool, want in probe.blocks_to_hold(n_prompt + 1, chunk).items():
        if want > pool.n_free + pool.n_used - held.get(pool, 0):
            return False
    return True


def kv_limit_bytes(pools: Iterable[BlockPool]) -> int:
    """Bytes the pools may hold together at their block limits (0 for unlimited ones)."""
    return sum((p.max_blocks or 0) * p.bytes_per_block for p in pools)


def make_room(batch, evict_cached: Callable[[], bool], drop_idle: Callable[[], bool]) -> bool:
    """Free KV blocks for `batch`: RAM-cache entries first (LRU), then idle slots' states
    (each callback frees one thing and says whether it could). True when something went."""
    freed = False
    short = shortfall(batch)
    unknown = not short and bool(batch)  # the model said full without per-pool numbers
    while short or unknown:
        if not (evict_cached() or drop_idle()):
            break
        freed = True
        if unknown:
            break
        short = shortfall(batch)
    return freed


__all__ = ["KV_RAM_FRACTION", "MemoryPlan", "host_memory", "cache_budget_bytes", "plan_memory", "kv_limit_bytes",
           "log_plan", "shortfall", "admissible", "make_room", "trim_heap"]
