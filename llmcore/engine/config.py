"""How an engine is set up (``EngineConfig``) and what one request asks for (``GenParams``)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..errors import ContextFullError, RequestError
from ..sampling import SamplingParams

log = logging.getLogger("llmcore.engine")


@dataclass
class EngineConfig:
    n_ctx: int = 0  # total context; 0 = the model's training context
    n_parallel: int = 1  # slots
    n_batch: int = 2048  # most tokens in one forward (all slots)
    n_ubatch: int = 512  # most prompt tokens one slot adds per forward
    kv_unified: bool = True  # every slot may use the whole n_ctx (memory on demand)
    n_threads: int = 0  # 0 = default (llmcore.threads)
    n_threads_batch: int = 0
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    cache_ram_mib: int = 8192  # prompt cache in RAM; -1 no limit (bounded by free RAM), 0 off
    cache_idle_slots: bool = True  # publish idle slots' states to the RAM cache on new tasks
    ctx_checkpoints: int = 32  # per slot; <= 0 off
    checkpoint_every_n_tokens: int = 8192  # during prefill; <= 0 off (other positions stay)
    # all checkpoints of all slots and the RAM cache together, MiB; -1: automatic (what
    # ctx_checkpoints per slot would take, capped at CHECKPOINT_RAM_FRACTION of free RAM)
    checkpoint_budget_mib: int = -1
    slot_prompt_similarity: float = 0.1  # reuse a slot's prefix only above this share of the prompt
    swa_full: bool = False  # full KV on sliding-window layers (trimmable, no checkpoints needed)
    model_alias: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)  # server defaults
    n_predict: int = -1  # default generation limit (-1: until EOS / context end)

    def model_options(self) -> dict:
        """What building the model needs from this config (llmcore.models.load_model)."""
        if self.cache_type_v != self.cache_type_k:
            log.warning("separate K/V cache types are not supported yet; using %s for both",
                        self.cache_type_k)
        return dict(kv_type=self.cache_type_k, swa_full=self.swa_full)

    @property
    def checkpoints_on(self) -> bool:
        return self.ctx_checkpoints > 0


# stop strings a request may give: the matcher's automaton costs time and memory per
# character, built on the engine thread when the request starts
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 256  # each


def check_stops(stops) -> None:
    """RequestError unless `stops` is at most MAX_STOP_STRINGS strings of at most
    MAX_STOP_CHARS characters."""
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"'stop': at most {MAX_STOP_STRINGS} stop strings ({len(stops)} given)")
    for s in stops:
        if not isinstance(s, str):
            raise RequestError("stop must be a string or a list of strings")
        if len(s) > MAX_STOP_CHARS:
            raise RequestError(f"'stop': a stop string has at most {MAX_STOP_CHARS} characters ({len(s)} given)")


def check_prompt(prompt: list[int], n_ctx_slot: int, n_vocab: int) -> None:
    """RequestError / ContextFullError unless `prompt` is non-empty token ids of the
    vocabulary that leave room in a slot of `n_ctx_slot` tokens."""
    if len(prompt) == 0:
        raise RequestError("the prompt is empty")
    if len(prompt) >= n_ctx_slot:
        raise ContextFullError(
            f"the request exceeds the available context size, try increasing it "
            f"({len(prompt)} prompt tokens, n_ctx {n_ctx_slot}). This model's maximum "
            f"context length is {n_ctx_slot} tokens. However, your messages resulted "
            f"in {len(prompt)} tokens.", n_prompt_tokens=len(prompt), n_ctx=n_ctx_slot)
    if min(prompt) < 0 or max(prompt) >= n_vocab:
        raise RequestError(f"prompt contains an invalid token id (vocabulary size {n_vocab})")


@dataclass
class GenParams:
    n_predict: int = -1  # -1: until EOS or the slot's context is full
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    cache_prompt: bool = True
    id_slot: int = -1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    checkpoint_at: int | None = None  # token position where the last user message starts


__all__ = ["EngineConfig", "GenParams", "MAX_STOP_STRINGS", "MAX_STOP_CHARS", "check_prompt", "check_stops"]
