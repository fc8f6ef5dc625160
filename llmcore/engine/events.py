"""What flows back from the engine to a caller: tokens with their text, then one final
event (or an error), and the per-request timings."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..sampling import Sample


class StopReason(str, enum.Enum):
    """Why a generation ended; the values are llama-server's ``stop_type`` strings."""

    EOS = "eos"  # an end-of-generation token
    LIMIT = "limit"  # n_predict reached or the slot's context is full
    WORD = "word"  # a stop string
    CANCEL = "cancel"  # the caller went away (no final event is delivered)

    def __str__(self) -> str:
        return self.value


class CacheSource(str, enum.Enum):
    """Where a request's reused prefix came from (``timings.cache_source``)."""

    NONE = "none"
    SLOT = "slot"  # the slot's own state, trimmed
    RAM = "ram"  # the RAM prompt cache
    DISK = "disk"  # the prompt cache's disk tier (read back into RAM for this request)
    CHECKPOINT = "checkpoint"  # a context checkpoint of the slot's state

    def __str__(self) -> str:
        return self.value


@dataclass
class TokenEvent:
    tokens: list[int]  # newly generated tokens (may be emitted with no text: held back)
    text: str  # text safe to show (never a partial stop string)
    samples: list[Sample] = field(default_factory=list)


@dataclass
class Timings:
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cache_source: CacheSource = CacheSource.NONE
    checkpoint_restores: int = 0  # context checkpoints restored for this request
    draft_n: int = 0  # speculative decoding: tokens drafted and verified
    draft_n_accepted: int = 0  # of which kept

    def to_dict(self) -> dict:
        pn, pm, gn, gm = self.prompt_n, self.prompt_ms, self.predicted_n, self.predicted_ms
        return {
            "cache_n": self.cache_n,
            "prompt_n": pn,
            "prompt_ms": pm,
            "prompt_per_token_ms": pm / pn if pn else 0.0,
            "prompt_per_second": 1e3 * pn / pm if pm > 0 else 0.0,
            "predicted_n": gn,
            "predicted_ms": gm,
            "predicted_per_token_ms": gm / gn if gn else 0.0,
            "predicted_per_second": 1e3 * gn / gm if gm > 0 else 0.0,
            "cache_source": str(self.cache_source),
            "checkpoint_restores": self.checkpoint_restores,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
        }


@dataclass
class FinalEvent:
    stop_type: StopReason
    stopping_word: str
    n_prompt: int  # tokens in the prompt
    n_predicted: int
    timings: Timings
    slot_id: int
    truncated: bool = False
    embedding: list[float] | None = None  # an embedding request's pooled hidden states

    @property
    def finish_reason(self) -> str:
        return "length" if self.stop_type == StopReason.LIMIT else "stop"


@dataclass
class ErrorEvent:
    error: BaseException


@dataclass
class Completion:
    """A whole generation, gathered from its events."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    final: FinalEvent | None = None

    def add(self, ev) -> None:
        if isinstance(ev, TokenEvent):
            self.text += ev.text
            self.tokens.extend(ev.tokens)
            self.samples.extend(ev.samples)
        elif isinstance(ev, FinalEvent):
            self.final = ev


Event = TokenEvent | FinalEvent | ErrorEvent

__all__ = ["StopReason", "CacheSource", "TokenEvent", "Timings", "FinalEvent", "ErrorEvent",
           "Completion", "Event"]
