"""The JSON body of a request, read once with limits and checked against its route's schema.

    @accepts(CHAT)                      # the route's schema (requests/schema.py)
    async def handler(request, body):   # body: a dict that fits it

Reading stops at `ServerConfig.max_body_bytes` of decoded body (413: a gzip bomb is
refused as it expands) and at `body_timeout_s` (408: a stuck or trickling body); a body
past `max_json_values` values is refused before parsing (413); a big one is parsed in a
worker thread. Any failure here closes the connection (the rest of the body is on it)."""
from __future__ import annotations

import asyncio
import functools
import json
import re
from typing import Any, Awaitable, Callable

from aiohttp import web

from ...errors import RequestError
from ..access import JSON_ONLY
from ..errors import BodyTimeoutError, BodyTooLargeError, TooLargeError, UnreadableBodyError
from ..keys import CONFIG, ENGINE
from ..offload import SMALL, maybe_in_worker
from ..sse import ClientGone
from .schema import Obj, check

_SURROGATE_ESC = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# the bytes read, kept on the request (web.RequestKey from aiohttp 3.13)
_RAW = web.RequestKey("raw_body", bytes) if hasattr(web, "RequestKey") else "llmcore.raw_body"


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


async def read_raw(request: web.Request) -> bytes:
    """The decoded body, read once (kept on the request), within the size and time limits."""
    if _RAW in request:
        return request[_RAW]
    cfg = request.app[CONFIG]
    limit = cfg.max_body_bytes
    declared = request.content_length
    if declared is not None and declared > limit and "Content-Encoding" not in request.headers:
        raise BodyTooLargeError(f"request body too large: {declared} bytes > {limit} bytes")
    chunks, n = [], 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.body_timeout_s
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise asyncio.TimeoutError()
            chunk = await asyncio.wait_for(request.content.readany(), left)
            if not chunk:
                break
            n += len(chunk)
            if n > limit:
                raise BodyTooLargeError(f"request body too large: more than {limit} bytes"
                                        + (" once decoded" if "Content-Encoding" in request.headers else ""))
            chunks.append(chunk)
    except asyncio.TimeoutError:
        raise BodyTimeoutError(f"the request body did not arrive within {cfg.body_timeout_s:g} s") from None
    except web.RequestPayloadError as e:  # e.g. a body that is not valid gzip
        # the rest of the body cannot be parsed: stop reading it (aiohttp would log an
        # unhandled error); the answer closes the connection
        request.content.feed_eof()
        raise UnreadableBodyError("cannot read the request body: " + " ".join(str(e).split())) from None
    except ConnectionError:
        raise ClientGone() from None
    raw = request[_RAW] = b"".join(chunks)
    return raw


def parse_json(raw: bytes, max_values: int) -> Any:
    """json.loads with the limits: it holds the GIL throughout, so its cost is bounded by
    the values it may build (each `[`, `{` and `,` starts at most one)."""
    if len(raw) > max_values and raw.count(b",") + raw.count(b"[") + raw.count(b"{") > max_values:
        raise TooLargeError(f"the request body holds more than {max_values} JSON values")
    try:
        body = json.loads(raw) if raw else None
        if body is not None and _SURROGATE_ESC.search(raw):
            body = _fix_surrogates(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"invalid JSON in request body: {e}") from None
    except RecursionError:
        raise RequestError("invalid JSON in request body: nested too deeply") from None
    return body


def _max_values(request: web.Request) -> int:
    eng = request.app[ENGINE]
    # a prompt or token list of a whole context is one value a token
    return request.app[CONFIG].max_json_values + 2 * int(getattr(eng, "n_ctx", 0) or 0)


def _parse_and_check(raw: bytes, max_values: int, schema: Obj | None) -> dict:
    body = parse_json(raw, max_values)
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if schema is not None:
        check(body, schema)
    return body


async def read_json(request: web.Request, schema: Obj | None = None) -> dict:
    """The JSON object body, checked against `schema`; RequestError (HTTP 400) if it is
    not one, 413 / 408 past the limits. A big body is parsed and checked in a worker."""
    raw = await read_raw(request)
    return await maybe_in_worker(request, len(raw) > SMALL, _parse_and_check, raw,
                                 _max_values(request), schema)


def body_is_big(request: web.Request) -> bool:
    """Whether the body read is big enough that walking it belongs in a worker thread."""
    return len(request.get(_RAW, b"")) > SMALL


Handler = Callable[[web.Request, dict], Awaitable[web.StreamResponse]]


def accepts(schema: Obj, media_types: tuple[str, ...] = JSON_ONLY):
    """A POST route whose body fits `schema`: the handler gets it read and checked.
    `media_types`: the Content-Types it takes (access.py refuses others, 415)."""

    def wrap(handler: Handler):
        @functools.wraps(handler)
        async def read_then_handle(request: web.Request) -> web.StreamResponse:
            return await handler(request, await read_json(request, schema))

        read_then_handle.body_schema = schema  # type: ignore[attr-defined]
        read_then_handle.media_types = media_types  # type: ignore[attr-defined]
        return read_then_handle

    return wrap
