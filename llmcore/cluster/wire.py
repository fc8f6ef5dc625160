"""What travels between the front end and a replica (pickled by Ray): one request, the
batches of events that answer it, and what a replica says about itself."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..engine.config import GenParams
from ..metrics import EngineStats


@dataclass
class ReplicaRequest:
    """One generation. The router reads `prompt` (tokenized in the front end) to find the
    replica that holds its prefix. A grammar travels as its text (`params.constraint` is a
    native matcher): the replica compiles it again for its own engine (`params_here`)."""

    prompt: list[int]
    params: GenParams
    grammar: str | None = None

    @classmethod
    def of(cls, prompt: list[int], params: GenParams) -> "ReplicaRequest":
        if params.constraint is None:
            return cls(prompt, params)
        return cls(prompt, dataclasses.replace(params, constraint=None), params.constraint.grammar)

    def params_here(self, tokenizer) -> GenParams:
        """The parameters with the grammar compiled against `tokenizer` (the replica's)."""
        if self.grammar is None:
            return self.params
        from ..constrain.constraint import Constraint
        from ..constrain.vocab import GrammarVocab

        return dataclasses.replace(self.params, constraint=Constraint(GrammarVocab.of(tokenizer), self.grammar))


@dataclass
class EventBatch:
    """The events a replica had ready at once (a stream yields one batch per item, so a
    fast decode does not pay one round trip per token). `slot_id` is the replica's own slot
    once its engine picked one; the last batch carries the replica's stats taken after the
    request finished, so /slots read right after an answer shows the slot idle."""

    rank: int
    slot_id: int | None
    events: list = field(default_factory=list)  # TokenEvent | FinalEvent | ErrorEvent
    stats: EngineStats | None = None


@dataclass(frozen=True)
class ReplicaFacts:
    """A replica's engine once loaded (the same for every replica of a deployment)."""

    n_ctx: int
    n_ctx_slot: int
    n_slots: int
    n_vocab: int
    n_ctx_train: int
    needs_checkpoints: bool
    memory_plan: dict
    version: str  # llmcore's, to catch a node running another release


@dataclass(frozen=True)
class ReplicaReport:
    """Who a replica is and its numbers now (the front end's fleet view)."""

    rank: int
    pid: int
    node_id: str
    actor_id: str
    stats: EngineStats


__all__ = ["ReplicaRequest", "EventBatch", "ReplicaFacts", "ReplicaReport"]
