"""`llmcore tui` modes: the dashboard (beside an in-process server, or attached to a URL),
`--no-tui` (one line per interval: text or JSON lines) and `--once` (one snapshot, exit).
"""
from __future__ import annotations

import asyncio
import logging
import sys
from typing import TextIO

from .formatting import to_json, to_text
from .history import History
from .snapshot import Snapshot
from .source import EngineSource, FakeSource, HttpSource

log = logging.getLogger("llmcore.tui")


class InProcessServer:
    """The aiohttp app of `llmcore serve`, run on the caller's event loop (the dashboard's),
    so engine, server and dashboard share one process. `sock`: a socket bound already
    (`llmcore.server.listen_socket`, so a taken port fails before any screen opens);
    without it `start` binds cfg.host:cfg.port."""

    def __init__(self, engine, cfg=None, sock=None):
        from ..server import ServerConfig

        self.engine = engine
        self.cfg = cfg or ServerConfig()
        self.sock = sock
        self.runner = None

    async def start(self) -> None:
        from ..server import create_app, listen_socket, start_server

        if self.sock is None:
            self.sock = listen_socket(self.cfg.host, self.cfg.port)
        # starts the engine thread (the model loads there); the same listener as `serve`
        self.runner = await start_server(create_app(self.engine, self.cfg), self.cfg, sock=self.sock)
        log.info("listening on %s", self.url)

    @property
    def url(self) -> str:
        """Where it listens (the real port when the config asked for port 0)."""
        if self.sock is not None and self.sock.fileno() >= 0:
            from ..server import socket_url

            return socket_url(self.sock)
        return f"http://{self.cfg.host}:{self.cfg.port}"

    async def stop(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()  # closes streams, stops the engine thread
        if self.sock is not None:
            self.sock.close()


def make_source(url: str | None = None, engine=None, mock: bool = False, timeout: float = 3.0,
                api_key: str | None = None):
    if mock:
        return FakeSource(n_slots=4)
    if url:
        return HttpSource(url, timeout=timeout, api_key=api_key)
    if engine is None:
        raise ValueError("need a url, an engine or mock")
    return EngineSource(engine)


def _line(snap: Snapshot, fmt: str, history: History | None) -> str:
    return to_json(snap) if fmt == "json" else to_text(snap, history)


async def once(source, fmt: str = "text", out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print one snapshot of a running server (never starts one). Exit status 1 when it
    could not be read (one line on `err` says why) or its model failed to load."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        snap = await source.fetch()
    finally:
        await source.close()
    if not snap.connected:
        if fmt == "json":
            print(to_json(snap), file=out, flush=True)
        print(f"error: no llmcore server answers at {source.name} ({snap.error}); start one with "
              f"`llmcore serve`, or pass --url", file=err, flush=True)
        return 1
    print(_line(snap, fmt, None), file=out, flush=True)
    return 0 if snap.get("status", "ok") != "error" else 1


async def headless(source, server: InProcessServer | None = None, interval: float = 1.0,
                   fmt: str = "text", out: TextIO | None = None, count: int | None = None) -> int:
    """Print a snapshot every `interval` seconds (`count` times, or until cancelled)."""
    out = out or sys.stdout
    history = History()
    try:
        if server is not None:
            await server.start()
        n = 0
        while count is None or n < count:
            snap = await source.fetch()
            history.add(snap)
            print(_line(snap, fmt, history), file=out, flush=True)
            n += 1
            if count is None or n < count:
                await asyncio.sleep(interval)
        return 0
    finally:
        await source.close()
        if server is not None:
            await server.stop()


def main(*, url: str | None = None, engine=None, server_cfg=None, sock=None, interval: float = 1.0,
         no_tui: bool = False, once_: bool = False, fmt: str = "text", mock: bool = False,
         log_level: str = "info", api_key: str | None = None) -> int:
    """Entry point of `llmcore tui` (see cli.py). Returns the exit status. With `engine`
    (and no url/mock) the server is this process's own, on `sock` when given; `api_key`
    goes with every request to a server at `url`."""
    interval = max(0.1, interval)
    source = make_source(url, engine, mock, api_key=api_key)
    server = InProcessServer(engine, server_cfg, sock) if engine is not None and not url and not mock else None
    level = getattr(logging, log_level.upper(), logging.INFO)
    if once_ or no_tui:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            stream=sys.stderr)
        coro = once(source, fmt) if once_ else headless(source, server, interval, fmt)
        try:
            return asyncio.run(coro)
        except KeyboardInterrupt:
            return 130
    from .app import Dashboard

    # log records go to the event log, not to the terminal under the dashboard
    logging.getLogger().setLevel(level)
    app = Dashboard(source, interval=interval, startup=server.start if server else None,
                    shutdown=server.stop if server else None, log_level=level,
                    owns_server=server is not None)
    app.run()
    return app.return_code or 0
