"""Request work off the event loop.

Anything a request can make take more than a few milliseconds of CPU (rendering the chat
template, tokenizing and detokenizing, parsing or writing a big JSON body) runs in the
server's worker threads (`ServerConfig.workers`), so the loop keeps answering /health and
writing other streams meanwhile. Small inputs are done inline: a thread hop costs more."""
from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, Callable, TypeVar

from aiohttp import web

from .keys import WORKERS

T = TypeVar("T")

SMALL = 16 * 1024  # characters, bytes or tokens: below this, well under a millisecond


async def in_worker(request: web.Request, fn: Callable[..., T], *args: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(request.app[WORKERS], functools.partial(fn, *args))


async def maybe_in_worker(request: web.Request, big: bool, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a worker when `big`, inline otherwise."""
    if big:
        return await in_worker(request, fn, *args)
    return fn(*args)


_SLICE = 8192  # list items json.dumps writes in one go (it holds the GIL while it runs)


def _dumps(v: Any) -> str:
    """json.dumps(v) (as web.json_response writes it), long lists a slice at a time so the
    event loop's thread gets the GIL between slices."""
    if isinstance(v, list) and len(v) > _SLICE:
        return "[" + ", ".join(json.dumps(v[i:i + _SLICE])[1:-1] for i in range(0, len(v), _SLICE)) + "]"
    if isinstance(v, dict) and any(isinstance(x, list) and len(x) > _SLICE for x in v.values()):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_dumps(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def _dumps_bytes(data: Any) -> bytes:
    return _dumps(data).encode()


async def json_answer(request: web.Request, data: Any, big: bool) -> web.Response:
    """A JSON response; encoded in a worker when `big` (e.g. a long token list)."""
    body = await maybe_in_worker(request, big, _dumps_bytes, data)
    return web.Response(body=body, content_type="application/json")
