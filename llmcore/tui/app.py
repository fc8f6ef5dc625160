"""The dashboard App: polls a stats source and shows slots, caches, throughput, requests
and an event log. Runs beside an in-process server (`llmcore tui`) or attached to one
over HTTP (`llmcore tui --url`).

Polling: `set_interval` calls `poll`, which starts one async worker unless the previous
fetch is still running (a slow server never stacks requests up). Sources never raise;
a lost connection is a snapshot with `connected=False`, shown as state. `p` pauses the
timer itself.
"""
from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer

from .messages import LogEvent, StatsUpdated
from .formatting import cache_numbers
from .history import History, diff_events
from .snapshot import Snapshot
from .source import StatsSource
from .widgets import CacheGauges, EventLog, HelpScreen, RequestsPane, SlotTable, StatusBar, Throughput

INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
LOG_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning"}


class _LogBridge(logging.Handler):
    """Log records of the server/engine (any thread) into the event log."""

    def __init__(self, app: "Dashboard", level: int):
        super().__init__(level)
        self.app = app

    def emit(self, record: logging.LogRecord) -> None:
        try:
            lvl = "error" if record.levelno >= logging.ERROR else LOG_LEVELS.get(record.levelno, "info")
            self.app.post_message(LogEvent(lvl, f"{record.name}: {record.getMessage()}", record.created))
        except Exception:  # noqa: BLE001 - logging must never raise
            pass


class Dashboard(App):
    CSS_PATH = "dashboard.tcss"
    TITLE = "llmcore"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("p", "toggle_pause", "pause"),
        Binding("plus,equals_sign", "slower", "+interval"),
        Binding("minus", "faster", "-interval"),
        Binding("c", "clear_log", "clear log"),
        Binding("question_mark", "help", "help"),
    ]

    def __init__(self, source: StatsSource, interval: float = 1.0, history: int = 120,
                 startup: Callable[[], Awaitable[None]] | None = None,
                 shutdown: Callable[[], Awaitable[None]] | None = None,
                 log_level: int | None = logging.INFO):
        """
        Args:
            source: where snapshots come from (EngineSource, HttpSource, FakeSource).
            interval: seconds between polls.
            history: samples kept for the sparklines.
            startup / shutdown: coroutines run when the app mounts / exits (the
                in-process server); a startup failure ends the app with its message.
            log_level: forward log records at this level and above into the event log
                (None: leave logging alone).
        """
        super().__init__()
        self.stats_source = source
        self.poll_interval = max(0.05, float(interval))  # 0 would poll in a busy loop
        self.rates = History(history)
        self.last: Snapshot | None = None
        self.n_polls = 0
        self._server_start, self._server_stop = startup, shutdown
        self._log_level = log_level
        self._log_bridge: _LogBridge | None = None
        self._in_flight = False
        self._paused = False
        self._poll_timer = None

    # ---- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar(self.stats_source.name, id="status")
        with Horizontal(id="top"):
            yield SlotTable(id="slots")
            yield RequestsPane(id="requests")
        with Horizontal(id="middle"):
            yield CacheGauges(id="cache")
            yield Throughput(id="throughput")
        yield EventLog(id="log")
        yield Footer()

    async def on_mount(self) -> None:
        self.status_bar = self.query_one(StatusBar)
        self.slot_table = self.query_one(SlotTable)
        self.requests_pane = self.query_one(RequestsPane)
        self.cache_gauges = self.query_one(CacheGauges)
        self.throughput = self.query_one(Throughput)
        self.event_log = self.query_one(EventLog)
        for w, title in ((self.slot_table, "slots"), (self.requests_pane, "requests"),
                         (self.cache_gauges, "caches"), (self.throughput, "throughput"),
                         (self.event_log, "events")):
            w.border_title = title
        self.status_bar.interval = self.poll_interval
        if self._log_level is not None:
            self._log_bridge = _LogBridge(self, self._log_level)
            logging.getLogger().addHandler(self._log_bridge)
        if self._server_start is not None:
            try:
                await self._server_start()
            except Exception as e:  # noqa: BLE001 - e.g. the port is taken
                self.exit(return_code=1, message=f"error: {e}")
                return
        self.event_log.add("info", f"watching {self.stats_source.name}, every {self.poll_interval:g} s")
        self._poll_timer = self.set_interval(self.poll_interval, self.poll)
        self.poll()

    async def on_unmount(self) -> None:
        if self._log_bridge is not None:
            logging.getLogger().removeHandler(self._log_bridge)
            self._log_bridge = None
        try:
            await self.stats_source.close()
        finally:
            if self._server_stop is not None:
                await self._server_stop()

    # ---- polling ----------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused

    def poll(self) -> None:
        if self._in_flight or self._paused:
            return
        self._in_flight = True
        self._fetch()

    @work(exclusive=True, group="poll", exit_on_error=False)
    async def _fetch(self) -> None:
        try:
            snap = await self.stats_source.fetch()
        except Exception as e:  # noqa: BLE001 - a source that breaks its contract
            snap = Snapshot.lost(f"{type(e).__name__}: {e}")
        finally:
            self._in_flight = False
        self.n_polls += 1
        self.post_message(StatsUpdated(snap))

    def on_stats_updated(self, message: StatsUpdated) -> None:
        self.show(message.snapshot)

    def show(self, snap: Snapshot) -> None:
        """Update every pane from one snapshot (also usable directly in tests)."""
        for lvl, text in diff_events(self.last, snap):
            self.event_log.add(lvl, text, snap.time)
        self.last = snap
        self.rates.add(snap)
        self.status_bar.snapshot = snap
        self.set_class(not snap.connected, "-lost")
        if snap.connected:
            self.slot_table.show(snap.slots)
            self.requests_pane.snapshot = snap
            self.cache_gauges.cache = cache_numbers(snap)
            self.throughput.show(self.rates)

    def on_log_event(self, message: LogEvent) -> None:
        self.event_log.add(message.level, message.text, message.when)

    # ---- actions ------------------------------------------------------------------------------
    def action_toggle_pause(self) -> None:
        self._paused = not self._paused
        if self._poll_timer is not None:
            (self._poll_timer.pause if self._paused else self._poll_timer.resume)()
        self.status_bar.paused = self._paused
        self.event_log.add("info", "paused" if self._paused else "resumed", time.time())

    def _set_interval(self, value: float) -> None:
        self.poll_interval = value
        self.status_bar.interval = value
        if self._poll_timer is not None:
            self._poll_timer.stop()
            self._poll_timer = self.set_interval(value, self.poll, pause=self._paused)

    def action_slower(self) -> None:
        bigger = [i for i in INTERVALS if i > self.poll_interval]
        self._set_interval(bigger[0] if bigger else INTERVALS[-1])

    def action_faster(self) -> None:
        smaller = [i for i in INTERVALS if i < self.poll_interval]
        self._set_interval(smaller[-1] if smaller else INTERVALS[0])

    def action_clear_log(self) -> None:
        self.event_log.clear()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(list(self.BINDINGS)))
