"""The stream driver every generating route shares: a submitted task's events through the
route's encoder, to one JSON answer or an SSE stream.

It keeps a waiting stream alive (comment lines while no event comes: queue, long
prefill), notices a client that left (and cancels the task: nobody reads what it would
generate), and reports a failure that comes after the headers in-band, in the API's own
shape (encoder.error)."""
from __future__ import annotations

import asyncio
from contextlib import aclosing

from aiohttp import web

from ..engine import FinalEvent, Task
from .encoders.base import Encoder
from .errors import INTERNAL, kind_of, log_bug
from .keys import CONFIG, FINAL_EVENT
from .sse import ClientGone, SSEWriter, client_gone


async def respond(request: web.Request, task: Task, encoder: Encoder, stream: bool) -> web.StreamResponse:
    if not stream:
        async for ev in events(request, task, None):
            if isinstance(ev, FinalEvent):
                return web.json_response(encoder.body(ev))
            encoder.collect(ev)
        raise RuntimeError("generation ended without a result")

    sse = SSEWriter(request)
    try:
        await sse.prepare()
        try:
            await sse.send(encoder.opening())
            async with aclosing(events(request, task, sse)) as evs:
                async for ev in evs:
                    batch = [ev]
                    try:
                        if not isinstance(ev, FinalEvent):
                            # what else is queued goes out in the same write (one send per step and stream)
                            batch += task.ready_events()
                    finally:  # an error queued behind them is reported after them
                        await sse.send(encode(encoder, batch))
                    if isinstance(batch[-1], FinalEvent):
                        request[FINAL_EVENT] = batch[-1]  # for the request's log line
                        break
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001 - headers are out: report in-band
            if kind_of(exc) is INTERNAL:
                log_bug(exc, request)
            await sse.send(encoder.error(exc))
    except ClientGone:
        task.close()
    return await sse.close()


def encode(encoder: Encoder, batch: list) -> list:
    out = []
    for ev in batch:
        out += encoder.final(ev) if isinstance(ev, FinalEvent) else encoder.token(ev)
    return out


async def events(request: web.Request, task: Task, sse: SSEWriter | None):
    """The task's events; while none come, keep the stream alive (comment lines) or, for a
    plain response, watch for the client going away. Cancels the task when left early."""
    keepalive_s = request.app[CONFIG].keepalive_s
    try:
        while True:
            try:
                ev = await task.next_event(timeout=keepalive_s)
            except asyncio.TimeoutError:
                if sse is not None:
                    await sse.comment()
                elif client_gone(request):
                    raise ClientGone() from None
                continue
            if isinstance(ev, FinalEvent):
                request[FINAL_EVENT] = ev  # for the request's log line
                yield ev
                return
            if sse is None and client_gone(request):
                # a plain response whose client left: stop generating for nobody
                raise ClientGone()
            yield ev
    finally:
        task.close()
