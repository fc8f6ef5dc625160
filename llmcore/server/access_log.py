"""One log line per request, on the "llmcore.access" logger: method, path, status, prompt
tokens in (and how many were reused, from which cache layer), tokens out, time.

    POST /v1/chat/completions 200  in 42 (30 cached, slot)  out 16  0.84 s

The stream driver leaves the request's final event on the request (`keys.FINAL_EVENT`); routes
that generate nothing log without token counts. The dashboard shows these lines in its
event log."""
from __future__ import annotations

import logging
import time

from aiohttp import web

from ..engine import FinalEvent
from .keys import FINAL_EVENT

log = logging.getLogger("llmcore.access")
QUIET_PATHS = frozenset({"/health", "/v1/health", "/metrics", "/slots", "/props"})  # polled


def access_line(method: str, path: str, status: int, seconds: float, final: FinalEvent | None) -> str:
    parts = [f"{method} {path} {status}"]
    if final is not None:
        t = final.timings
        reused = f" ({t.cache_n} cached, {t.cache_source})" if t.cache_n else ""
        parts.append(f"in {final.n_prompt}{reused}")
        parts.append(f"out {final.n_predicted}")
    parts.append(f"{seconds:.2f} s")
    return "  ".join(parts)


@web.middleware
async def access_log_middleware(request: web.Request, handler):
    t0 = time.perf_counter()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        status = e.status
        raise
    finally:
        # pollers (the dashboard, Prometheus) would drown the requests that matter
        if request.path not in QUIET_PATHS or status >= 400:
            log.info("%s", access_line(request.method, request.path, status, time.perf_counter() - t0,
                                       request.get(FINAL_EVENT)))
