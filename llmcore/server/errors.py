"""OpenAI-style error envelopes and the middleware that turns exceptions into them."""
from __future__ import annotations

import json
import logging
import re

from aiohttp import web

from ..errors import ContextFullError, LLMCoreError, RequestError
from .sse import ClientGone

log = logging.getLogger("llmcore.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def error_body(status: int, message: str, type_: str | None = None, **extra) -> dict:
    err = {"message": message, "type": type_ or _TYPES.get(status, "server_error"), "code": status}
    err.update(extra)
    return {"error": err}


def error_response(status: int, message: str, type_: str | None = None, **extra) -> web.Response:
    return web.json_response(error_body(status, message, type_, **extra), status=status)


def exception_body(exc: BaseException) -> tuple[int, dict]:
    """HTTP status and error body for an exception raised while serving a request."""
    if isinstance(exc, ContextFullError):
        extra = {}
        if getattr(exc, "n_ctx", None) is not None:
            extra = {"n_prompt_tokens": exc.n_prompt_tokens, "n_ctx": exc.n_ctx}
        return 400, error_body(400, str(exc), **extra)
    if isinstance(exc, RequestError):
        return 400, error_body(400, str(exc))
    if isinstance(exc, LLMCoreError) and str(exc) == "Loading model":
        return 503, error_body(503, "Loading model")
    if isinstance(exc, LLMCoreError):
        return 500, error_body(500, str(exc))
    return 500, error_body(500, f"internal error: {type(exc).__name__}: {exc}")


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        msg = {404: "File Not Found", 405: "Method Not Allowed"}.get(exc.status, exc.reason)
        if exc.status == 413:
            msg = "request body too large"
        return error_response(exc.status, msg)
    except ClientGone:
        # the client left while we waited (the task is already cancelled): nobody reads this
        return web.Response(status=499)
    except (RequestError, LLMCoreError) as exc:
        status, body = exception_body(exc)
        resp = web.json_response(body, status=status)
        if getattr(exc, "close_connection", False):
            resp.force_close()
        return resp
    except Exception as exc:  # noqa: BLE001 - the server keeps serving
        log.exception("unhandled error on %s %s", request.method, request.path)
        status, body = exception_body(exc)
        return web.json_response(body, status=status)


_SURROGATE_ESC = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _fix_surrogates(v):
    """Lone UTF-16 surrogates (JSON escapes like \\ud83d without their pair, e.g. from a
    client that cut a string mid-emoji) cannot be encoded: replace them with U+FFFD."""
    if isinstance(v, str):
        return _SURROGATE.sub("\ufffd", v)
    if isinstance(v, list):
        return [_fix_surrogates(x) for x in v]
    if isinstance(v, dict):
        return {_fix_surrogates(k): _fix_surrogates(x) for k, x in v.items()}
    return v


async def read_json(request: web.Request) -> dict:
    """The JSON object body, or RequestError (HTTP 400)."""
    try:
        raw = await request.read()
    except web.RequestPayloadError as e:  # e.g. a body that is not valid gzip
        # the rest of the body cannot be parsed: answer, then close this connection (a
        # client that reused it would read garbage; aiohttp would log an unhandled error)
        request.content.feed_eof()
        err = RequestError("cannot read the request body: " + " ".join(str(e).split()))
        err.close_connection = True
        raise err from None
    except ConnectionError:
        raise ClientGone() from None
    try:
        body = json.loads(raw) if raw else None
        if body is not None and _SURROGATE_ESC.search(raw):
            body = _fix_surrogates(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"invalid JSON in request body: {e}") from None
    except RecursionError:
        raise RequestError("invalid JSON in request body: nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body
