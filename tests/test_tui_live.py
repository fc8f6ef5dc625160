"""The dashboard beside a real server on tiny models, with requests sent over HTTP while
the test runs: the slot table, the cache gauges and (on a sliding-window model) the
checkpoint counters move as the engine works.

Tiny llama (fixtures.py) behind the in-process server, polled over HTTP (`llmcore tui
--url`); tiny gemma3 (interleaved sliding window, window 8) polled in-process
(`llmcore tui`, EngineSource)."""
import aiohttp
import pytest
from fakes import FakeTokenizer
from fixtures import tiny_models  # noqa: F401

from llmcore.engine import Engine, EngineConfig
from llmcore.models import load_model
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig
from llmcore.tui import formatting as F
from llmcore.tui.app import Dashboard
from llmcore.tui.run import InProcessServer
from llmcore.tui.source import EngineSource, FakeSource, HttpSource

from fixtures import build_gemma3

SIZE = (120, 40)


async def wait_until(pred, pilot, timeout=20.0):
    for _ in range(int(timeout / 0.02)):
        if pred():
            return True
        await pilot.pause(0.02)
    return pred()


async def complete(http, url, prompt, n_predict=4, **kw):
    body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "temperature": 0, **kw}
    async with http.post(url + "/completion", json=body) as r:
        out = await r.json()
        assert r.status == 200, out
        return out


def cell(app, slot, column):
    rows = {r[0]: r for r in app.slot_table.row_texts()}
    return rows[str(slot)][F.ALL_SLOT_COLUMNS.index(column)]


def done(app, n):
    s = app.last
    return s is not None and s.connected and s.get("requests_total") == n


async def test_requests_move_the_slot_table_and_cache_gauges(tiny_models):
    eng = Engine(EngineConfig(n_ctx=256, n_parallel=2, sampling=SamplingParams(temperature=0.0)),
                 model=load_model(tiny_models["llama-f32"]), tokenizer=FakeTokenizer(),
                 info={"name": "tiny", "path": str(tiny_models["llama-f32"])})
    server = InProcessServer(eng, ServerConfig(host="127.0.0.1", port=0))

    async def start():
        await server.start()
        app.stats_source = HttpSource(server.url)  # the dashboard polls the server over HTTP

    app = Dashboard(FakeSource(), interval=0.05, startup=start, shutdown=server.stop, log_level=None)
    async with app.run_test(size=SIZE) as pilot:
        assert await wait_until(lambda: app.last is not None and app.last.connected and app.last.slots, pilot)
        assert [r[2] for r in app.slot_table.row_texts()] == ["idle", "idle"]
        kv0 = F.kv_gauge(app.last)
        assert kv0.used == 0 and kv0.budget == 256 and "0 / 256 tok" in app.cache_gauges.text()
        assert F.cache_gauge(app.last).used == 0
        a = [1, 40, 41, 42, 43, 44, 45, 46, 47]
        async with aiohttp.ClientSession() as http:
            body = await complete(http, server.url, a, n_predict=6, id_slot=1)
            assert body["tokens_predicted"] == 6
            assert await wait_until(lambda: done(app, 1), pilot)
            await pilot.pause()
            assert cell(app, 1, "gen") == "6" and cell(app, 1, "prompt") == "9/9"
            assert cell(app, 0, "gen") == "0"
            kv = F.kv_gauge(app.last)
            assert kv.used == 9 + 6 - 1 and f"{kv.used} / 256 tok" in app.cache_gauges.text()
            # another prompt on the same slot: the first one's state moves to the RAM cache
            await complete(http, server.url, [1, 90, 91, 92, 93, 94, 95, 96, 97, 98], id_slot=1)
            assert await wait_until(lambda: done(app, 2), pilot)
            await pilot.pause()
            cache = F.cache_gauge(app.last)
            assert cache.used > 0 and app.last.get("cache_ram_entries") == 1
            assert F.fmt_bytes(cache.used) in app.cache_gauges.text()
            # the first prompt again: served from the RAM cache, and the hit rate says so
            await complete(http, server.url, a + [50], id_slot=1)
            assert await wait_until(lambda: done(app, 3), pilot)
            await pilot.pause()
            assert cell(app, 1, "from") == "ram" and cell(app, 1, "cached") == "9"
            # misses for the first two (the cache was empty, then held the other prompt)
            assert "RAM 33% (1/3)" in app.cache_gauges.text()
        assert app.last.get("tokens_predicted_total") == 14
        assert app.requests_pane.snapshot.get("requests_total") == 3
    assert server.runner is None  # stopped with the app


@pytest.fixture(scope="module")
def tiny_swa(tmp_path_factory):
    return build_gemma3(tmp_path_factory.mktemp("tui_swa") / "tiny-gemma3.gguf")


async def test_requests_move_the_checkpoint_counters(tiny_swa):
    """A sliding-window model needs checkpoints to reuse a prefix beyond its window: the
    dashboard counts them as they are made and restored."""
    cfg = EngineConfig(n_ctx=512, n_parallel=1, n_ubatch=16, checkpoint_every_n_tokens=16, cache_ram_mib=0,
                       sampling=SamplingParams(temperature=0.0))
    eng = Engine(cfg, model=load_model(tiny_swa), tokenizer=FakeTokenizer(),
                 info={"name": "tiny-swa", "path": str(tiny_swa)})
    server = InProcessServer(eng, ServerConfig(host="127.0.0.1", port=0))
    app = Dashboard(EngineSource(eng), interval=0.05, startup=server.start, shutdown=server.stop,
                    log_level=None, owns_server=True)
    base = [1] + [3 + (7 * i) % 250 for i in range(79)]  # 80 tokens: 10 windows
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_until(lambda: app.last is not None and app.last.get("status") == "ok", pilot)
        assert "ckpt  made 0  restored 0" in app.cache_gauges.text()
        async with aiohttp.ClientSession() as http:
            await complete(http, server.url, base)
            assert await wait_until(lambda: done(app, 1), pilot)
            await pilot.pause()
            made = app.last.get("checkpoints_created")
            assert made >= 3 and f"made {made}  restored 0" in app.cache_gauges.text()
            assert int(cell(app, 0, "ckpt")) >= 3
            # a branch far behind the window: only a checkpoint saves re-reading it all
            await complete(http, server.url, base[:50] + [200, 201, 202, 203, 204])
            assert await wait_until(lambda: done(app, 2), pilot)
            await pilot.pause()
        assert app.last.get("checkpoints_restored") == 1 and app.last.get("forced_reprefills") == 0
        assert "restored 1" in app.cache_gauges.text() and "ckpt 100%" in app.cache_gauges.text()
        assert cell(app, 0, "from") == "ckpt"
    assert app.return_code in (0, None) and server.runner is None
