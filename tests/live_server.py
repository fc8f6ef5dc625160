"""A server on a real loopback socket, on its own event loop in a thread: the path
`llmcore serve` takes (connections.start_server), so timeouts, the connection cap and the
Host check are the real ones, and a client's own work does not stall the server's loop.

    with LiveServer(engine, ServerConfig(...)) as srv:
        srv.url            # http://127.0.0.1:PORT
        srv.app            # the aiohttp app (its ENGINE, CONFIG, ...)
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading

from llmcore.server import ServerConfig, create_app, start_server


class LiveServer:
    def __init__(self, engine, cfg: ServerConfig | None = None):
        self.cfg = dataclasses.replace(cfg or ServerConfig(), host="127.0.0.1", port=0)
        self.app = create_app(engine, self.cfg)
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="live-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            self._error = e
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        runner = await start_server(self.app, self.cfg, access_log=False)
        try:
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
