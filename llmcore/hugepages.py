"""Anonymous memory on transparent huge pages, for what is streamed every step: repacked
weights (quant.WeightArena) and the KV block pools (cache.pool).

On 4 KiB pages a stream of scattered reads costs a TLB miss every few rows and stops the
hardware prefetcher at every page end; with THP in ``madvise`` mode (a common default)
memory only gets huge pages where it asks for them.
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import mmap
import os
import sys
import threading

import numpy as np

HUGE_PAGE = 2 << 20
PAGE = mmap.PAGESIZE


# Linux's MAP_NORESERVE (the mmap module names it from Python 3.13 only)
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def huge_page_mapping(nbytes: int, reserve_only: bool = False) -> np.ndarray:
    """A zeroed uint8 (nbytes,) array in an anonymous mapping of its own, starting on a
    2 MiB boundary, with transparent huge pages asked for where the kernel has them. Pages
    are only taken when first touched, so the unused head costs address space only; the
    mapping is unmapped when the last array viewing it goes.

    ``reserve_only``: address space for storage that fills up over time (a KV pool up to
    its limit), not counted against the commit limit until touched (MAP_NORESERVE)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (MAP_NORESERVE if reserve_only else 0)
    buf = mmap.mmap(-1, int(nbytes) + HUGE_PAGE, flags=flags)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # pragma: no cover - kernels without THP
            pass
    arr = np.frombuffer(buf, dtype=np.uint8)
    off = (-arr.ctypes.data) % HUGE_PAGE
    return arr[off:off + int(nbytes)]


# ---- page faults taken ahead, off the compute threads' path --------------------------------
# Storage that fills over time (a KV pool) takes a page fault where a step first writes a
# page: with huge pages, a 2 MiB page zeroed inside a decode step, in every layer's K and V
# at once (60 mappings for SmolLM2, ~12 ms on bare metal); in a VM whose memory was never
# touched since boot, ~4.5 ms a page (the host backs it then): a 0.28 s step at a 16k depth
# against 20 ms. A background thread asks the kernel for those pages a little ahead of use
# with MADV_POPULATE_WRITE (Linux 5.14), which maps them writable without touching their
# bytes, so it is safe while the compute threads write the same pages.

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)
# LLMCORE_PREFAULT=0: take every fault where it falls (an A/B switch)
PREFAULT = os.environ.get("LLMCORE_PREFAULT", "1") != "0" and MADV_POPULATE_WRITE is not None


class _Prefaulter:
    """One daemon thread that populates queued byte spans of arrays, first queued first."""

    def __init__(self):
        self._spans: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        self._madvise = None
        self.enabled = PREFAULT
        self.n_bytes = 0  # bytes asked for so far (stats, tests)

    def submit(self, spans) -> None:
        """spans: (array, start byte, end byte) within that array's own memory; the array
        is held until its span is done, so its mapping stays."""
        if not self.enabled:
            return
        with self._cond:
            self._spans.extend(spans)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="llmcore-prefault", daemon=True)
                self._thread.start()
            self._cond.notify()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted span is done; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._spans and not self._busy, timeout)

    def _populate(self, arr: np.ndarray, start: int, end: int) -> bool:
        if self._madvise is None:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            fn = libc.madvise
            fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            fn.restype = ctypes.c_int
            self._madvise = fn
        base = arr.ctypes.data
        lo = (base + start) // PAGE * PAGE
        hi = -(-(base + end) // PAGE) * PAGE
        if hi <= lo:
            return True
        # ctypes drops the GIL for the call: the fault work runs beside Python
        if self._madvise(lo, hi - lo, MADV_POPULATE_WRITE) == 0:
            self.n_bytes += hi - lo
            return True
        # EINVAL: a kernel without it (or memory it cannot populate): stop asking
        return ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS, errno.EPERM)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._spans)
                arr, start, end = self._spans.popleft()
                self._busy = True
            try:
                ok = self._populate(arr, start, end)
            except (OSError, AttributeError, ValueError):
                ok = False
            if not ok:
                with self._cond:
                    self.enabled = False
                    self._spans.clear()
            del arr  # (its mapping may go now)

    def _after_fork_in_child(self) -> None:
        # the thread does not survive a fork: start afresh (another one when asked)
        self._spans = collections.deque()
        self._cond = threading.Condition()
        self._thread = None
        self._busy = False


prefaulter = _Prefaulter()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=prefaulter._after_fork_in_child)
