"""Screenshots of the dashboard compared with the accepted ones in __snapshots__/ (the
pytest-textual-snapshot plugin; `pytest --snapshot-update` accepts new pictures after a
person has looked at them). The app is fed fixed FakeSource snapshots (no polling, a frozen
clock, UTC), so the picture depends on nothing but the code."""
import time

import pytest

from llmcore.tui.app import Dashboard
from llmcore.tui.source import FakeSource

pytest.importorskip("pytest_textual_snapshot")

STEPS = 13  # fake polls fed before the picture: the history and the event log fill


@pytest.fixture(autouse=True)
def same_everywhere(monkeypatch):
    """Event-log times in UTC whatever the machine's zone; colours whatever NO_COLOR says."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def dashboard(n_slots: int = 3):
    src = FakeSource(n_slots=n_slots)
    app = Dashboard(src, interval=1.0, log_level=None, autopoll=False, clock=lambda: src.t0)

    async def feed(pilot):
        for i in range(STEPS):
            app.show(src.snapshot(i))
        await pilot.pause()

    return app, feed


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen(snap_compare, size):
    app, feed = dashboard(n_slots=4 if size[0] >= 120 else 3)
    assert snap_compare(app, terminal_size=size, run_before=feed)


def test_help_screen(snap_compare):
    app, feed = dashboard()
    assert snap_compare(app, terminal_size=(80, 24), run_before=feed, press=["question_mark"])
