"""Errors as HTTP answers, in one place.

Each exception class has one `ErrorKind` (HTTP status and error type, for the OpenAI-style
envelope and for Anthropic's); the envelopes below read it, never the message text. The
middleware answers every failed request with its route's envelope (`uses_envelope`)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web

from ..errors import (ContextFullError, LLMCoreError, ModelLoadFailedError, ModelLoadingError,
                      NotSupportedError, ReplicaUnavailableError, RequestError, ShuttingDownError)
from .sse import ClientGone

log = logging.getLogger("llmcore.server")


@dataclass(frozen=True)
class ErrorKind:
    status: int  # HTTP status of the OpenAI-style and native routes
    type: str  # OpenAI envelope "type"
    anthropic_status: int
    anthropic_type: str


INVALID = ErrorKind(400, "invalid_request_error", 400, "invalid_request_error")
UNAUTHORIZED = ErrorKind(401, "authentication_error", 401, "authentication_error")
NOT_FOUND = ErrorKind(404, "not_found_error", 404, "not_found_error")
FORBIDDEN = ErrorKind(403, "permission_error", 403, "permission_error")
TIMEOUT = ErrorKind(408, "invalid_request_error", 408, "invalid_request_error")
TOO_LARGE = ErrorKind(413, "invalid_request_error", 413, "request_too_large")
MEDIA_TYPE = ErrorKind(415, "invalid_request_error", 415, "invalid_request_error")
LOADING = ErrorKind(503, "unavailable_error", 529, "overloaded_error")  # clients retry 529
UNAVAILABLE = ErrorKind(503, "unavailable_error", 500, "api_error")
INTERNAL = ErrorKind(500, "server_error", 500, "api_error")
NOT_SUPPORTED = ErrorKind(501, "not_supported_error", 500, "api_error")


class SpoiledConnectionError(RequestError):
    """After this answer the connection is closed: the rest of the body may still be on it
    (a client that reused it would read garbage)."""


class UnreadableBodyError(SpoiledConnectionError):
    """The body cannot be read (e.g. broken gzip): 400."""


class BodyTooLargeError(SpoiledConnectionError):
    """The (decoded) body passed ServerConfig.max_body_bytes: 413, refused while reading."""


class BodyTimeoutError(SpoiledConnectionError):
    """The body did not arrive within ServerConfig.body_timeout_s: 408, and the connection
    is closed at once (aiohttp would otherwise linger on it, reading what never comes)."""


class TooLargeError(RequestError):
    """A request asks for more work than this server would ever do for one (text or token
    counts past what the context could use, a JSON body of too many values): 413."""


class UnauthorizedError(RequestError):
    """No API key, or not one of the server's (--api-key): 401."""


class ModelNotFoundError(RequestError):
    """GET /v1/models/{id} of a model this server does not serve: 404."""


class ForbiddenHostError(RequestError):
    """A Host header this server does not answer to (a loopback bind, a foreign name): 403."""


class UnsupportedMediaTypeError(SpoiledConnectionError):
    """A body of a type the route does not take (text/plain, forms): 415."""


# by class, most specific first; RequestError covers ContextFullError
_KINDS: tuple[tuple[type[BaseException], ErrorKind], ...] = (
    (UnauthorizedError, UNAUTHORIZED),
    (ModelNotFoundError, NOT_FOUND),
    (ForbiddenHostError, FORBIDDEN),
    (BodyTimeoutError, TIMEOUT),
    (BodyTooLargeError, TOO_LARGE),
    (TooLargeError, TOO_LARGE),
    (UnsupportedMediaTypeError, MEDIA_TYPE),
    (RequestError, INVALID),
    (ModelLoadingError, LOADING),
    (ReplicaUnavailableError, LOADING),  # a replica stopped: retry (Retry-After)
    (ModelLoadFailedError, UNAVAILABLE),
    (ShuttingDownError, UNAVAILABLE),  # not a bug: the client may retry elsewhere or later
    (NotSupportedError, NOT_SUPPORTED),
    (LLMCoreError, INTERNAL),  # EngineFailure, ...
)


def kind_of(exc: BaseException) -> ErrorKind:
    for cls, kind in _KINDS:
        if isinstance(exc, cls):
            return kind
    return INTERNAL


# ---- the OpenAI-style envelope (OpenAI routes, native routes, Responses) ----------------

_HTTP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def error_body(status: int, message: str, type_: str | None = None, **extra) -> dict:
    err = {"message": message, "type": type_ or _HTTP_TYPES.get(status, "server_error"), "code": status}
    err.update(extra)
    return {"error": err}


def error_response(status: int, message: str, type_: str | None = None, **extra) -> web.Response:
    return web.json_response(error_body(status, message, type_, **extra), status=status)


def openai_error(exc: BaseException) -> tuple[int, dict]:
    """HTTP status and `{"error": {message, type, code}}` for an exception."""
    kind = kind_of(exc)
    if isinstance(exc, LLMCoreError):
        message = str(exc)
    else:
        message = f"internal error: {type(exc).__name__}: {exc}"
    extra = {}
    if isinstance(exc, ContextFullError):
        # OpenAI's code for a prompt that does not fit (clients trim their history on it)
        extra = {"code": CONTEXT_LENGTH_EXCEEDED, "param": "messages"}
        if exc.n_ctx is not None:
            extra.update(n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx)
    return kind.status, error_body(kind.status, message, kind.type, **extra)


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def responses_error(exc: BaseException) -> tuple[int, dict]:
    """The OpenAI envelope; a prompt that does not fit names `input`."""
    status, body = openai_error(exc)
    if isinstance(exc, ContextFullError):
        body["error"]["param"] = "input"
    return status, body


# ---- Anthropic's envelope (/v1/messages) --------------------------------------------------


def anthropic_error(exc: BaseException) -> tuple[int, dict]:
    """HTTP status and `{"type": "error", "error": {type, message}}` for an exception."""
    kind = kind_of(exc)
    if isinstance(exc, ContextFullError) and exc.n_ctx is not None:
        message = f"prompt is too long: {exc.n_prompt_tokens} tokens > {exc.n_ctx} maximum"
    elif isinstance(exc, LLMCoreError):
        message = str(exc)
    else:
        message = f"{type(exc).__name__}: {exc}"
    return kind.anthropic_status, {"type": "error", "error": {"type": kind.anthropic_type,
                                                              "message": message}}


# ---- which envelope a route answers with, and the middleware -----------------------------

Envelope = Callable[[BaseException], "tuple[int, dict]"]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def uses_envelope(envelope: Envelope) -> Callable[[Handler], Handler]:
    """Mark a handler whose errors use `envelope` (the default is `openai_error`)."""

    def mark(handler: Handler) -> Handler:
        handler.error_envelope = envelope  # type: ignore[attr-defined]
        return handler

    return mark


def _envelope_of(request: web.Request) -> Envelope:
    return getattr(request.match_info.handler, "error_envelope", openai_error)


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as exc:  # routing and body-size errors, before any handler
        if exc.status < 400:
            raise
        msg = {404: "File Not Found", 405: "Method Not Allowed"}.get(exc.status, exc.reason)
        if exc.status == 413:
            msg = "request body too large"
        return error_response(exc.status, msg)
    except ClientGone:
        # the client left while we waited (the task is already cancelled): nobody reads this
        return web.Response(status=499)
    except Exception as exc:  # noqa: BLE001 - the server keeps serving
        status, body = _envelope_of(request)(exc)
        if kind_of(exc) is INTERNAL:
            log_bug(exc, request)
        resp = web.json_response(body, status=status)
        if isinstance(exc, ReplicaUnavailableError):
            resp.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        if isinstance(exc, SpoiledConnectionError):
            resp.force_close()
        if isinstance(exc, BodyTimeoutError):
            await resp.prepare(request)
            await resp.write_eof()
            if request.transport is not None:
                request.transport.close()  # after what is written is sent
        return resp


def log_bug(exc: BaseException, request: web.Request) -> None:
    """Every 500 is a bug report in the log, with its traceback (the client gets one line)."""
    log.error("internal error on %s %s (a bug: please report it with this traceback)",
              request.method, request.path, exc_info=(type(exc), exc, exc.__traceback__))
