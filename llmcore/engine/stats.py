"""The engine's counters: written by the engine thread only, read (copied) by any thread
into an ``llmcore.metrics.EngineStats`` snapshot."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineCounters:
    requests_total: int = 0
    requests_errors: int = 0
    requests_cancelled: int = 0
    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    cache_tokens_total: int = 0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    # cache layer 1: slot prefix reuse
    slot_hits: int = 0
    slot_misses: int = 0
    # cache layer 2: RAM prompt cache
    ram_hits: int = 0
    ram_misses: int = 0
    cache_save_failures: int = 0
    cache_restore_failures: int = 0
    # the prompt cache's disk tier (its file counters come from llmcore.cache.disk)
    disk_hits: int = 0  # requests served (partly) from a state read back from disk
    disk_misses: int = 0  # requests the disk could not give more than RAM and the slots
    disk_wait_timeouts: int = 0  # requests that started before their state was read
    disk_adopt_failures: int = 0  # states read but not brought into RAM (no room, mismatch)
    # cache layer 3: context checkpoints
    checkpoints_created: int = 0
    checkpoints_restored: int = 0
    checkpoints_erased: int = 0
    checkpoint_failures: int = 0
    checkpoints_skipped: int = 0  # not taken: the server-wide checkpoint budget was full
    forced_reprefills: int = 0
    # speculative decoding
    spec_draft_tokens: int = 0  # drafted tokens verified
    spec_accepted_tokens: int = 0  # of which kept
    # memory pressure
    idle_slot_evictions: int = 0
    kv_full_waits: int = 0
    kv_full_failures: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


__all__ = ["EngineCounters"]
