"""Connections: how long a client may hold one, and how many one address may hold.

Every connection of the server (`llmcore serve`, `llmcore tui`) is a `GuardedConnection`
around aiohttp's own protocol. It closes a connection that is idle (no request running
and no byte of the next one) for `ServerConfig.idle_timeout_s`, and one whose request
headers are not complete `header_timeout_s` after their first byte (answered 408). The
body has `body_timeout_s` (read in requests/body.py), and so has each write of an answer
to a client that stopped reading (sse.py). An address holding `max_conns_per_client`
connections has the next one answered 429 and closed.

    runner = await start_server(app, cfg)   # listening; runner.cleanup() stops it
"""
from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter

from aiohttp import web

from .access import warn_if_exposed
from .config import ServerConfig
from .keys import CONNECTIONS

SWITCH_INTERVAL_S = 0.001  # sys.setswitchinterval while serving (see start_server)

log = logging.getLogger("llmcore.server")


def _status_line(status: int, reason: str, message: str) -> bytes:
    body = ('{"error": {"message": "%s", "type": "invalid_request_error", "code": %d}}'
            % (message, status)).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class ConnectionGuard:
    """The server's connections by client address, and their timers."""

    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.per_address: Counter[str] = Counter()
        self.by_handler: dict[object, GuardedConnection] = {}  # aiohttp's protocol -> ours

    def protocol_factory(self, server: web.Server):
        return lambda: GuardedConnection(self, server)

    def request_started(self, request: web.Request) -> None:
        conn = self.by_handler.get(request.protocol)
        if conn is not None:
            conn.busy()

    def request_done(self, request: web.Request) -> None:
        conn = self.by_handler.get(request.protocol)
        if conn is not None:
            conn.idle()


@web.middleware
async def connection_middleware(request: web.Request, handler):
    """Tells the connection a request is running (its header timer stops; no idle timer)."""
    guard = request.app.get(CONNECTIONS)
    if guard is None:
        return await handler(request)
    guard.request_started(request)
    try:
        return await handler(request)
    finally:
        guard.request_done(request)


class GuardedConnection(asyncio.Protocol):
    """aiohttp's RequestHandler with the per-address cap and the idle and header timers."""

    def __init__(self, guard: ConnectionGuard, server: web.Server):
        self.guard = guard
        self.server = server
        self.inner = None  # aiohttp's protocol, once the connection is admitted
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.timer: asyncio.TimerHandle | None = None
        self.phase = "idle"  # idle -> headers (first byte) -> busy (a request runs) -> idle

    # ---- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        cap = self.guard.cfg.max_conns_per_client
        if cap and self.guard.per_address[self.address] >= cap:
            log.warning("refused a connection from %s: it holds %d already (--max-connections-per-client)",
                        self.address, cap)
            transport.write(_status_line(429, "Too Many Requests",
                                         f"too many connections from this address (limit {cap})"))
            # half-close: the answer then FIN; what the client still sends is read and
            # dropped (closing with it unread would reset the connection, answer and all)
            if transport.can_write_eof():
                transport.write_eof()
            self.timer = asyncio.get_running_loop().call_later(2.0, transport.abort)
            return
        self.guard.per_address[self.address] += 1
        self.inner = self.server()
        self.guard.by_handler[self.inner] = self
        self.inner.connection_made(transport)
        self.idle()

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.phase == "idle":
            self.phase = "headers"
            self._arm(self.guard.cfg.header_timeout_s)
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else None  # None: close

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self.inner is None:
            return
        self.guard.by_handler.pop(self.inner, None)
        self.guard.per_address[self.address] -= 1
        if self.guard.per_address[self.address] <= 0:
            del self.guard.per_address[self.address]
        inner, self.inner = self.inner, None
        inner.connection_lost(exc)

    # ---- phases ----------------------------------------------------------------------
    def busy(self) -> None:
        self.phase = "busy"
        self._disarm()

    def idle(self) -> None:
        self.phase = "idle"
        self._arm(self.guard.cfg.idle_timeout_s)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        if seconds and seconds > 0:
            self.timer = asyncio.get_running_loop().call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        tr = self.transport
        if tr is None or tr.is_closing() or self.phase == "busy":
            return
        if self.phase == "headers":
            tr.write(_status_line(408, "Request Timeout", "request headers not complete in time"))
        tr.close()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are GuardedConnections."""

    __slots__ = ("_host", "_port", "_guard", "_sock")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard,
                 sock=None):
        super().__init__(runner)
        self._host, self._port, self._guard, self._sock = host, port, guard, sock

    @property
    def name(self) -> str:
        if self._sock is not None:
            host, port = self._sock.getsockname()[:2]
            return f"http://{host}:{port}"
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        if self._sock is not None:  # bound before the model loaded (app.listen_socket)
            self._server = await loop.create_server(self._guard.protocol_factory(server), sock=self._sock)
        else:
            self._server = await loop.create_server(
                self._guard.protocol_factory(server), self._host, self._port, reuse_address=True)


async def start_server(app: web.Application, cfg: ServerConfig, handle_signals: bool = False,
                       access_log: bool = False, sock=None) -> web.AppRunner:
    """Set up `app` (the engine starts) and listen on `sock` (bound already) or
    cfg.host:cfg.port. aiohttp's own access log is off by default: access_log.py writes
    one line per request."""
    guard = app[CONNECTIONS]
    # A worker running Python (tokenizing, a template, a JSON body) holds the GIL for up to
    # the switch interval each time the loop wants it; at CPython's 5 ms the waits of the
    # loop, the engine thread and the workers chain into pauses of 0.2-0.5 s in a stream on
    # 2 busy cores. 1 ms keeps them near 0.04 s; the kernels run without the GIL.
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    # aiohttp's own keep-alive close would cut a slow header before header_timeout_s: ours decide
    keepalive = max(cfg.idle_timeout_s, cfg.header_timeout_s) + 60
    runner = web.AppRunner(app, handle_signals=handle_signals, shutdown_timeout=cfg.shutdown_timeout,
                           keepalive_timeout=keepalive,
                           access_log=logging.getLogger("aiohttp.access") if access_log else None)
    await runner.setup()
    try:
        await GuardedSite(runner, cfg.host, cfg.port, guard, sock=sock).start()
    except BaseException:
        await runner.cleanup()
        raise
    warn_if_exposed(cfg)
    return runner
