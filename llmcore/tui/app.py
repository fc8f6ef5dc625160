"""The dashboard App: polls a stats source and shows slots, caches, throughput, requests
and an event log. Runs beside an in-process server (`llmcore tui`) or attached to one
over HTTP (`llmcore tui --url`).

Layout: the screen gets a width class from HORIZONTAL_BREAKPOINTS (-narrow below 100
columns, -normal, -wide from 160) that the stylesheet uses to place the panes; each pane
draws what fits its own width (see widgets/panel.py), so 80x24 shows every pane's
essentials and wider terminals add columns and details.

Polling: `set_interval` calls `poll`, which starts one async worker unless the previous
fetch is still running (a slow server never stacks requests up). Sources never raise;
a lost connection is a snapshot with `connected=False`, shown as state. `p` pauses the
timer itself.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Awaitable, Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal

from .history import History, diff_events
from .messages import LogEvent, StatsUpdated
from .snapshot import Snapshot
from .source import StatsSource
from .widgets import CacheGauges, EventLog, HelpScreen, KeyBar, RequestsPane, SlotTable, StatusBar, Throughput

INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
LOG_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning"}
# loggers whose records are shown without their name (the line says what it is)
PLAIN_LOGGERS = ("llmcore.access",)
# records the event log leaves out: (logger, message format) the access line already says
REPEATED = (("llmcore.engine", "slot %d task %d "),)


def screenshot_dir() -> Path:
    """Where `s` saves: $XDG_PICTURES_DIR when it names a directory, else the working one."""
    pics = os.environ.get("XDG_PICTURES_DIR")
    if pics and Path(pics).expanduser().is_dir():
        return Path(pics).expanduser()
    return Path.cwd()


class _LogBridge(logging.Handler):
    """Log records of the server/engine (any thread) into the event log."""

    def __init__(self, app: "Dashboard", level: int):
        super().__init__(level)
        self.app = app

    def emit(self, record: logging.LogRecord) -> None:
        if any(record.name == name and str(record.msg).startswith(fmt) for name, fmt in REPEATED):
            return
        try:
            lvl = "error" if record.levelno >= logging.ERROR else LOG_LEVELS.get(record.levelno, "info")
            name = record.name.removeprefix("llmcore.")
            text = record.getMessage() if record.name in PLAIN_LOGGERS else f"{name}: {record.getMessage()}"
            self.app.post_message(LogEvent(lvl, text, record.created))
        except Exception:  # noqa: BLE001 - logging must never raise
            pass


class Dashboard(App):
    CSS_PATH = "dashboard.tcss"
    TITLE = "llmcore"
    ENABLE_COMMAND_PALETTE = False  # every action has its key (listed by `?`)
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-normal"), (160, "-wide")]
    BINDINGS = [
        Binding("q", "quit", "quit (stops the server it started)"),
        Binding("ctrl+c", "quit", "quit, like q", priority=True),
        Binding("question_mark", "help", "this help"),
        Binding("p", "toggle_pause", "pause / resume polling"),
        Binding("s", "screenshot", "save an SVG screenshot ($XDG_PICTURES_DIR or here)"),
        Binding("o", "sort", "sort slots by: slot, state, tokens, speed"),
        Binding("plus,equals_sign", "slower", "poll less often"),
        Binding("minus", "faster", "poll more often"),
        Binding("c", "clear_log", "clear the event log"),
    ]
    KEYS_SHOWN = [("q", "quit"), ("?", "help"), ("s", "screenshot"), ("o", "sort"), ("p", "pause"),
                  ("+/-", "interval"), ("c", "clear log")]

    def __init__(self, source: StatsSource, interval: float = 1.0, history: int = 120,
                 startup: Callable[[], Awaitable[None]] | None = None,
                 shutdown: Callable[[], Awaitable[None]] | None = None,
                 log_level: int | None = logging.INFO, owns_server: bool = False,
                 clock: Callable[[], float] = time.time, window_s: float = 10.0, autopoll: bool = True):
        """
        Args:
            source: where snapshots come from (EngineSource, HttpSource, FakeSource).
            interval: seconds between polls.
            history: samples kept for the sparklines.
            startup / shutdown: coroutines run when the app mounts / exits (the
                in-process server); a startup failure ends the app with its message.
            log_level: forward log records at this level and above into the event log
                (None: leave logging alone).
            owns_server: the source is this process's own server: when its model fails
                to load the dashboard exits with the reason (as `llmcore serve` does).
            clock: wall-clock time for the event log's own lines (tests freeze it).
            window_s: seconds the throughput rates are averaged over.
            autopoll: poll the source every `interval` (False: the caller feeds `show`;
                screenshot tests do, for a picture that never depends on timing).
        """
        super().__init__()
        self.stats_source = source
        self.poll_interval = max(0.05, float(interval))  # 0 would poll in a busy loop
        self.rates = History(history, window_s=window_s)
        self.last: Snapshot | None = None
        self.n_polls = 0
        self.owns_server = owns_server
        self.clock = clock
        self.screenshots: list[Path] = []
        self._server_start, self._server_stop = startup, shutdown
        self._log_level = log_level
        self._log_bridge: _LogBridge | None = None
        self._in_flight = False
        self._paused = False
        self._poll_timer = None
        self._autopoll = autopoll

    # ---- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar(self.stats_source.name, id="status")
        yield SlotTable(id="slots")
        with Horizontal(id="middle"):
            yield CacheGauges(id="cache")
            yield Throughput(id="throughput")
            yield RequestsPane(id="requests")
        yield EventLog(id="log")
        yield KeyBar(self.KEYS_SHOWN, id="keys")

    async def on_mount(self) -> None:
        self.status_bar = self.query_one(StatusBar)
        self.slot_table = self.query_one(SlotTable)
        self.requests_pane = self.query_one(RequestsPane)
        self.cache_gauges = self.query_one(CacheGauges)
        self.throughput = self.query_one(Throughput)
        self.event_log = self.query_one(EventLog)
        for w, title in ((self.slot_table, "slots"), (self.requests_pane, "requests"),
                         (self.cache_gauges, "caches and memory"), (self.event_log, "events")):
            w.border_title = title
        self._title_panes()
        self.status_bar.set(interval=self.poll_interval)
        if self._log_level is not None:
            self._log_bridge = _LogBridge(self, self._log_level)
            logging.getLogger().addHandler(self._log_bridge)
        if self._server_start is not None:
            try:
                await self._server_start()
            except Exception as e:  # noqa: BLE001 - e.g. the port is taken
                self.exit(return_code=1, message=f"error: {e}")
                return
        self.event_log.add("info", f"watching {self.stats_source.name}, every {self.poll_interval:g} s",
                           self.clock())
        if self._autopoll:
            self._poll_timer = self.set_interval(self.poll_interval, self.poll)
            self.poll()

    def _title_panes(self) -> None:
        self.slot_table.border_title = f"slots (by {self.slot_table.sort_key})"
        self.throughput.border_title = f"tokens/s (last {self.rates.window_s:g} s)"

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
        self.status_bar.set(snapshot=snap)
        self.set_class(not snap.connected, "-lost")
        if snap.connected:
            self.slot_table.show(snap.slots, snap.replicas)
            self.requests_pane.show(snap)
            self.cache_gauges.show(snap)
            self.throughput.show(self.rates, snap)
            if self.owns_server and snap.get("status") == "error":
                why = snap.get("error") or "see the event log"
                self.exit(return_code=1, message=f"error: cannot load {snap.get('model') or 'the model'}: {why}")

    def on_log_event(self, message: LogEvent) -> None:
        self.event_log.add(message.level, message.text, message.when)

    # ---- actions ------------------------------------------------------------------------------
    def action_toggle_pause(self) -> None:
        self._paused = not self._paused
        if self._poll_timer is not None:
            (self._poll_timer.pause if self._paused else self._poll_timer.resume)()
        self.status_bar.set(paused=self._paused)
        self.event_log.add("info", "paused" if self._paused else "resumed", self.clock())

    def _set_interval(self, value: float) -> None:
        self.poll_interval = value
        self.status_bar.set(interval=value)
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

    def action_sort(self) -> None:
        self.slot_table.cycle_sort()
        self._title_panes()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(list(self.BINDINGS)))

    def action_screenshot(self) -> None:
        self.deliver_screenshot()

    def deliver_screenshot(self, filename: str | None = None, path: str | None = None,
                           time_format: str | None = None) -> str | None:
        """Save an SVG of the screen into `screenshot_dir()` (Textual's default, a Downloads
        folder, may not exist) and say where."""
        folder = Path(path) if path else screenshot_dir()
        name = filename or time.strftime("llmcore-%Y%m%d-%H%M%S.svg", time.localtime(self.clock()))
        try:
            saved = Path(self.save_screenshot(name, str(folder)))
        except OSError as e:
            self.notify(f"screenshot not saved: {e.strerror or e}", severity="error")
            return None
        self.screenshots.append(saved)
        self.notify(f"screenshot saved: {saved}")
        self.event_log.add("info", f"screenshot saved: {saved}", self.clock())
        return str(saved)
