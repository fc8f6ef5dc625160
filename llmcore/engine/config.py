"""How an engine is set up (``EngineConfig``) and what one request asks for (``GenParams``)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ContextFullError, RequestError
from ..sampling import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from ..constrain import Constraint
    from .budget import ReasoningBudget

from .speculative import SpecParams  # noqa: E402  (config names it)

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
    # the prompt cache's disk tier: entries evicted from RAM, and all at a clean stop, are
    # written to cache_dir (None: off) within cache_disk_mib (-1 no limit) and found again
    # after a restart; a request whose prefix is on disk waits up to cache_disk_wait_s for it
    cache_dir: str | None = None
    cache_disk_mib: int = 32768
    cache_disk_wait_s: float = 10.0
    cache_disk_flush_s: float = 120.0  # at a stop, the most time writing the disk tier takes
    slot_save_path: str | None = None  # directory of slot save/restore files (None: off)
    slot_prompt_similarity: float = 0.1  # reuse a slot's prefix only above this share of the prompt
    swa_full: bool = False  # full KV on sliding-window layers (trimmable, no checkpoints needed)
    model_alias: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)  # server defaults
    n_predict: int = -1  # default generation limit (-1: until EOS / context end)
    # a stream's tokens after its first reach the event loop at most this often, gathered
    # (each wake-up of the loop takes a core from the step on a small machine); 0: every step
    stream_interval_ms: float = 10.0
    # speculative decoding for every request that does not say otherwise: None (off) or the
    # prompt-lookup drafter's settings (llmcore.engine.speculative; --spec-type ngram)
    speculative: "SpecParams | None" = None
    # the chat template: the GGUF's unless a name (one of the GGUF's named templates, or
    # "chatml") or a template's text (--chat-template-file) overrides it
    chat_template_name: str | None = None
    chat_template_text: str | None = None

    def model_options(self) -> dict:
        """What building the model needs from this config (llmcore.models.load_model)."""
        if self.cache_type_v != self.cache_type_k:
            log.warning("separate K/V cache types are not supported yet; using %s for both",
                        self.cache_type_k)
        return dict(kv_type=self.cache_type_k, swa_full=self.swa_full)

    def template_options(self) -> dict:
        """What choosing the chat template needs (llmcore.loader.load_gguf)."""
        return dict(template_name=self.chat_template_name, template_text=self.chat_template_text)

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


def check_params(params: "GenParams") -> None:
    """RequestError unless a request's parameters are ones an engine runs (sampling values,
    stop strings, min_tokens); the slot and the prompt are checked by who holds them."""
    params.sampling.validate()
    check_stops(params.stop)
    if params.min_tokens < 0:
        raise RequestError("'min_tokens' must be >= 0")


@dataclass
class GenParams:
    n_predict: int = -1  # -1: until EOS or the slot's context is full
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    cache_prompt: bool = True
    id_slot: int = -1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    checkpoint_at: int | None = None  # token position where the last user message starts
    min_tokens: int = 0  # end-of-generation tokens are refused before this many tokens
    constraint: "Constraint | None" = None  # the grammar the output must fit (llmcore.constrain)
    reasoning_budget: "ReasoningBudget | None" = None  # thinking tokens allowed (engine/budget.py)
    embedding: str | None = None  # pool the prompt's hidden states ("mean", "cls", "last"); no generation
    # prompt-lookup drafting (engine/speculative.py): None = the server's default, False = off
    speculative: "SpecParams | bool | None" = None


__all__ = ["EngineConfig", "GenParams", "MAX_STOP_STRINGS", "MAX_STOP_CHARS", "check_params", "check_prompt", "check_stops"]
