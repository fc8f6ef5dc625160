"""One thread for the engine's disk I/O, so that no step ever waits on a disk.

``submit(work, done)`` runs ``work()`` on the I/O thread, in submission order; its result
(or the exception it raised) comes back to the owner's thread, which runs
``done(result, error)`` at its next :meth:`IOWorker.poll`. The owner (the engine thread)
keeps every structure it shares with a job (pools, the disk index) to itself: a job only
reads what the owner keeps alive for it, and anything it changes is changed in ``done``.

    io = IOWorker(wake=engine_wake)         # wake: called on the I/O thread after each job
    io.submit(lambda: write(...), lambda size, err: ...)
    io.poll()                               # the engine thread, once per loop
    io.drain(timeout=60)                    # at shutdown: wait for every job, run every done
    io.close()
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Any, Callable

log = logging.getLogger("llmcore.cache")

Done = Callable[[Any, "BaseException | None"], None]


class IOWorker:
    def __init__(self, wake: Callable[[], None] | None = None, name: str = "llmcore-disk"):
        self._wake = wake
        self._jobs: queue.Queue = queue.Queue()
        self._done: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self.outstanding = 0  # submitted, done not run yet (owner thread)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], Any], done: Done | None = None) -> None:
        """Queue a job (any thread; ``done`` still runs on the owner's)."""
        with self._cv:
            self.outstanding += 1
        self._jobs.put((work, done))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            work, done = job
            try:
                out, err = work(), None
            except BaseException as e:  # noqa: BLE001 - reported to the owner, never lost
                out, err = None, e
            with self._cv:
                self._done.append((done, out, err))
                self._cv.notify_all()
            if self._wake is not None:
                try:
                    self._wake()
                except Exception:  # noqa: BLE001
                    log.exception("waking the engine after a disk job failed")

    def poll(self) -> int:
        """Run the completions of finished jobs (owner thread); returns how many."""
        n = 0
        while self._done:
            done, out, err = self._done.popleft()
            with self._cv:
                self.outstanding -= 1
            n += 1
            if done is None:
                if err is not None:
                    log.warning("disk job failed: %s", err)
                continue
            try:
                done(out, err)
            except Exception:  # noqa: BLE001 - one bad completion must not stop the others
                log.exception("disk job completion failed")
        return n

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has finished and its completion has run (owner
        thread). False when `timeout` seconds passed first."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            self.poll()
            if self.outstanding <= 0:
                return True
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            with self._cv:
                if not self._done:
                    self._cv.wait(0.05 if left is None else min(0.05, left))

    def close(self, timeout: float = 5.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


__all__ = ["IOWorker"]
