"""Every web.AppKey (and request key) of the server, in one place, and the handlers' way to the engine."""
from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ..engine import EngineClient, FinalEvent
from .config import ServerConfig

ENGINE = web.AppKey("engine", EngineClient)  # an Engine, or a ReplicaPool (llmcore.cluster)
CONFIG = web.AppKey("config", ServerConfig)
STREAMS = web.AppKey("streams", weakref.WeakSet)  # open SSE responses, closed on shutdown
# per request: the final event of a generating request (its log line reads the token counts);
# a plain string key where aiohttp predates RequestKey
FINAL_EVENT = web.RequestKey("final_event", FinalEvent) if hasattr(web, "RequestKey") else "final_event"
WORKERS = web.AppKey("workers", ThreadPoolExecutor)  # request work off the event loop (offload.py)
CONNECTIONS = web.AppKey("connections", object)  # connections.ConnectionGuard
RESPONSES = web.AppKey("responses", object)  # response_store.ResponseStore (previous_response_id)


def ready_engine(request: web.Request) -> EngineClient:
    """The app's engine; ModelLoadingError / ModelLoadFailedError unless it serves."""
    eng = request.app[ENGINE]
    eng.require_ready()
    return eng
