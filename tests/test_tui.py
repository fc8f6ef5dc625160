"""Dashboard tests: snapshot logic without Textual, the App under Pilot with a fake source
(deterministic stats), headless modes, the CLI, and one run against a real in-process
server on a tiny GGUF model."""
import asyncio
import io
import json
import re

from fakes import FakeChatTemplate, FakeModel, FakeTokenizer
from rich.console import Console

from llmcore.engine import Engine, EngineConfig
from llmcore.metrics import METRICS, EngineStats, SlotStats, to_prometheus
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app
from llmcore.tui import formatting as F
from llmcore.tui import history as H
from llmcore.tui import parsing as P
from llmcore.tui.snapshot import Snapshot
from llmcore.tui.app import Dashboard
from llmcore.tui.run import InProcessServer, headless, once
from llmcore.tui.source import EngineSource, FakeSource, HttpSource
from llmcore.tui.widgets import HelpScreen

SIZE = (140, 45)


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
    assert via_http.get("model") == "/m/fake.gguf" and via_http.get("status") == "ok"


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
    snap = Snapshot(time=0.0, stats={"cache_ram_bytes": 2**20, "kv_used_bytes": 5, "requests_total": 2},
                    model_stats={"experts_skipped": 7})
    assert F.cache_numbers(snap) == {"cache_ram_bytes": 2**20, "kv_used_bytes": 5}
    assert "model: experts_skipped 7" in F.to_text(snap).splitlines()


def test_missing_fields_render_as_dash():
    snap = Snapshot(time=0.0, stats={}, slots=({"id": 0},))
    assert F.slot_row(snap.slots[0])[1:] == ("-",) * (len(F.SLOT_COLUMNS) - 1)
    text = F.to_text(snap)
    assert "requests: processing -  queued -" in text and "KV memory: - / -" in text
    assert P.from_http(None, None, None).stats == {}  # nothing answered: empty, not an error


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
    assert h.prompt_tps[-1] == 0.0  # a restarted server never gives a negative rate


def test_gauges_and_levels():
    assert F.gauge_text("RAM cache", 2**20, -1, "bytes") == ("1.0 MiB / no limit", None)
    assert F.gauge_text("RAM cache", 0, 0, "bytes") == ("0 B / off", None)
    text, frac = F.gauge_text("KV memory", 95, 100, "n")
    assert text == "95 / 100 (95%)" and frac == 0.95
    assert [F.level(x) for x in (None, 0.5, 0.85, 0.95)] == ["unknown", "green", "yellow", "red"]
    cache = {"slot_hits": 3, "slot_misses": 1, "ram_hits": 2, "ram_misses": 0, "x_evictions": 1}
    assert F.hit_table(cache) == [("slot reuse", 3, 1), ("RAM cache", 2, 0)]


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
        assert app.cache_gauges.cache["cache_ram_limit_bytes"] == 2**23
        assert len(app.rates.gen_tps) >= 2  # throughput history fills
        console = Console(width=60, record=True, file=io.StringIO())
        console.print(app.requests_pane.content)
        pane = console.export_text()
        assert re.search(r"^processing +\d+$", pane, re.M) and re.search(r"^experts computed +\d+$", pane, re.M)


async def test_pause_stops_polling_and_resume_restarts_it():
    src = FakeSource()
    app = Dashboard(src, interval=0.05, log_level=None)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: src.calls >= 2, pilot)
        await pilot.press("p")
        assert app.paused and app.status_bar.paused
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
        assert "LOST" in str(app.status_bar.render()) and "fake connection refused" in str(app.status_bar.render())
        assert app.slot_table.row_count == 2  # last values stay on screen
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
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        assert app.event_log.lines
        await pilot.press("p")  # no poll may write between the clear and the check
        await pilot.pause(0.1)
        await pilot.press("c")
        await pilot.pause()
        assert not app.event_log.lines
        await pilot.press("q")
    assert app.return_code == 0


async def test_log_records_reach_the_event_log():
    import logging

    app = Dashboard(FakeSource(), interval=10, log_level=logging.WARNING)
    async with app.run_test(size=SIZE) as pilot:
        logging.getLogger("llmcore.cache").warning("save failed, served as a miss")
        await pilot.pause(0.05)
        lines = [str(line.text) for line in app.event_log.lines]
        assert any("llmcore.cache: save failed, served as a miss" in l and "WARNING" in l for l in lines)
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
    assert "fake-model.gguf" in out.getvalue() and "RAM cache: 1.0 MiB / 8.0 MiB" in out.getvalue()
    out = io.StringIO()
    assert await once(FakeSource(fail={0}), fmt="text", out=out) == 1
    assert "connection lost" in out.getvalue()
    out = io.StringIO()
    assert await headless(FakeSource(), interval=0.0, fmt="json", out=out, count=3) == 0
    lines = [json.loads(l) for l in out.getvalue().splitlines()]
    assert [d["stats"]["requests_total"] for d in lines] == [0, 3, 6]
    assert all(d["connected"] for d in lines)


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


# ---- a real in-process server on a tiny model ----------------------------------------------------
async def test_real_server_on_tiny_model_updates_slot_rows(tiny_models):
    import aiohttp

    from llmcore.models import load_model

    eng = Engine(EngineConfig(n_ctx=256, n_parallel=2, sampling=SamplingParams(temperature=0.0)),
                 model=load_model(tiny_models["llama-f32"]), tokenizer=FakeTokenizer(),
                 info={"name": "tiny", "path": str(tiny_models["llama-f32"])})
    server = InProcessServer(eng, ServerConfig(host="127.0.0.1", port=0))
    source = None

    async def start():
        nonlocal source
        await server.start()
        source = HttpSource(server.url)  # the dashboard polls the server over HTTP
        app.stats_source = source

    app = Dashboard(FakeSource(), interval=0.05, startup=start, shutdown=server.stop, log_level=None)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: app.last is not None and app.last.connected and app.last.slots, pilot)
        assert [r[1] for r in app.slot_table.row_texts()] == ["idle", "idle"]
        async with aiohttp.ClientSession() as http:
            async with http.post(server.url + "/completion",
                                 json={"prompt": [1, 40, 41, 42, 43], "n_predict": 6, "ignore_eos": True,
                                       "temperature": 0, "id_slot": 1}) as r:
                body = await r.json()
                assert r.status == 200, body
        assert body["tokens_predicted"] == 6

        def done():
            s = app.last
            return s is not None and s.connected and s.get("requests_total") == 1
        assert await wait_until(done, pilot)
        await pilot.pause()
        rows = {r[0]: r for r in app.slot_table.row_texts()}
        col = F.SLOT_COLUMNS.index
        assert rows["1"][col("generated")] == "6"
        assert rows["1"][col("prompt cached/done/all")].endswith("/5")
        assert rows["0"][col("generated")] == "0"
        assert app.last.get("tokens_predicted_total") == 6
        assert app.requests_pane.snapshot.get("requests_total") == 1
    assert server.runner is None  # stopped with the app


def test_log_event_keeps_wall_clock_time():
    # textual.Message sets its own monotonic `time`; the record's wall-clock time must survive
    from llmcore.tui.messages import LogEvent

    ev = LogEvent("info", "x", 1_700_000_000.0)
    assert ev.when == 1_700_000_000.0
