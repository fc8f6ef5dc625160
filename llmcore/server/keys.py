"""Every web.AppKey of the server, in one place."""
from __future__ import annotations

import weakref

from aiohttp import web

from ..engine import Engine

ENGINE = web.AppKey("engine", Engine)
CONFIG = web.AppKey("config", object)  # ServerConfig (import cycle otherwise)
STREAMS = web.AppKey("streams", weakref.WeakSet)  # open SSE responses, closed on shutdown
