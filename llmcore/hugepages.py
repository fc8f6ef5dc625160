"""Anonymous memory on transparent huge pages, for what is streamed every step: repacked
weights (quant.WeightArena) and the KV block pools (cache.pool).

On 4 KiB pages a stream of scattered reads costs a TLB miss every few rows and stops the
hardware prefetcher at every page end; with THP in ``madvise`` mode (a common default)
memory only gets huge pages where it asks for them.
"""
from __future__ import annotations

import mmap
import sys

import numpy as np

HUGE_PAGE = 2 << 20


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
