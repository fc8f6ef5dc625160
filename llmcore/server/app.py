"""App factory: `create_app(engine, cfg)`; `listen_socket` and `run_server` for the CLI
(connections.py listens, the same way for `llmcore serve` and `llmcore tui`)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import weakref
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ..engine import EngineClient, EngineStatus
from .access import access_middleware, add_cors_headers
from .access_log import access_log_middleware
from .config import ServerConfig
from .connections import ConnectionGuard, connection_middleware, start_server
from .errors import error_middleware
from .keys import CONFIG, CONNECTIONS, ENGINE, RESPONSES, STREAMS, WORKERS
from .response_store import ResponseStore
from .routes import setup_routes

log = logging.getLogger("llmcore.server")


async def _engine_ctx(app: web.Application):
    eng = app[ENGINE]
    eng.start()  # loads the model on the engine thread if it isn't loaded yet
    yield
    eng.stop()


async def _workers_ctx(app: web.Application):
    yield
    # a render past its time limit is interrupted by its own timer: nothing to wait for
    app[WORKERS].shutdown(wait=False, cancel_futures=True)


async def _drain(app: web.Application) -> None:
    """on_shutdown (SIGTERM, Ctrl-C), after the listener closed: running and queued requests
    may finish within ``shutdown_timeout``; then the engine stops on a worker thread (the
    rest end with a ShuttingDownError event, [DONE] for OpenAI streams, while this loop
    still delivers them; the disk tier is written) and the streams get a moment to end."""
    eng, cfg = app[ENGINE], app[CONFIG]
    eng.close_intake()
    loop = asyncio.get_running_loop()
    end = loop.time() + max(0.0, cfg.shutdown_timeout)
    if eng.n_active:
        log.info("shutting down: %d request(s) running or queued, waiting up to %.0f s",
                 eng.n_active, cfg.shutdown_timeout)
    while eng.n_active and loop.time() < end:
        await asyncio.sleep(0.05)
    left = eng.n_active
    if left:
        log.warning("shutting down: ending %d request(s) still running after %.0f s", left, cfg.shutdown_timeout)
    await loop.run_in_executor(None, eng.stop)
    end = loop.time() + 2.0
    while len(app[STREAMS]) and loop.time() < end:  # their error event and [DONE] go out
        await asyncio.sleep(0.02)


async def _close_streams(app: web.Application) -> None:
    for resp in list(app[STREAMS]):
        try:
            await resp.write_eof()
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass


def create_app(engine: EngineClient, cfg: ServerConfig | None = None) -> web.Application:
    cfg = cfg or ServerConfig()
    # outermost first: connection phases, the request's log line, errors as answers, then
    # the access checks
    app = web.Application(middlewares=[connection_middleware, access_log_middleware, error_middleware,
                                       access_middleware],
                          client_max_size=cfg.max_body_bytes)
    app[ENGINE] = engine
    app[CONFIG] = cfg
    app[STREAMS] = weakref.WeakSet()
    app[WORKERS] = ThreadPoolExecutor(max_workers=max(1, cfg.workers), thread_name_prefix="llmcore-request")
    app[CONNECTIONS] = ConnectionGuard(cfg)
    app[RESPONSES] = ResponseStore()
    app.cleanup_ctx.append(_engine_ctx)
    app.cleanup_ctx.append(_workers_ctx)
    app.on_shutdown.append(_drain)
    app.on_shutdown.append(_close_streams)
    app.on_response_prepare.append(add_cors_headers)
    setup_routes(app)
    return app


_WATCHERS: set = set()


async def _exit_on_load_error(app: web.Application) -> None:
    """A server whose model cannot load serves nothing: stop it (the CLI reports why)."""
    eng = app[ENGINE]

    async def watch():
        while eng.status is EngineStatus.LOADING:
            await asyncio.sleep(0.1)
        if eng.status is EngineStatus.FAILED:
            # raised from a loop callback it leaves run_server like Ctrl-C, cleanup included
            asyncio.get_running_loop().call_soon(_graceful_exit)

    task = asyncio.get_running_loop().create_task(watch())
    _WATCHERS.add(task)  # keep a reference while it runs
    task.add_done_callback(_WATCHERS.discard)


def _graceful_exit() -> None:
    raise web.GracefulExit()


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket, taken before any model loads: a port in use is an
    OSError at once (the caller says so in one line). A client that connects before the
    server accepts waits in the backlog; /health answers 503 until the model is ready."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp does: TIME_WAIT is fine
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _serve(app: web.Application, cfg: ServerConfig, sock: socket.socket) -> None:
    runner = await start_server(app, cfg, handle_signals=True, sock=sock)
    try:
        log.info("listening on %s", socket_url(sock))
        while True:
            await asyncio.sleep(3600)
    finally:
        await runner.cleanup()


def run_server(engine: EngineClient, cfg: ServerConfig | None = None, sock: socket.socket | None = None) -> None:
    """Serve until interrupted (SIGINT, SIGTERM), or until the model fails to load
    (EngineStatus.FAILED). The port is bound first (`sock`, or `listen_socket` here), then
    the model loads in the background; "listening" is logged once connections are accepted."""
    cfg = cfg or ServerConfig()
    sock = sock if sock is not None else listen_socket(cfg.host, cfg.port)
    app = create_app(engine, cfg)
    app.on_startup.append(_exit_on_load_error)
    loop = asyncio.new_event_loop()
    main = loop.create_task(_serve(app, cfg, sock))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not main.done():
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError, web.GracefulExit, KeyboardInterrupt):
                loop.run_until_complete(main)  # its finally: cleanup (streams closed, engine stopped)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
