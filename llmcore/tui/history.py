"""What changes between polls: throughput rates over time (`History`) and the events found
by comparing two snapshots (`diff_events`)."""
from __future__ import annotations

from collections import deque

from .formatting import fmt_num
from .snapshot import Snapshot


class History:
    """Bounded history of instant rates, computed from counter deltas between polls
    (tokens per second over the whole server, all slots together)."""

    def __init__(self, maxlen: int = 120):
        self.prompt_tps: deque[float] = deque(maxlen=maxlen)
        self.gen_tps: deque[float] = deque(maxlen=maxlen)
        self.queued: deque[float] = deque(maxlen=maxlen)
        self._last: Snapshot | None = None

    def add(self, snap: Snapshot) -> None:
        if not snap.connected:
            return
        prev, self._last = self._last, snap
        self.queued.append(float(snap.get("requests_deferred") or 0))
        if prev is None:
            return
        dt = snap.time - prev.time
        if dt <= 0:
            return
        for key, live, dq in (("prompt_tokens_total", "n_prefilled", self.prompt_tps),
                              ("tokens_predicted_total", "n_decoded", self.gen_tps)):
            a, b = _progress(prev, key, live), _progress(snap, key, live)
            if a is None or b is None:
                continue
            dq.append(max(0.0, (b - a) / dt))  # a restarted server: no negative rate

    def clear(self) -> None:
        self.prompt_tps.clear()
        self.gen_tps.clear()
        self.queued.clear()
        self._last = None


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
            out.append(("warning", f"server status: {cur.get('status')}"))
        return out
    if prev.get("status") != cur.get("status") and cur.get("status") is not None:
        lvl = "error" if cur.get("status") == "error" else "info"
        out.append((lvl, f"server status: {cur.get('status')}"))
    if (cur.get("uptime_s") or 0) + 1 < (prev.get("uptime_s") or 0):
        out.append(("warning", "server restarted"))
        return out
    for key, lvl, text in EVENT_COUNTERS:
        d = _delta(prev.get(key), cur.get(key))
        if d > 0:
            out.append((lvl, text.format(d=fmt_num(d))))
    out += _slot_events(prev, cur)
    return out


def _slot_events(prev: Snapshot, cur: Snapshot) -> list[tuple[str, str]]:
    out = []
    before = {s.get("id"): s for s in prev.slots}
    for s in cur.slots:
        p = before.get(s.get("id"))
        if p is None:
            continue
        was, now = p.get("task_id"), s.get("task_id")
        if was is not None and now == was and s.get("state") == "idle" and p.get("state") != "idle":
            out.append(("info", f"slot {s.get('id')}: task {was} done, "
                                f"{fmt_num(s.get('n_decoded'))} tokens generated"))
        elif was is not None and now != was:
            n = s.get("n_decoded") if now is None else None
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
