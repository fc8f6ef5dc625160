"""Errors with one-line messages meant for the user (no traceback)."""


class LLMCoreError(Exception):
    """Base class: the CLI prints str(err) and exits non-zero."""


class ModelLoadError(LLMCoreError):
    """A model file cannot be used (not GGUF, truncated, unsupported...)."""


class RequestError(LLMCoreError):
    """A request is invalid (HTTP 400)."""


class ContextFullError(RequestError):
    """A prompt or generation does not fit in the context."""
