"""Server-sent events: `data: <json>` frames, keep-alive comments, disconnect detection."""
from __future__ import annotations

import json

from aiohttp import web

from .keys import STREAMS


class ClientGone(Exception):
    """The client closed the connection (write failed)."""


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

    async def _write(self, data: str) -> None:
        await self.prepare()
        if client_gone(self.request):
            raise ClientGone()
        try:
            await self.resp.write(data.encode())
        except (ConnectionError, RuntimeError) as e:  # aiohttp raises ClientConnectionResetError (a ConnectionError)
            raise ClientGone() from e

    async def send(self, obj) -> None:
        await self._write("data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n")

    async def event(self, name: str, obj) -> None:
        """A named event (`event: <name>` line), as the Anthropic and Responses streams use."""
        await self._write(f"event: {name}\ndata: "
                          + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n")

    async def comment(self, text: str = "keep-alive") -> None:
        await self._write(f": {text}\n\n")

    async def done(self) -> None:
        await self._write("data: [DONE]\n\n")

    async def close(self) -> web.StreamResponse:
        if self.prepared:
            try:
                await self.resp.write_eof()
            except (ConnectionError, RuntimeError):
                pass
        return self.resp


def client_gone(request: web.Request) -> bool:
    tr = request.transport
    return tr is None or tr.is_closing()
