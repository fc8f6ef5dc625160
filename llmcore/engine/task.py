"""A submitted request as both sides see it: the engine thread puts events, the caller
(an asyncio coroutine or a plain thread) takes them.

Events cross from the engine thread to the event loop with ``loop.call_soon_threadsafe``
onto a per-task ``asyncio.Queue`` (gathered per step by an :class:`EventOutbox`: one wake-up
of the loop for all streams); synchronous callers get a ``queue.Queue``. ``cancel()``
is thread-safe: it marks the task and wakes the engine, which frees the slot.
"""
from __future__ import annotations

import asyncio
import itertools
import queue as queue_mod
import time
from typing import Callable

from .config import GenParams
from .events import Completion, ErrorEvent, FinalEvent, TokenEvent

_task_ids = itertools.count(1)


class EventOutbox:
    """The events of engine steps, handed to each event loop in one call.

    Waking an event loop from another thread writes to its self-pipe: one system call
    per ``call_soon_threadsafe``, and the loop's thread then runs (on a machine with as many
    cores as the step has threads, it takes a core from the step). A step of N streams emits
    N events; while the outbox is open (``with outbox:``, around the engine's post-step
    work) they are gathered and each loop gets one call for all of them, in order. Closing
    the outbox delivers them, unless the last delivery was less than ``hold_s`` ago and none
    of them is urgent (a stream's first token, its end, an error): then the next step's
    close, or ``flush()`` (the engine calls it before it waits and before a step with
    prompt work, which may be long), delivers them together."""

    def __init__(self, hold_s: float = 0.0):
        self.hold_s = hold_s
        self._open = 0
        self._pending: dict[asyncio.AbstractEventLoop, list] = {}
        self._urgent = False
        self._t_last = 0.0

    def put(self, loop: asyncio.AbstractEventLoop, deliver: Callable, ev, urgent: bool = True) -> bool:
        """Gather (deliver, ev) for loop; False when the outbox is closed (deliver now)."""
        if not self._open:
            return False
        self._pending.setdefault(loop, []).append((deliver, ev))
        self._urgent = self._urgent or urgent
        return True

    def __enter__(self) -> "EventOutbox":
        self._open += 1
        return self

    def __exit__(self, *exc) -> None:
        self._open -= 1
        if self._open or not self._pending:
            return
        if not self._urgent and time.monotonic() - self._t_last < self.hold_s:
            return  # held: delivered with the next step's events, or by flush()
        self.flush()

    def flush(self) -> None:
        """Deliver what is held (engine thread, outbox closed)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        self._urgent = False
        self._t_last = time.monotonic()
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # loop closed: nobody listens any more
                pass


def _deliver_all(items: list) -> None:
    for deliver, ev in items:
        deliver(ev)


class Task:
    """Iterate it (async or sync) for TokenEvents then one FinalEvent; an ErrorEvent's
    exception is raised instead."""

    def __init__(self, prompt: list[int], params: GenParams, loop: asyncio.AbstractEventLoop | None,
                 wake: Callable[[], None], outbox: EventOutbox | None = None):
        self.id = next(_task_ids)
        self.prompt = prompt
        self.params = params
        self.loop = loop
        self.cancelled = False
        self.done = False
        self.slot_id: int | None = None
        self.disk_wait = None  # engine thread: llmcore.engine.disk_tier.DiskWait
        self.t_submit = time.perf_counter()
        self._wake = wake
        self._outbox = outbox
        self._getter: asyncio.Future | None = None
        self._sent = False  # an event was put (the first goes out at once)
        if loop is not None:
            self._aq: asyncio.Queue = asyncio.Queue()
        else:
            self._q: queue_mod.Queue = queue_mod.Queue()

    # ---- engine side -------------------------------------------------------------------
    def put(self, ev) -> None:
        if self.loop is not None:
            urgent = not self._sent or not isinstance(ev, TokenEvent)
            self._sent = True
            if self._outbox is not None and self._outbox.put(self.loop, self._aq.put_nowait, ev, urgent):
                return
            try:
                self.loop.call_soon_threadsafe(self._aq.put_nowait, ev)
            except RuntimeError:  # loop closed: nobody listens any more
                self.cancelled = True
        else:
            self._q.put(ev)

    # ---- caller side -------------------------------------------------------------------
    def cancel(self) -> None:
        if not self.done and not self.cancelled:
            self.cancelled = True
            self._wake()

    async def next_event(self, timeout: float | None = None):
        """Next event; raises asyncio.TimeoutError after `timeout` seconds without one.

        One getter future survives timeouts, so no event is ever lost to a timeout. An
        event already queued is returned without a getter task (the common case while
        generating: a task and a wait per token cost more than the token's encoding)."""
        if self._getter is None and not self._aq.empty():
            return self._check(self._aq.get_nowait())
        if self._getter is None:
            self._getter = asyncio.ensure_future(self._aq.get())
        done, _ = await asyncio.wait({self._getter}, timeout=timeout)
        if not done:
            raise asyncio.TimeoutError
        ev = self._getter.result()
        self._getter = None
        return self._check(ev)

    def ready_events(self, limit: int = 64) -> list:
        """Events already queued (at most `limit`), without waiting: a stream that fell a
        step behind writes them together. Stops after a final event; an error is raised
        as next_event raises it, once the events before it have been returned."""
        out = []
        while len(out) < limit and self._getter is None and not self._aq.empty():
            ev = self._aq.get_nowait()
            if isinstance(ev, ErrorEvent) and out:
                self._aq.put_nowait(ev)  # after these: the next call raises it (nothing else follows an error)
                break
            out.append(self._check(ev))
            if isinstance(ev, FinalEvent):
                break
        return out

    def close(self) -> None:
        """Caller is done with this task: cancel it if still running, drop the getter."""
        if self._getter is not None:
            self._getter.cancel()
            self._getter = None
        if not self.done:
            self.cancel()

    def _check(self, ev):
        if isinstance(ev, ErrorEvent):
            self.done = True
            raise ev.error
        if isinstance(ev, FinalEvent):
            self.done = True
        return ev

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        try:
            while True:
                ev = await self.next_event()
                yield ev
                if isinstance(ev, FinalEvent):
                    return
        finally:
            self.close()

    def __iter__(self):
        try:
            while True:
                ev = self._check(self._q.get())
                yield ev
                if isinstance(ev, FinalEvent):
                    return
        finally:
            if not self.done:
                self.cancel()

    async def collect(self) -> Completion:
        c = Completion()
        async for ev in self:
            c.add(ev)
        return c

    def collect_sync(self) -> Completion:
        c = Completion()
        for ev in self:
            c.add(ev)
        return c


__all__ = ["Task"]
