"""Dashboard tests: snapshot logic without Textual (numbers, gauges, rates, slot columns),
the App under Pilot with a fake source (deterministic stats): layout at 80x24 and up, keys,
screenshots, sorting; headless modes and the CLI. Screenshot comparisons are in
test_tui_snapshots.py, runs against a real server on tiny models in test_tui_live.py."""
import asyncio
import io
import json
import re

import pytest
from fakes import FakeChatTemplate, FakeModel, FakeTokenizer

from llmcore.engine import Engine, EngineConfig
from llmcore.metrics import METRICS, EngineStats, SlotStats, to_prometheus
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app
from llmcore.tui import formatting as F
from llmcore.tui import history as H
from llmcore.tui import parsing as P
from llmcore.tui.snapshot import Snapshot
from llmcore.tui.app import Dashboard
from llmcore.tui.run import headless, once
from llmcore.tui.source import EngineSource, FakeSource, HttpSource
from llmcore.tui.widgets import CacheGauges, HelpScreen, KeyBar, RequestsPane, SlotTable, StatusBar, Throughput
from llmcore.tui.widgets.panel import Panel

SIZE = (140, 45)
SIZES = [(80, 24), (120, 40), (200, 50)]


def fake_engine(np_=2, model=None):
    return Engine(EngineConfig(n_parallel=np_, sampling=SamplingParams(temperature=0.0)),
                  model=model or FakeModel(), tokenizer=FakeTokenizer(), chat_template=FakeChatTemplate(),
                  info={"name": "fake", "path": "/m/fake.gguf"})


async def wait_until(pred, pilot, timeout=5.0):
    for _ in range(int(timeout / 0.02)):
        if pred():
            return True
        await pilot.pause(0.02)
    return pred()


# ---- snapshot logic (no Textual) ---------------------------------------------------------------
async def test_http_snapshot_matches_in_process_snapshot(aiohttp_client):
    """/slots + /metrics + /props give the same numbers as the engine's own snapshot."""
    eng = fake_engine()
    client = await aiohttp_client(create_app(eng, ServerConfig()))
    r = await client.post("/completion", json={"prompt": "abc", "n_predict": 3})
    assert r.status == 200
    await client.post("/completion", json={"prompt": "abcd", "n_predict": 2})
    for _ in range(250):  # the answer can arrive just before the slot is released
        if all(s.state == "idle" for s in eng.stats().slots):
            break
        await asyncio.sleep(0.02)
    slots = await (await client.get("/slots")).json()
    metrics = await (await client.get("/metrics")).text()
    props = await (await client.get("/props")).json()
    via_http = P.from_http(slots, metrics, props)
    local = P.from_engine_stats(eng.stats())
    for key in ("requests_total", "prompt_tokens_total", "tokens_predicted_total", "cache_tokens_total",
                "requests_errors", "n_slots", "slot_hits", "slot_misses", "ram_hits", "cache_ram_bytes",
                "checkpoints_created", "kv_used_bytes"):
        if key in local.stats:  # fields an older engine lacks are simply absent
            assert via_http.get(key) == local.get(key), key
    assert local.get("requests_total") == 2 and local.get("tokens_predicted_total") == 5
    assert [F.slot_row(s) for s in via_http.slots] == [F.slot_row(s) for s in local.slots]
    assert via_http.get("model") == "fake.gguf" and via_http.get("status") == "ok"
    # the gauges' budgets: -c (n_ctx, all slots) and the memory plan, by either route
    assert via_http.get("n_ctx") == local.get("n_ctx") == eng.n_ctx
    assert F.kv_gauge(via_http) == F.kv_gauge(local) and F.cache_gauge(via_http) == F.cache_gauge(local)


def test_http_parsing_reads_every_metrics_table_row():
    """Each /metrics series lands on the EngineStats field the table names, model counters
    on `model_stats`; series this client does not know keep their name, labelled ones are
    skipped."""
    import dataclasses

    vals = {f.name: i + 1 for i, f in enumerate(dataclasses.fields(EngineStats)) if f.type == "int"}
    st = EngineStats(slots=(SlotStats(id=0, state="idle", n_ctx=8, n_tokens=3),), prompt_seconds_total=2.5,
                     tokens_predicted_seconds_total=4.0, uptime_s=12.0,
                     model_stats={"experts_computed": 40, "experts_skipped": 12}, **vals)
    text = to_prometheus(st) + 'llmcore:new_thing 3\nllamacpp:x{a="b"} 1\n'
    snap = P.from_http(None, text, None)
    for m in METRICS:
        assert snap.get(m.field) == getattr(st, m.field), m.name
        assert type(snap.get(m.field)) is type(getattr(st, m.field)), m.name  # counts stay ints
    assert snap.model_stats == P.from_engine_stats(st).model_stats == {"experts_computed": 40,
                                                                       "experts_skipped": 12}
    assert snap.get("new_thing") == 3 and "x" not in snap.stats
    assert P.from_engine_stats(st).get("kv_tokens") == 3


def test_numbers_as_text():
    assert [F.fmt_num(v) for v in (None, 3, 3.0, 1234567, 2.25, float("nan"))] == \
        ["-", "3", "3", "1,234,567", "2.2", "-"]
    assert [F.fmt_bytes(v) for v in (None, -1, 512, 1536, 3 * 2**30)] == \
        ["-", "no limit", "512 B", "1.5 KiB", "3.0 GiB"]
    assert [F.fmt_duration(v) for v in (None, 59, 61, 3725)] == ["-", "0:59", "1:01", "1:02:05"]
    assert F.model_label("/a/b\\c/model.gguf") == "model.gguf" and F.model_label("") == "-"
    assert [F.fmt_count(v) for v in (None, 999, 9999, 12345, 123456, 1234567, 5e10)] == \
        ["-", "999", "9,999", "12.3k", "123k", "1.2M", "50.0G"]
    assert [F.fmt_rate(v) for v in (None, 0.0, 32.04, 582.9, 12345.0)] == ["-", "0.0", "32.0", "583", "12.3k"]
    assert [F.fmt_pct(h, t) for h, t in ((1, 3), (0, 0), (None, 2))] == ["33%", "-", "-"]
    snap = Snapshot(time=0.0, stats={"cache_ram_bytes": 2**20, "kv_used_bytes": 5, "requests_total": 2},
                    model_stats={"experts_skipped": 7})
    assert "model: experts_skipped 7" in F.to_text(snap).splitlines()


def test_missing_fields_render_as_dash():
    snap = Snapshot(time=0.0, stats={}, slots=({"id": 0},))
    assert F.slot_row(snap.slots[0])[1:] == ("-",) * (len(F.ALL_SLOT_COLUMNS) - 1)
    text = F.to_text(snap)
    assert "requests: processing -  queued -" in text and "KV cache: 0 / - tok" in text
    assert "prompt cache: - / -" in text and "hit rate" not in text
    assert P.from_http(None, None, None).stats == {}  # nothing answered: empty, not an error


def test_phrases_flow_into_lines_without_cutting_a_word():
    phrases = ["made 12", "restored 6", "re-prefills 3", "erased 0"]
    assert F.flow(phrases, 24) == ["made 12  restored 6", "re-prefills 3  erased 0"]
    assert F.flow(phrases, 24, first=8) == ["made 12", "restored 6", "re-prefills 3  erased 0"]
    assert F.flow(phrases, 24, first=5) == ["", "made 12  restored 6", "re-prefills 3  erased 0"]
    assert F.flow(["a-very-long-phrase", "ok"], 6) == ["ok"]  # left out, never cut
    for width in range(6, 40):
        for line in F.flow(phrases, width):
            assert len(line) <= width and all(p in phrases for p in line.split("  ") if p)


def test_history_rates_from_counter_deltas():
    h = H.History(maxlen=3)
    snaps = [Snapshot(time=10.0 + 2 * i, stats={"prompt_tokens_total": 100 * i * i,
                                                   "tokens_predicted_total": 10 * i}) for i in range(5)]
    h.add(snaps[0])
    h.add(Snapshot.lost("x", t=11.0))  # lost polls add no sample
    for s in snaps[1:]:
        h.add(s)
    # rate between polls i-1 and i: (100 i^2 - 100 (i-1)^2) / 2 s, last 3 kept
    assert list(h.prompt_tps) == [100 * (i * i - (i - 1) ** 2) / 2 for i in (2, 3, 4)]
    assert list(h.gen_tps) == [5.0, 5.0, 5.0]
    h.add(Snapshot(time=20.0, stats={"prompt_tokens_total": 0, "tokens_predicted_total": 0}))
    assert h.prompt_tps[-1] == 0.0  # a counter that went back never gives a negative rate


def test_rates_are_tokens_per_second_over_the_stated_window():
    """One poll every 0.5 s; 30 tokens/s of generation throughout, prompt tokens in a burst
    of 600 at t=2. The rate is tokens per wall-clock second over the window (not tokens
    per poll), and the window it covers is stated with it."""
    h = H.History(maxlen=100, window_s=10.0)
    assert h.rate("gen") is None
    for i in range(41):  # t = 0 .. 20 s
        t = 0.5 * i
        h.add(Snapshot(time=1000.0 + t, stats={"tokens_predicted_total": int(30 * t),
                                               "prompt_tokens_total": 600 if t >= 2 else 0,
                                               "uptime_s": t}))
        if i == 4:  # 2 s in: the window is what there is so far
            r = h.rate("prompt")
            assert r.window_s == 2.0 and r.tokens_per_s == 300.0
    r = h.rate("gen")
    assert r.window_s == 10.0 and r.tokens_per_s == pytest.approx(30.0)
    assert list(h.gen_tps)[-1] == pytest.approx(30.0)  # per poll, also in tokens per second
    assert h.peak("prompt") == 1200.0  # 600 tokens in the one 0.5 s poll
    assert h.rate("prompt").tokens_per_s == 0.0  # the burst left the window
    assert h.span_s() == 20.0
    # a restarted server (uptime went back) starts the history again
    h.add(Snapshot(time=1021.0, stats={"tokens_predicted_total": 5, "prompt_tokens_total": 0,
                                       "uptime_s": 0.5}))
    assert h.rate("gen") is None and h.span_s() == 0.0


def test_running_requests_count_before_they_finish():
    """The server adds a request's tokens to its counters when it finishes: the rate adds
    what busy slots did so far, so a long generation shows as steady, not as one burst."""
    h = H.History()
    for i, (total, live, busy) in enumerate([(0, 0, True), (0, 20, True), (40, 0, False)]):
        slot = {"id": 0, "task_id": 7 if busy else None, "n_decoded": live}
        h.add(Snapshot(time=float(i), stats={"tokens_predicted_total": total}, slots=(slot,)))
    assert list(h.gen_tps) == [20.0, 20.0]


def test_kv_and_prompt_cache_are_separate_gauges_with_their_own_budgets():
    """The KV gauge is the slots' tokens against -c; the prompt cache's bytes are measured
    against --cache-ram, never folded into the KV budget."""
    slots = ({"id": 0, "n_tokens": 300, "nbytes": 3 * 2**20}, {"id": 1, "n_tokens": 100, "nbytes": 2**20})
    snap = Snapshot(time=0.0, slots=slots, stats={
        "n_ctx": 8192, "kv_slots_max_bytes": 80 * 2**20, "kv_used_bytes": 6 * 2**20,
        "kv_limit_bytes": 8 * 2**30, "cache_ram_bytes": 2**20, "cache_ram_limit_bytes": 8 * 2**30,
        "cache_ram_entries": 2})
    kv, cache = F.gauges(snap)
    assert (kv.used, kv.budget, kv.text) == (400, 8192, "400 / 8,192 tok")
    assert kv.detail == ("slots 4.0 MiB of 80.0 MiB", "all pools 6.0 MiB")
    assert kv.pct == "5%"
    assert (cache.used, cache.budget, cache.text) == (2**20, 8 * 2**30, "1.0 MiB / 8.0 GiB")
    assert cache.detail[0] == "2 entries"
    off = Snapshot(time=0.0, stats={"cache_ram_bytes": 0, "cache_ram_limit_bytes": 0})
    unbounded = Snapshot(time=0.0, stats={"cache_ram_bytes": 2**20, "cache_ram_limit_bytes": -1})
    assert F.cache_gauge(off).text == "0 B / off" and F.cache_gauge(off).fraction is None
    assert F.cache_gauge(unbounded).text == "1.0 MiB / no limit"
    assert [F.level(x) for x in (None, 0.5, 0.85, 0.95)] == ["unknown", "green", "yellow", "red"]


def test_hit_rates_per_layer_and_forced_reprefills():
    snap = Snapshot(time=0.0, stats={"slot_hits": 3, "slot_misses": 1, "ram_hits": 2, "ram_misses": 0,
                                     "checkpoints_restored": 1, "forced_reprefills": 3})
    rates = F.hit_rates(snap)
    assert [(r.layer, r.hits, r.total, r.text) for r in rates] == [
        ("slot", 3, 4, "slot 75%"), ("RAM", 2, 2, "RAM 100%"), ("ckpt", 1, 4, "ckpt 25%")]
    disk = Snapshot(time=0.0, stats={"disk_hits": 1, "disk_misses": 1})  # a server with a disk layer
    assert [r.text for r in F.hit_rates(disk)] == ["disk 50%"]
    ck = F.checkpoint_phrases(Snapshot(time=0.0, stats={"checkpoints_created": 5, "checkpoints_restored": 1,
                                                        "forced_reprefills": 2}))
    assert ck == ["made 5", "restored 1", "re-prefills 2"]
    assert F.trouble_phrases(Snapshot(time=0.0, stats={"kv_full_waits": 2, "cache_save_failures": 0})) == \
        ["KV waits 2"]


def test_slot_columns_fit_the_width():
    slots = [FakeSource(n_slots=4).snapshot(5).slots[i] for i in range(4)]
    widths = {}
    for width in (30, 45, 60, 76, 116, 196):
        cols = F.slot_layout(slots, width)
        lines = F.table_lines(cols, [F.slot_row(s, cols) for s in slots])
        assert all(len(line) <= width for line in lines) or cols == F.SLOT_LAYOUTS[0], width
        widths[width] = cols
    assert set(F.SLOT_LAYOUTS[0]) <= set(widths[30])  # slot, state, prompt, gen, t/s always
    assert widths[76] == F.SLOT_LAYOUTS[2] and widths[196] == F.ALL_SLOT_COLUMNS
    row = dict(zip(F.SLOT_COLUMNS, F.slot_row({"id": 1, "state": "prefill", "n_prompt": 20000,
                                                "n_cached": 1000, "n_prefilled": 11000,
                                                "prompt_per_second": 812.4, "cache_source": "checkpoint"},
                                               list(F.SLOT_COLUMNS))))
    assert (row["prompt"], row["tps"], row["from"]) == ("12.0k/20.0k", "812", "ckpt")


def test_sort_keys():
    slots = [{"id": 0, "state": "idle", "n_tokens": 5}, {"id": 1, "state": "decode", "n_tokens": 50,
                                                         "predicted_per_second": 9.0},
             {"id": 2, "state": "prefill", "n_tokens": 20, "prompt_per_second": 300.0}]
    order = {k: [s["id"] for s in F.sort_slots(slots, k)] for k in F.SORT_KEYS}
    assert order == {"slot": [0, 1, 2], "state": [2, 1, 0], "tokens": [1, 2, 0], "speed": [2, 1, 0]}


def test_events_between_snapshots():
    fs = FakeSource(n_slots=2)
    a, b = fs.snapshot(0), fs.snapshot(6)
    ev = H.diff_events(a, b)
    texts = [t for _, t in ev]
    assert ("error", "1 request(s) failed") in ev  # step 0 -> 6: errors 0 -> 1
    assert ("info", "18 request(s) finished") in ev
    assert "RAM cache: 2 entr(ies) evicted" in texts and "3 context checkpoint(s) restored" in texts
    # slot 1 was busy (task 101) at step 0 and is busy with task 113 at step 6
    assert texts.index("slot 1: task 101 done") < texts.index(
        "slot 1: task 113 started, 32 of 128 prompt tokens cached")
    lost = Snapshot.lost("refused")
    assert H.diff_events(b, lost) == [("error", "connection lost: refused")]
    # a slot's numbers are its last task's: given only when no other task ran in between
    busy = {"id": 0, "task_id": 1, "state": "decode", "n_decoded": 5}
    idle = {"id": 0, "task_id": None, "state": "idle", "n_decoded": 15}
    a = Snapshot(time=0.0, stats={"requests_total": 0}, slots=(busy,))
    assert H.diff_events(a, Snapshot(time=1.0, stats={"requests_total": 1}, slots=(idle,))) == [
        ("info", "1 request(s) finished"), ("info", "slot 0: task 1 done, 15 tokens generated")]
    assert H.diff_events(a, Snapshot(time=1.0, stats={"requests_total": 2}, slots=(idle,)))[1] == \
        ("info", "slot 0: task 1 done")
    # a normal start: loading is news, not a warning
    loading = Snapshot(time=0.0, stats={"status": "loading"})
    assert H.diff_events(None, loading) == [("info", "loading the model")]
    assert H.diff_events(loading, Snapshot(time=1.0, stats={"status": "ok"})) == [("info", "model loaded: serving")]
    failed = Snapshot(time=1.0, stats={"status": "error", "error": "bad file"})
    assert H.diff_events(loading, failed) == [("error", "the model failed to load: bad file")]
    assert H.diff_events(lost, Snapshot.lost("refused")) == []  # said once, not every poll
    assert H.diff_events(lost, b) == [("info", "connection restored")]


# ---- the App with a fake source ------------------------------------------------------------------
async def test_slot_rows_appear_and_follow_the_source():
    src = FakeSource(n_slots=3)
    app = Dashboard(src, interval=0.05, log_level=None)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: app.n_polls >= 3, pilot)
        await pilot.pause()
        rows = app.slot_table.row_texts()
        assert rows == [F.slot_row(s) for s in app.last.slots]
        assert [r[0] for r in rows] == ["0", "1", "2"]
        assert app.status_bar.state == "connected"
        assert app.requests_pane.snapshot is app.last
        assert app.cache_gauges.snapshot is app.last
        assert len(app.rates.gen_tps) >= 2  # throughput history fills
        pane = app.requests_pane.text()
        assert re.search(r"^processing +\d+$", pane, re.M) and re.search(r"^experts computed +\d+$", pane, re.M)


PANES = (StatusBar, SlotTable, CacheGauges, Throughput, RequestsPane, KeyBar)


def fed(n_slots=3, steps=13, **kw):
    """A dashboard fed `steps` fake snapshots directly (no polling): fixed numbers."""
    src = FakeSource(n_slots=n_slots)
    app = Dashboard(src, interval=1.0, log_level=None, autopoll=False, clock=lambda: src.t0, **kw)

    async def feed(pilot):
        for i in range(steps):
            app.show(src.snapshot(i))
        await pilot.pause()

    return app, feed


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_every_pane_is_whole_on_screen(size):
    """At 80x24 and up every pane fits the screen, is tall enough for its lines, and no
    line is wider than its pane (so nothing is cut, mid-word or otherwise)."""
    app, feed = fed()
    async with app.run_test(size=size) as pilot:
        await feed(pilot)
        screen = app.screen.region
        for pane in PANES:
            for w in app.query(pane):
                if not w.display:
                    continue
                assert screen.contains_region(w.region), (pane.__name__, w.region, screen)
                lines = w.lines(w.size.width)
                assert w.size.height >= len(lines), (pane.__name__, w.size, len(lines))
                assert max(len(l.plain) for l in lines) <= w.size.width, (pane.__name__, w.size)
        log = app.event_log
        assert screen.contains_region(log.region) and log.size.height >= 1
        assert app.requests_pane.display == (size[0] >= 100)  # 80 columns: its essentials move


async def test_80x24_shows_every_panes_essentials():
    app, feed = fed(n_slots=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot)
        slots = app.slot_table.text().splitlines()
        assert slots[0].split() == ["slot", "state", "prompt", "cached", "from", "gen", "ctx", "ckpt", "t/s"]
        assert len(slots) == 5  # header + 4 slots
        cache = app.cache_gauges.text()
        for needle in ("KV ", "/ 16.4k tok", "cache", "6.0 MiB / 8.0 MiB", "hits  slot 96%", "RAM 92%",
                       "ckpt 67%", "ckpt  made 12  restored 6"):
            assert needle in cache, (needle, cache)
        tps = app.throughput.text()
        assert re.search(r"^gen +\d+\.\d t/s", tps, re.M) and re.search(r"^prompt +\d+ t/s", tps, re.M)
        assert re.search(r"^queue +0 queued  \d/4 busy  36 done", tps, re.M)
        assert "(last 10 s)" in app.throughput.border_title
        keys = app.query_one(KeyBar).text()
        assert keys.startswith("q quit  ? help  s screenshot")


async def test_more_slots_than_rows_say_how_many_are_left_out():
    app, feed = fed(n_slots=8)
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot)
        lines = app.slot_table.text().splitlines()
        assert len(lines) == 1 + 6 + 1 and lines[-1] == "+2 more slots (slot order; o sorts)"
        assert app.slot_table.size.height == len(lines)
        await pilot.press("o")  # busy ones first: the ones left out are idle
        assert all("idle" not in line for line in app.slot_table.text().splitlines()[1:4])
        await pilot.resize_terminal(80, 40)
        await pilot.pause()
        assert len(app.slot_table.text().splitlines()) == 1 + 8  # room for all of them now


async def test_wider_terminals_add_columns_and_details():
    app, feed = fed()
    async with app.run_test(size=(200, 50)) as pilot:
        await feed(pilot)
        assert app.slot_table.text().splitlines()[0].split()[:3] == ["slot", "task", "state"]
        assert "prompt t/s" in app.slot_table.text() and "mem" in app.slot_table.text()
        cache = app.cache_gauges.text()
        for needle in ("KV cache", "prompt cache", "12 entries", "hit rate", "slot 96% (24/25)",
                       "checkpoints  made 12  restored 6  re-prefills 3", "failures", "idle drops 0"):
            assert needle in cache, (needle, cache)
        assert "tokens over the last 10 s" in app.throughput.text()
        assert "while busy" in app.throughput.text()


async def test_pause_stops_polling_and_resume_restarts_it():
    src = FakeSource()
    app = Dashboard(src, interval=0.05, log_level=None)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: src.calls >= 2, pilot)
        await pilot.press("p")
        assert app.paused and app.status_bar.paused
        assert "PAUSED" in app.status_bar.text()
        await pilot.pause(0.1)  # a fetch in flight may still land
        n = src.calls
        await pilot.pause(0.4)
        assert src.calls == n
        await pilot.press("p")
        assert await wait_until(lambda: src.calls > n + 1, pilot)


async def test_connection_lost_is_state_not_exception():
    src = FakeSource(fail=lambda step: step >= 2)
    app = Dashboard(src, interval=0.05, log_level=None)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: src.calls >= 6, pilot)
        await pilot.pause()
        assert app.status_bar.state == "lost" and app.has_class("-lost")
        assert "LOST" in app.status_bar.text() and "fake connection refused" in app.status_bar.text()
        assert len(app.slot_table.slots) == 2  # last values stay on screen
        lines = [str(line.text) for line in app.event_log.lines]
        assert sum("connection lost" in l for l in lines) == 1
    assert app.return_code in (0, None)


async def test_keys_interval_help_clear():
    app = Dashboard(FakeSource(), interval=1.0, log_level=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus")
        assert app.poll_interval == 2.0 and app.status_bar.interval == 2.0
        await pilot.press("minus", "minus")
        assert app.poll_interval == 0.5
        assert app.event_log.lines
        await pilot.press("p")  # no poll may write between the clear and the check
        await pilot.pause(0.1)
        await pilot.press("c")
        await pilot.pause()
        assert not app.event_log.lines
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_help_lists_every_key_and_is_visible(size):
    app = Dashboard(FakeSource(), interval=1.0, log_level=None)
    async with app.run_test(size=size) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one("#help-box")
        assert box.region.width >= 40 and box.region.height >= 10  # it once measured 0x0
        assert app.screen.region.contains_region(box.region)
        text = app.screen.query_one("#help-text").render().plain
        for b in [*app.BINDINGS, *HelpScreen.BINDINGS]:
            from llmcore.tui.widgets.help_screen import key_label

            assert re.search(rf"^  {re.escape(key_label(b.key))} +{re.escape(b.description)}$", text, re.M), b
        for c in F.SLOT_COLUMNS.values():  # and the legend of the slot table
            assert c.header in text and c.legend in text
        await pilot.press("question_mark")  # ? closes it again
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark", "escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_ctrl_c_quits_like_q_and_stops_the_owned_server():
    stopped = []

    async def stop():
        stopped.append(True)

    async def start():
        pass

    app = Dashboard(FakeSource(), interval=0.05, log_level=None, startup=start, shutdown=stop, owns_server=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.1)
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 0 and stopped == [True]


async def test_owned_server_whose_model_failed_exits_with_the_reason():
    app = Dashboard(FakeSource(), interval=10, log_level=None, owns_server=True, autopoll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        app.show(Snapshot(time=1.0, stats={"status": "error", "error": "not a GGUF file", "model": "x.gguf"}))
        await pilot.pause()
    assert app.return_code == 1


@pytest.mark.parametrize("where", ["cwd", "xdg"])
async def test_screenshot_key_saves_an_svg(where, tmp_path, monkeypatch):
    pics = tmp_path / "Pictures"
    pics.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("XDG_PICTURES_DIR", raising=False)
    if where == "xdg":
        monkeypatch.setenv("XDG_PICTURES_DIR", str(pics))
    app, feed = fed()
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(pilot)
        await pilot.press("s")
        await pilot.pause()
    [saved] = app.screenshots
    assert saved.parent == (pics if where == "xdg" else work) and saved.suffix == ".svg"
    svg = saved.read_text()
    assert svg.lstrip().startswith("<svg") and "fake-model.gguf" in svg


async def test_sort_key_orders_the_slots():
    app, feed = fed(n_slots=3, steps=2)  # step 1: slot 0 prefill, 1 decode, 2 idle
    async with app.run_test(size=(120, 40)) as pilot:
        await feed(pilot)
        ids = lambda: [r[0] for r in app.slot_table.row_texts()]  # noqa: E731
        assert ids() == ["0", "1", "2"] and "by slot" in app.slot_table.border_title
        await pilot.press("o")
        assert app.slot_table.sort_key == "state" and ids() == ["0", "1", "2"]
        assert "by state" in app.slot_table.border_title
        await pilot.press("o")
        assert app.slot_table.sort_key == "tokens" and ids() == ["2", "1", "0"]
        shown = [line.split()[0] for line in app.slot_table.text().splitlines()[1:]]
        assert shown == ["2", "1", "0"]


async def test_log_records_reach_the_event_log():
    import logging

    app = Dashboard(FakeSource(), interval=10, log_level=logging.WARNING)
    async with app.run_test(size=SIZE) as pilot:
        logging.getLogger("llmcore.cache").warning("save failed, served as a miss")
        logging.getLogger("llmcore.access").warning("POST /v1/completions 200  in 5  out 3  0.10 s")
        await pilot.pause(0.05)
        lines = [str(line.text) for line in app.event_log.lines]
        assert any("cache: save failed, served as a miss" in l and "WARNING" in l for l in lines)
        assert any(re.search(r" WARNING +POST /v1/completions 200  in 5  out 3  0.10 s *$", l) for l in lines)
        logging.getLogger("llmcore.engine").warning("slot %d task %d eos: said by the access line", 0, 1)
        await pilot.pause(0.05)
        assert not any("said by the access line" in str(line.text) for line in app.event_log.lines)
    assert app._log_bridge is None  # handler removed on exit


async def test_startup_failure_exits_with_message():
    async def boom():
        raise OSError("address already in use")

    app = Dashboard(FakeSource(), startup=boom, log_level=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
    assert app.return_code == 1


# ---- headless modes and the CLI -----------------------------------------------------------------
async def test_once_and_headless_output():
    out = io.StringIO()
    assert await once(FakeSource(), fmt="text", out=out) == 0
    text = out.getvalue()
    assert "fake-model.gguf" in text and "prompt cache: 1.0 MiB / 8.0 MiB (12%)" in text
    assert "KV cache: 192 / 8,192 tok (2%)  slots 12.0 MiB of 512.0 MiB" in text
    assert "hit rate: slot 0% (0/1)  RAM 0% (0/1)  ckpt - (0/0)" in text
    out, err = io.StringIO(), io.StringIO()
    assert await once(FakeSource(fail={0}), fmt="text", out=out, err=err) == 1
    assert out.getvalue() == "" and err.getvalue().count("\n") == 1
    assert err.getvalue().startswith("error: no llmcore server answers at fake (fake connection refused)")
    out = io.StringIO()
    assert await headless(FakeSource(), interval=0.0, fmt="json", out=out, count=3) == 0
    lines = [json.loads(l) for l in out.getvalue().splitlines()]
    assert [d["stats"]["requests_total"] for d in lines] == [0, 3, 6]
    assert all(d["connected"] for d in lines)
    out = io.StringIO()
    assert await headless(FakeSource(), interval=0.0, fmt="text", out=out, count=3) == 0
    assert "throughput: gen" in out.getvalue() and "t/s over 1 s" in out.getvalue()


def test_cli_tui_once_json_and_options_match_serve():
    import typer.main
    from typer.testing import CliRunner

    from llmcore.cli import app

    r = CliRunner().invoke(app, ["tui", "--mock", "--once", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output.strip().splitlines()[-1])
    assert d["connected"] and d["stats"]["model"] == "fake-model.gguf" and len(d["slots"]) == 4
    cmd = typer.main.get_command(app)
    opts = {name: {o for p in c.params for o in p.opts} for name, c in cmd.commands.items()}
    assert opts["serve"] <= opts["tui"], opts["serve"] - opts["tui"]  # same server flags as serve


async def test_http_source_connection_refused_is_a_snapshot():
    src = HttpSource("127.0.0.1:9", timeout=1.0)
    snap = await src.fetch()
    await src.close()
    assert not snap.connected and snap.error


async def test_engine_source_reports_load_failure():
    eng = Engine(EngineConfig(), loader=lambda: (_ for _ in ()).throw(RuntimeError("bad file")))
    eng.start()
    eng.wait_ready(5)
    snap = await EngineSource(eng).fetch()
    eng.stop()
    assert snap.connected and snap.get("status") == "error" and "bad file" in snap.get("error")


def test_panels_draw_lines_no_wider_than_asked():
    """Every pane's lines, at every width from 20 to 200 columns, fit that width."""
    src = FakeSource(n_slots=4)
    snap = src.snapshot(9)
    hist = H.History()
    for i in range(10):
        hist.add(src.snapshot(i))
    panes = [CacheGauges(), RequestsPane(), SlotTable(), StatusBar("http://127.0.0.1:8080")]
    panes[0].snapshot = panes[1].snapshot = snap
    panes[2].slots = list(snap.slots)
    panes[3].snapshot = snap
    for p in panes:
        assert isinstance(p, Panel)
        for width in range(20, 201, 7):
            for line in p.lines(width):
                assert len(line.plain) <= width or isinstance(p, SlotTable) and width < 36, (type(p), width)


def test_log_event_keeps_wall_clock_time():
    # textual.Message sets its own monotonic `time`; the record's wall-clock time must survive
    from llmcore.tui.messages import LogEvent

    ev = LogEvent("info", "x", 1_700_000_000.0)
    assert ev.when == 1_700_000_000.0
