"""Errors with one-line messages meant for the user (no traceback).

Every error a request can meet has its own class; the server maps classes to HTTP
statuses in one place (``llmcore.server.errors``), never by message text.
"""


class LLMCoreError(Exception):
    """Base class: the CLI prints str(err) and exits non-zero."""


class ModelLoadError(LLMCoreError):
    """A model file cannot be used (not GGUF, truncated, unsupported...)."""


class ModelNotReadyError(LLMCoreError):
    """The engine cannot serve yet (or any more)."""


class ModelLoadingError(ModelNotReadyError):
    """The model is still loading (HTTP 503)."""

    def __init__(self, message: str = "Loading model"):
        super().__init__(message)


class ModelLoadFailedError(ModelNotReadyError):
    """The model failed to load; the server serves nothing (HTTP 503)."""


class ShuttingDownError(ModelNotReadyError):
    """The engine is stopping; requests still running or queued end with this."""

    def __init__(self, message: str = "server is shutting down"):
        super().__init__(message)


class ReplicaUnavailableError(ModelNotReadyError):
    """No engine replica can take a request now (one stopped and is being replaced): HTTP
    503 with a Retry-After of `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: float = 5.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ReplicaLostError(ReplicaUnavailableError):
    """The replica running a request died: the request ended there. Before the answer
    started it is a 503 with Retry-After; in a stream that already started, an error event."""

    def __init__(self, message: str, replica: int | None = None, retry_after_s: float = 5.0):
        super().__init__(message, retry_after_s)
        self.replica = replica


class RequestError(LLMCoreError):
    """A request is invalid (HTTP 400)."""


class ContextFullError(RequestError):
    """A prompt or generation does not fit in the context."""

    n_prompt_tokens: int | None = None
    n_ctx: int | None = None

    def __init__(self, message: str, n_prompt_tokens: int | None = None, n_ctx: int | None = None):
        super().__init__(message)
        if n_prompt_tokens is not None:
            self.n_prompt_tokens = n_prompt_tokens
        if n_ctx is not None:
            self.n_ctx = n_ctx


class ImagesNotSupportedError(RequestError):
    """An image in a request: no vision model is supported yet (HTTP 400, on every route)."""

    def __init__(self, where: str = "the request"):
        super().__init__(f"{where}: image input is not supported (this server runs text-only models)")


class EngineFailure(LLMCoreError):
    """The engine could not run a request's step (a bug or a broken model; HTTP 500)."""


class NotSupportedError(LLMCoreError):
    """The server was started without what this request needs (HTTP 501)."""


class SlotFileError(RequestError):
    """A slot save/restore request cannot be done: bad file name, missing or unusable file
    (HTTP 400)."""
