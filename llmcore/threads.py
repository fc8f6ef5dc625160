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


class AdaptiveThreads:
    """Thread count for memory-bound decode steps, chosen by measured step time.

    A decode step is a chain of short parallel regions; with sleeping OpenMP waiters each
    region pays a wake-up, and when another process holds a core a region waits for a
    descheduled thread. Depending on the machine's load, one thread or all of them is
    faster, and that changes while a server runs. So decode steps time both: the faster
    count (per batch-size bucket, exponential moving average) is used, and the other one is
    re-measured every `explore_every` steps.
    """

    def __init__(self, n_max: int, explore_every: int = 32, alpha: float = 0.5):
        self.n_max = max(1, n_max)
        self.explore_every = explore_every
        self.alpha = alpha
        self._ema: dict[tuple[int, int], float] = {}
        self._steps: dict[int, int] = {}

    @staticmethod
    def bucket(n_tokens: int) -> int:
        return 1 if n_tokens <= 1 else 4 if n_tokens <= 4 else 16 if n_tokens <= 16 else 64

    def choose(self, n_tokens: int) -> int:
        if self.n_max == 1:
            return 1
        b = self.bucket(n_tokens)
        step = self._steps.get(b, 0)
        self._steps[b] = step + 1
        cands = (1, self.n_max)
        unmeasured = [n for n in cands if (b, n) not in self._ema]
        if unmeasured:
            return unmeasured[0]
        best = min(cands, key=lambda n: self._ema[(b, n)])
        if step % self.explore_every == 0:
            return cands[1] if best == cands[0] else cands[0]
        return best

    def record(self, n_tokens: int, n_threads: int, seconds: float) -> None:
        key = (self.bucket(n_tokens), n_threads)
        old = self._ema.get(key)
        self._ema[key] = seconds if old is None else old + self.alpha * (seconds - old)
