"""Thread-count policy in one place: OMP_NUM_THREADS, else the CPUs this process may use."""
from __future__ import annotations

import os

_n_threads: int | None = None


def available_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    env = os.environ.get("OMP_NUM_THREADS")
    if env and env.split(",")[0].isdigit():
        return max(1, int(env.split(",")[0]))
    return available_cpus()


def resolve(n: int | None) -> int:
    """n <= 0 or None means the default; negative n means 'all but |n|'."""
    if n is None or n == 0:
        return default_threads()
    if n < 0:
        return max(1, available_cpus() + n)
    return n


def set_num_threads(n: int | None) -> int:
    """Threads used by the kernels from now on; returns the resolved count."""
    global _n_threads
    _n_threads = resolve(n)
    return _n_threads


def get_num_threads() -> int:
    global _n_threads
    if _n_threads is None:  # resolved once: kernels ask on every call
        _n_threads = default_threads()
    return _n_threads
