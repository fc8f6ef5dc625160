"""What the engine needs from a model, its per-sequence state and a tokenizer.

The real classes (``llmcore.models.base.Model``, ``llmcore.cache.state.SeqState``,
``llmcore.tokenizer``) and the test fakes (``tests/fakes.py``) implement these in full;
the engine never asks which one it holds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from ..cache.pool import BlockPool
    from ..cache.protocol import CacheState, Footprint


@runtime_checkable
class SequenceSnapshot(Protocol):
    """A restorable copy (or shared reference) of a sequence's state."""

    tokens: tuple[int, ...]

    @property
    def n_tokens(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def footprint(self) -> "Footprint": ...


@runtime_checkable
class SequenceState(Protocol):
    """One sequence's cached state: its tokens and one cache per cache group."""

    tokens: list[int]
    caches: Mapping[str, "CacheState"]

    @property
    def n_tokens(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def needs_checkpoints(self) -> bool: ...

    @property
    def checkpoint_nbytes(self) -> int: ...

    @property
    def fixed_state_nbytes(self) -> int: ...

    def min_trim(self) -> int: ...

    def can_trim(self, n: int) -> bool: ...

    def trim(self, n: int) -> int: ...

    def blocks_needed(self, n: int) -> dict["BlockPool", int]: ...

    def blocks_held(self) -> dict["BlockPool", int]: ...

    def blocks_to_hold(self, n_tokens: int, chunk: int) -> dict["BlockPool", int]: ...

    def snapshot(self) -> SequenceSnapshot: ...

    def restore(self, snap: SequenceSnapshot) -> None: ...

    def release_snapshot(self, snap: SequenceSnapshot) -> None: ...

    def release(self) -> None: ...


@runtime_checkable
class LanguageModel(Protocol):
    """A loaded model: one batched step over several sequences at a time."""

    arch: str
    pools: Mapping[str, "BlockPool"]

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx_train(self) -> int: ...

    def new_state(self) -> SequenceState: ...

    def forward(self, batch: Sequence[tuple[SequenceState, np.ndarray]],
                all_logits: bool = False, output: str = "logits",
                n_logits: Sequence[int] | None = None, argmax: np.ndarray | None = None) -> np.ndarray:
        """Append each segment's tokens to its sequence and return float32 logits
        (n_segments, n_vocab) of each segment's last token; with ``output="hidden"`` the
        final-normed hidden states of every token (embeddings). ``argmax`` (int64, one per
        logits row): filled with each row's argmax (greedy requests). All or nothing: on an
        error (KV pool full: ``ContextFullError``) every sequence is left as it was."""
        ...

    def stats(self) -> dict[str, float]:
        """Model-level counters (e.g. MoE experts computed / skipped); {} when none."""
        ...


@runtime_checkable
class StreamDecoder(Protocol):
    def feed(self, token: int) -> str: ...

    def flush(self) -> str: ...


@runtime_checkable
class TextTokenizer(Protocol):
    bos_id: int | None
    eos_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool  # encode(add_special=True) starts with BOS
    fim: Any  # llmcore.tokenizer.FimTokens (fill-in-the-middle tokens), or None

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_piece_bytes(self) -> int:
        """Byte length of the longest token's piece (special tokens included)."""
        ...

    def is_eog(self, tid: int) -> bool: ...

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def decode(self, tokens, skip_special: bool = True) -> str: ...

    def token_to_piece(self, token: int) -> bytes: ...

    def stream_decoder(self, special: bool = False) -> StreamDecoder: ...


__all__ = ["LanguageModel", "SequenceState", "SequenceSnapshot", "TextTokenizer", "StreamDecoder"]
