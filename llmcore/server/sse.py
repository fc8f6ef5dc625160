"""Server-sent events: `SSEEvent` (what an encoder emits) and `SSEWriter` (the response
that writes them, keep-alive comments included, and notices a client that left)."""
from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass

from aiohttp import web

from .keys import CONFIG, STREAMS


class ClientGone(Exception):
    """The client closed the connection (write failed)."""


@dataclass(frozen=True)
class SSEEvent:
    data: object  # a JSON value; a str is written as is ("[DONE]")
    name: str | None = None  # the `event:` line (Anthropic, Responses)

    def encode(self) -> bytes:
        data = self.data if isinstance(self.data, str) else \
            json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
        head = f"event: {self.name}\n" if self.name else ""
        return f"{head}data: {data}\n\n".encode()


DONE = SSEEvent("[DONE]")  # OpenAI streams end with it


if sys.version_info >= (3, 11):
    async def _with_timeout(aw, seconds: float):
        """await aw, TimeoutError after `seconds`: a timer handle, not a task per write
        (asyncio.wait_for wraps each write in a task before Python 3.12)."""
        async with asyncio.timeout(seconds):
            return await aw
else:  # pragma: no cover - Python 3.10
    _with_timeout = asyncio.wait_for


class SSEWriter:
    def __init__(self, request: web.Request):
        self.request = request
        self.resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            },
        )
        self.prepared = False

    async def prepare(self) -> None:
        if not self.prepared:
            await self.resp.prepare(self.request)
            self.prepared = True
            self.request.app[STREAMS].add(self.resp)

    async def _write(self, data: bytes) -> None:
        await self.prepare()
        if client_gone(self.request):
            raise ClientGone()
        try:
            # a client that stopped reading holds its slot until the write times out
            await _with_timeout(self.resp.write(data), self.request.app[CONFIG].body_timeout_s)
        except asyncio.TimeoutError:
            if self.request.transport is not None:
                self.request.transport.abort()  # what is buffered will never be read
            raise ClientGone() from None
        except (ConnectionError, RuntimeError) as e:  # aiohttp raises ClientConnectionResetError (a ConnectionError)
            raise ClientGone() from e

    async def send(self, events: list[SSEEvent]) -> None:
        if events:
            await self._write(b"".join(ev.encode() for ev in events))

    async def comment(self, text: str = "keep-alive") -> None:
        await self._write(f": {text}\n\n".encode())

    async def close(self) -> web.StreamResponse:
        if self.prepared:
            self.request.app[STREAMS].discard(self.resp)  # ended: a shutdown need not wait for it
            try:
                await self.resp.write_eof()
            except (ConnectionError, RuntimeError):
                pass
        return self.resp


def client_gone(request: web.Request) -> bool:
    tr = request.transport
    return tr is None or tr.is_closing()
