"""What a front end (the HTTP server, the dashboard) needs from an engine: ``EngineClient``.

Two classes implement it: ``llmcore.engine.Engine`` (one engine thread in this process) and
``llmcore.cluster.ReplicaPool`` (engines running as Ray Serve replicas, one or many
machines). Both hand out the same ``Task`` for a submitted request, so the routes, the
stream driver and the encoders never ask which one they hold.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from ..metrics import EngineStats
    from .config import EngineConfig, GenParams
    from concurrent.futures import Future

    from .core import EngineStatus
    from .protocols import TextTokenizer
    from .task import Task


@runtime_checkable
class EngineClient(Protocol):
    """One model served: facts about it, requests in, tokens out, numbers for /metrics.

    ``submit`` validates the request before any work (RequestError, ContextFullError, or
    ModelNotReadyError while nothing can serve) and returns a Task to iterate from the
    calling event loop. ``stats()`` is cheap and never blocks: the server calls it on its
    event loop."""

    cfg: "EngineConfig"  # defaults a request starts from (sampling, n_predict), cache settings
    tokenizer: "TextTokenizer | None"  # None until loaded
    chat_template: Any  # llmcore.chat.ChatTemplate, None when the model has none
    info: dict  # path, arch, name, size, n_embd, n_params, n_vocab, n_ctx_train, chat_template
    status: "EngineStatus"
    load_error: str | None
    n_ctx: int  # total context of one engine
    n_ctx_slot: int  # the most tokens one request may hold
    t_start: float  # time.time() when it was made (/v1/models "created")

    @property
    def model_name(self) -> str: ...

    @property
    def needs_checkpoints(self) -> bool:
        """Whether prompts get context checkpoints (sliding-window or recurrent state)."""
        ...

    @property
    def default_n_predict(self) -> int:
        """What a request that sets no limit may generate (-n, else a slot's share)."""
        ...

    @property
    def memory_plan(self) -> dict:
        """The memory plan as plain numbers (/props "memory"), of one engine."""
        ...

    def require_ready(self) -> None:
        """Raise ModelNotReadyError (loading, failed, nothing serving now) unless it serves."""
        ...

    def submit(self, prompt: list[int], params: "GenParams | None" = None) -> "Task": ...

    def close_intake(self) -> None:
        """Refuse new requests from now on (ShuttingDownError); the submitted ones run on."""
        ...

    @property
    def n_active(self) -> int:
        """Requests running or waiting now (a snapshot, from any thread)."""
        ...

    def slot_action(self, action: str, slot_id: int, filename: str | None = None) -> "Future":
        """POST /slots/{id}?action=save|restore|erase: a future of llama-server's result
        object; raises NotSupportedError where slots are not this process's to save."""
        ...

    def stats(self) -> "EngineStats": ...

    def start(self) -> None:
        """Begin loading in the background (returns at once)."""
        ...

    def stop(self) -> None: ...


__all__ = ["EngineClient"]
