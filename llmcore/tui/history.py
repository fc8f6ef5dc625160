"""What changes between polls: throughput rates over time (`History`) and the events found
by comparing two snapshots (`diff_events`)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .formatting import fmt_num
from .snapshot import Snapshot


@dataclass(frozen=True)
class Rate:
    """Tokens per second of wall-clock time over the last `window_s` seconds (all slots)."""

    tokens_per_s: float
    window_s: float


@dataclass(frozen=True)
class _Sample:
    t: float
    done: dict[str, float]  # series -> tokens done so far
    uptime: float | None


SERIES = {  # name -> (counter finished requests add to, per-slot progress of running ones)
    "prompt": ("prompt_tokens_total", "n_prefilled"),
    "gen": ("tokens_predicted_total", "n_decoded"),
}


class History:
    """What the throughput pane plots, from counter deltas between polls.

    - `rate(series)`: tokens per second over the last `window_s` seconds of wall-clock time
      (the window actually covered is returned with it: shorter right after start).
    - `prompt_tps` / `gen_tps`: one tokens-per-second value per poll, for the sparklines.
    - `queued`: requests waiting for a slot, per poll.
    """

    def __init__(self, maxlen: int = 120, window_s: float = 10.0):
        self.window_s = window_s
        self.prompt_tps: deque[float] = deque(maxlen=maxlen)
        self.gen_tps: deque[float] = deque(maxlen=maxlen)
        self.queued: deque[float] = deque(maxlen=maxlen)
        self._samples: deque[_Sample] = deque(maxlen=maxlen + 1)

    def per_poll(self, series: str) -> deque[float]:
        return self.gen_tps if series == "gen" else self.prompt_tps

    def add(self, snap: Snapshot) -> None:
        if not snap.connected:
            return
        done = {}
        for name, (counter, live) in SERIES.items():
            v = _progress(snap, counter, live)
            if v is not None:
                done[name] = v
        prev = self._samples[-1] if self._samples else None
        if prev is not None:
            if snap.time <= prev.t:
                return  # the same poll again (or a clock step back): nothing new
            up = snap.get("uptime_s")
            if up is not None and prev.uptime is not None and up + 1 < prev.uptime:
                self._samples.clear()  # a restarted server: its counters started again
                prev = None
        self._samples.append(_Sample(snap.time, done, snap.get("uptime_s")))
        self.queued.append(float(snap.get("requests_deferred") or 0))
        if prev is None:
            return
        dt = snap.time - prev.t
        for name, dq in (("prompt", self.prompt_tps), ("gen", self.gen_tps)):
            if name in done and name in prev.done:
                # a cancelled request's live tokens may leave the count: never below 0
                dq.append(max(0.0, (done[name] - prev.done[name]) / dt))

    def rate(self, series: str) -> Rate | None:
        """Tokens/s over the window, or None before two polls."""
        if len(self._samples) < 2:
            return None
        last = self._samples[-1]
        # the oldest sample within the window (half a poll of slack: polls are not exactly on time)
        slack = 0.5 * (last.t - self._samples[-2].t)
        start = next(s for s in self._samples if s.t >= last.t - self.window_s - slack)
        if start is last:
            start = self._samples[-2]
        if series not in last.done or series not in start.done:
            return None
        dt = last.t - start.t
        return Rate(max(0.0, (last.done[series] - start.done[series]) / dt), dt)

    def span_s(self) -> float:
        """Seconds the per-poll values cover."""
        return self._samples[-1].t - self._samples[0].t if len(self._samples) > 1 else 0.0

    def peak(self, series: str) -> float | None:
        dq = self.per_poll(series)
        return max(dq) if dq else None

    def clear(self) -> None:
        self.prompt_tps.clear()
        self.gen_tps.clear()
        self.queued.clear()
        self._samples.clear()


def _progress(snap: Snapshot, counter: str, live: str) -> float | None:
    """Tokens done so far: the server counts a request's tokens when it finishes, so add
    what the busy slots have done already (otherwise the rate comes in bursts)."""
    c = snap.get(counter)
    if c is None:
        return None
    return float(c) + sum(float(s.get(live) or 0) for s in snap.slots if s.get("task_id") is not None)


EVENT_COUNTERS = (  # stats field, level, text ({d} = increase)
    ("requests_total", "info", "{d} request(s) finished"),
    ("requests_errors", "error", "{d} request(s) failed"),
    ("requests_cancelled", "warning", "{d} request(s) cancelled"),
    ("cache_ram_evictions", "info", "RAM cache: {d} entr(ies) evicted"),
    ("idle_slot_evictions", "info", "{d} idle slot state(s) dropped for KV room"),
    ("checkpoints_restored", "info", "{d} context checkpoint(s) restored"),
    ("forced_reprefills", "warning", "{d} prompt(s) re-processed from 0 (no checkpoint)"),
    ("checkpoint_failures", "warning", "{d} checkpoint failure(s)"),
    ("cache_save_failures", "warning", "RAM cache: {d} save failure(s), served as misses"),
    ("cache_restore_failures", "warning", "RAM cache: {d} restore failure(s), served as misses"),
    ("kv_full_failures", "error", "{d} request(s) failed: no KV room"),
)


def diff_events(prev: Snapshot | None, cur: Snapshot) -> list[tuple[str, str]]:
    """(level, text) events between two snapshots: connection changes, errors,
    cancellations, cache evictions / restores, slots starting and finishing tasks."""
    out: list[tuple[str, str]] = []
    if not cur.connected:
        if prev is None or prev.connected:
            out.append(("error", f"connection lost: {cur.error}"))
        return out
    if prev is not None and not prev.connected:
        out.append(("info", "connection restored"))
    if prev is None or not prev.connected:
        if cur.get("status") not in (None, "ok"):
            out.append(_status_event(cur))
        return out
    if prev.get("status") != cur.get("status") and cur.get("status") is not None:
        out.append(_status_event(cur))
    if (cur.get("uptime_s") or 0) + 1 < (prev.get("uptime_s") or 0):
        out.append(("warning", "server restarted"))
        return out
    for key, lvl, text in EVENT_COUNTERS:
        d = _delta(prev.get(key), cur.get(key))
        if d > 0:
            out.append((lvl, text.format(d=fmt_num(d))))
    out += _slot_events(prev, cur)
    return out


def _status_event(snap: Snapshot) -> tuple[str, str]:
    st = snap.get("status")
    if st == "loading":
        return "info", "loading the model"
    if st == "ok":
        return "info", "model loaded: serving"
    if st == "error":
        why = snap.get("error")
        return "error", "the model failed to load" + (f": {why}" if why else "")
    return "warning", f"server status: {st}"


def _slot_events(prev: Snapshot, cur: Snapshot) -> list[tuple[str, str]]:
    before = {s.get("id"): s for s in prev.slots}
    pairs = [(before[s.get("id")], s) for s in cur.slots if s.get("id") in before]
    n_done = sum(1 for p, s in pairs if p.get("task_id") is not None
                 and (s.get("task_id") != p.get("task_id") or s.get("state") == "idle" != p.get("state")))
    # a slot's numbers are its last task's: when more requests finished than slots were seen
    # finishing, some ran between two polls and the numbers may be another task's
    exact = _delta(prev.get("requests_total"), cur.get("requests_total")) <= n_done
    out = []
    for p, s in pairs:
        was, now = p.get("task_id"), s.get("task_id")
        if was is not None and now == was and s.get("state") == "idle" and p.get("state") != "idle":
            out.append(("info", f"slot {s.get('id')}: task {was} done"
                                + (f", {fmt_num(s.get('n_decoded'))} tokens generated" if exact else "")))
        elif was is not None and now != was:
            n = s.get("n_decoded") if now is None and exact else None
            out.append(("info", f"slot {s.get('id')}: task {was} done"
                                + (f", {fmt_num(n)} tokens generated" if n is not None else "")))
        if now is not None and now != was:
            cached = s.get("n_cached")
            extra = f", {fmt_num(cached)} of {fmt_num(s.get('n_prompt'))} prompt tokens cached" \
                if cached is not None else ""
            out.append(("info", f"slot {s.get('id')}: task {now} started{extra}"))
    return out


def _delta(a, b) -> float:
    if a is None or b is None:
        return 0
    return float(b) - float(a)
