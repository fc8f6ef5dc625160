"""Thread-count policy in one place: OMP_NUM_THREADS, else the CPUs this process may use."""
from __future__ import annotations

import collections
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


def other_runnable() -> int | None:
    """Threads of other processes running or waiting for a CPU right now (Linux: the
    runnable count in /proc/loadavg minus this process's runnable threads); None where that
    cannot be read."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        mine = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                    mine += f.read().rsplit(b")", 1)[1].split()[0] == b"R"
            except (OSError, IndexError):
                continue
    except (OSError, ValueError, IndexError):
        return None
    return max(0, running - max(1, mine))


class AdaptiveThreads:
    """Thread count for memory-bound decode steps, chosen by measured step time.

    A decode step is a chain of short parallel regions; when another process holds a core,
    a region waits for a descheduled thread. Depending on the machine's load, one thread or
    all of them is faster, and that changes while a server runs. So decode steps time both:
    the count with the lower mean step time over its last `window` steps (per batch-size
    bucket) is used, and the other one is re-measured now and then (the fresh time replaces
    its old steps): after `explore_every` steps, and each time it loses again twice as many
    steps later (at most `max_backoff` times `explore_every`), because on a busy machine an
    exploring step can cost several normal ones. A re-measured count that wins resets the
    interval. More threads are not tried at all while other processes' runnable threads fill
    every CPU (`busy()`, default :func:`other_runnable`): such a step waits for descheduled
    threads, so there one thread is the choice without paying for the measurement (the check
    runs only when a measurement of `n_max` is due). With fewer competitors (one busy process
    on two cores) two threads can win, since they get a larger share of the CPUs: measured.

    Means, not typical steps: with one competing process, two-thread steps are mostly as
    fast as one-thread ones but now and then wait a scheduler slice for a descheduled
    thread (SmolLM2, a busy loop beside it: medians 2.98 / 2.95 ms, means 3.08 / 2.99, the
    99th percentile 6.3 / 3.5), and throughput is the mean. A few fresh steps of `n_max`
    rarely include such a wait, so while its window holds fewer than `settled` steps its
    mean counts `handicap` times more; one thread has no such tail. A single step is
    counted at most `OUTLIER` times the window's mean, so one stall (a collection, a pool
    growth) moves the mean by at most that over the window and cannot flip the choice alone.
    """

    OUTLIER = 4.0

    def __init__(self, n_max: int, explore_every: int = 32, max_backoff: int = 8, window: int = 32,
                 settled: int = 32, handicap: float = 1.1, busy=other_runnable, n_cpus: int | None = None):
        self.n_max = max(1, n_max)
        self.busy = busy
        self.n_cpus = available_cpus() if n_cpus is None else n_cpus
        self.explore_every = explore_every
        self.max_every = explore_every * max(1, max_backoff)
        self.window = max(1, window)
        self.settled = settled
        self.handicap = handicap
        self._win: dict[tuple[int, int], collections.deque] = {}  # (bucket, count) -> last step times
        self._steps: dict[int, int] = {}
        self._every: dict[int, int] = {}  # bucket -> current exploration interval
        self._next: dict[int, int] = {}  # bucket -> step of the next exploration
        self._exploring: dict[int, tuple[int, int]] = {}  # bucket -> (count, step) of an exploration

    @staticmethod
    def bucket(n_tokens: int) -> int:
        return 1 if n_tokens <= 1 else 4 if n_tokens <= 4 else 16 if n_tokens <= 16 else 64

    def _crowded(self) -> bool:
        others = self.busy() if self.busy is not None else None
        return others is not None and others >= self.n_cpus

    def mean(self, b: int, n: int) -> float:
        """Mean step time of count n in bucket b over its window (as the choice weighs it)."""
        w = self._win[(b, n)]
        m = sum(w) / len(w)
        return m * self.handicap if n > 1 and len(w) < self.settled else m

    def _best(self, b: int) -> int:
        return self.n_max if self.mean(b, self.n_max) < self.mean(b, 1) else 1

    def choose(self, n_tokens: int) -> int:
        if self.n_max == 1:
            return 1
        b = self.bucket(n_tokens)
        step = self._steps.get(b, 0)
        self._steps[b] = step + 1
        cands = (1, self.n_max)
        unmeasured = [n for n in cands if (b, n) not in self._win]
        if unmeasured:
            n = unmeasured[0]
            return 1 if n == self.n_max and self._crowded() else n
        best = self._best(b)
        if step >= self._next.setdefault(b, step + self.explore_every):
            every = self._every.get(b, self.explore_every)
            self._next[b] = step + every
            other = cands[1] if best == cands[0] else cands[0]
            if other == self.n_max and self._crowded():
                return best  # not now: look again after the interval
            self._exploring[b] = (other, step)
            return other
        return best

    def record(self, n_tokens: int, n_threads: int, seconds: float) -> None:
        b = self.bucket(n_tokens)
        key = (b, n_threads)
        w = self._win.get(key)
        count, step = self._exploring.pop(b, (0, 0))
        exploring = count == n_threads
        if w is None or exploring:  # a re-measurement replaces the count's stale steps
            w = self._win[key] = collections.deque(maxlen=self.window)
        else:
            seconds = min(seconds, self.OUTLIER * sum(w) / len(w))
        w.append(seconds)
        if exploring:
            if self._best(b) == n_threads:  # the re-measured count won: it is the choice now
                self._every[b] = self.explore_every
            else:
                every = min(self._every.get(b, self.explore_every) * 2, self.max_every)
                self._every[b] = every
                self._next[b] = step + every
