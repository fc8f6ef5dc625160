"""The JSON body of a request: an object, or RequestError (HTTP 400)."""
from __future__ import annotations

import json
import re

from aiohttp import web

from ...errors import RequestError
from ..errors import UnreadableBodyError
from ..sse import ClientGone

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


async def _raw(request: web.Request) -> bytes:
    try:
        return await request.read()  # aiohttp keeps it: read again for free
    except web.RequestPayloadError as e:  # e.g. a body that is not valid gzip
        # the rest of the body cannot be parsed: stop reading it (aiohttp would log an
        # unhandled error); the answer closes the connection
        request.content.feed_eof()
        raise UnreadableBodyError("cannot read the request body: " + " ".join(str(e).split())) from None
    except ConnectionError:
        raise ClientGone() from None


async def read_json(request: web.Request) -> dict:
    """The JSON object body, or RequestError (HTTP 400)."""
    raw = await _raw(request)
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


async def body_size(request: web.Request) -> int:
    """Bytes in the (decoded) body: decides whether its prompt is built off the event loop."""
    return len(await _raw(request))
