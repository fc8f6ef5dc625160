"""Replicas behind one front end (llmcore.cluster).

Without Ray: the engine interface both engines implement (and that the server uses no
more of), the router's prefix index and policy, the fleet's numbers (/metrics labels,
/slots, the dashboard's row groups), the pool's request checks and how a lost replica
reaches a client (503 + Retry-After, or an error event in a stream).

With Ray (skipped when `ray[serve]` is not installed): a local Ray instance runs two
replicas of a tiny model, one thread each, behind the real server on a loopback socket:
concurrent requests, a conversation that returns to the replica holding it, the fleet in
/metrics, /slots, /props and the dashboard, and a replica killed under load (its
requests end with a clear error, the others finish, Ray brings the fleet back to two).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import uuid
import warnings
from pathlib import Path

import aiohttp
import pytest
from fakes import FakeChatTemplate, FakeModel, FakeTokenizer
from live_server import LiveServer

from llmcore.cluster import ClusterConfig, ReplicaPool
from llmcore.cluster.fleet import DOWN, FleetView, aggregate, global_slot
from llmcore.cluster.prefix_index import PrefixIndex, block_hashes, rank_replicas
from llmcore.cluster.wire import ReplicaFacts, ReplicaReport
from llmcore.engine import Engine, EngineClient, EngineConfig, EngineStatus, ErrorEvent, GenParams, Task
from llmcore.errors import (ContextFullError, ReplicaLostError, ReplicaUnavailableError, RequestError,
                            ShuttingDownError)
from llmcore.metrics import EngineStats, SlotStats, parse_prometheus, slots_json, split_replica_label, to_prometheus
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app
from llmcore.server.keys import ENGINE
from llmcore.tui import formatting as F
from llmcore.tui import parsing as P
from llmcore.tui.widgets import SlotTable

GREEDY = SamplingParams(temperature=0.0)
SERVER = Path(__file__).resolve().parent.parent / "llmcore" / "server"


# ---- one interface, two engines --------------------------------------------------------------
def protocol_members() -> set[str]:
    names = set(EngineClient.__annotations__)
    names |= {k for k, v in vars(EngineClient).items() if not k.startswith("_") and callable(v) or isinstance(v, property)}
    return names


def test_engine_and_pool_are_engine_clients():
    local = Engine(EngineConfig(), model=FakeModel(), tokenizer=FakeTokenizer(), chat_template=FakeChatTemplate())
    pool = ReplicaPool("/nowhere/model.gguf", EngineConfig(n_parallel=3), ClusterConfig(replicas=2))
    for eng in (local, pool):
        assert isinstance(eng, EngineClient)
        for name in protocol_members():
            assert hasattr(eng, name), (type(eng).__name__, name)
    assert pool.cfg.n_parallel == 6 and pool.replica_cfg.n_parallel == 3  # the fleet's slots
    assert pool.replica_cfg.n_threads == 1  # one thread per replica by default


def test_the_server_uses_only_the_engine_interface():
    """Every attribute the routes, encoders and prompt builder read from an engine is a
    member of EngineClient, so a ReplicaPool serves wherever an Engine does."""
    used = set()
    for path in SERVER.rglob("*.py"):
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines()
                         if not line.lstrip().startswith(("from ", "import ")))
        used |= set(re.findall(r"(?<!llmcore\.)\b(?:eng|engine)\.([a-z_]+)", code))  # not llmcore.engine.x
    assert used - protocol_members() == set()
    assert {"submit", "stats", "tokenizer", "cfg", "require_ready"} <= used  # the scan sees them


# ---- the prefix index and the routing policy ---------------------------------------------------
def test_block_hashes_chain_on_the_prefix():
    a = block_hashes(list(range(40)), 8)
    b = block_hashes(list(range(36)) + [99, 98, 97, 96], 8)
    assert len(a) == 5 and a[:4] == b[:4] and a[4] != b[4]
    assert block_hashes([1, 2, 3], 8) == []  # a tail shorter than a block is not hashed
    c = block_hashes([7] * 8 + list(range(32)), 8)
    assert c[1] != a[0]  # a block's hash depends on the blocks before it


def test_prefix_index_matches_leading_blocks_and_drops_tails_first():
    idx = PrefixIndex(block_size=4, max_blocks_per_replica=6)
    conv = list(range(24))  # 6 blocks
    idx.insert("r0", idx.hashes(conv))
    assert idx.matched_blocks("r0", idx.hashes(conv + [50, 51, 52, 53])) == 6
    assert idx.matched_blocks("r1", idx.hashes(conv)) == 0
    other = [100 + i for i in range(8)]  # 2 new blocks: two of conv's go
    idx.insert("r0", idx.hashes(other))
    assert idx.size("r0") == 6
    assert idx.matched_blocks("r0", idx.hashes(conv)) == 4  # its head survives, the tail went
    assert idx.matched_blocks("r0", idx.hashes(other)) == 2
    idx.keep_only(["r1"])
    assert idx.size("r0") == 0


def test_rank_replicas_prefers_the_holder_within_the_imbalance():
    cands = ["a", "b", "c"]
    pick = dict(matched={"a": 0, "b": 5, "c": 1}, held={"a": 0, "b": 9, "c": 3}, n_prompt_blocks=6,
                imbalance=2, match_rate=0.1)
    assert rank_replicas(cands, {"a": 0, "b": 2, "c": 0}, **pick)[0] == ["b"]
    # the holder is busier than the shortest queue by more than the imbalance: spill over
    ranked = rank_replicas(cands, {"a": 0, "b": 3, "c": 1}, **pick)
    assert ranked[0] == ["c"]  # the best match among the balanced ones
    assert ranked[1] == ["a", "b"]  # then the rest by load
    # no prefix worth following: the shortest queue, the replica holding less first
    assert rank_replicas(cands, {"a": 1, "b": 1, "c": 1},
                         **{**pick, "matched": {"b": 0}})[0] == ["a"]
    assert rank_replicas(cands, {"a": 1, "b": 1, "c": 1},
                         **{**pick, "matched": {"b": 1}, "match_rate": 0.5})[0] == ["a"]  # 1/6 < 0.5


def test_rank_replicas_leaves_silent_replicas_to_the_last_group():
    ranked = rank_replicas(["a", "b"], {"a": None, "b": 4}, matched={"a": 9}, held={}, n_prompt_blocks=9,
                           imbalance=1, match_rate=0.1)
    assert ranked == [["b"], ["a", "b"]]
    assert rank_replicas(["a", "b"], {}, matched={}, held={}, n_prompt_blocks=1, imbalance=1,
                         match_rate=0.1) == [["a", "b"]]


# ---- the fleet's numbers -----------------------------------------------------------------------
def replica_stats(k: int, **kw) -> EngineStats:
    slots = (SlotStats(id=0, state="idle", n_ctx=64, n_tokens=k), SlotStats(id=1, state="decode", n_ctx=64,
                                                                           n_tokens=2 * k, task_id=k))
    return EngineStats(time=float(k), status="ok", model="m", n_ctx=128, n_ctx_slot=64, n_slots=2,
                       requests_total=10 * k, requests_processing=1, prompt_tokens_total=100 * k,
                       prompt_seconds_total=1.0 * k, n_tokens_max=5 * k, uptime_s=7.0 * k,
                       cache_ram_limit_bytes=2**20, checkpoints_budget_bytes=-1 if k == 2 else 64,
                       slots=slots, model_stats={"experts_computed": k}, **kw)


def test_aggregate_sums_replicas_and_renumbers_their_slots():
    a, b = replica_stats(1), replica_stats(2)
    st = aggregate([a, None, b], status="ok", model="m", n_slots=2)
    assert st.requests_total == 30 and st.requests_processing == 2 and st.n_slots == 4 and st.n_ctx == 256
    assert st.n_ctx_slot == 64 and st.n_tokens_max == 10 and st.uptime_s == 14.0  # not added up
    assert st.cache_ram_limit_bytes == 2**21 and st.checkpoints_budget_bytes == -1  # -1: no limit
    assert st.prompt_tokens_seconds == 100.0  # derived from the sums
    assert [(s.id, s.replica) for s in st.slots] == [(0, 0), (1, 0), (4, 2), (5, 2)]
    assert st.slots[3].task_id == 2 and global_slot(2, 1, 2) == 5
    assert st.model_stats == {"experts_computed": 3}
    assert [r.status for r in st.replicas] == ["ok", DOWN, "ok"] and st.engines_ready == 2
    assert [s["replica"] for s in slots_json(st)] == [0, 0, 2, 2]
    assert "replica" not in slots_json(a)[0]  # one engine's /slots keeps its shape


def test_prometheus_shows_the_fleet_and_each_replica():
    st = aggregate([replica_stats(1), replica_stats(2)], status="ok", model="m", n_slots=2)
    text = to_prometheus(st)
    parsed = parse_prometheus(text)
    assert parsed["llmcore:requests_total"] == 30
    assert parsed['llmcore:requests_total{replica="0"}'] == 10
    assert parsed['llmcore:requests_total{replica="1"}'] == 20
    assert parsed["llmcore:engines_ready"] == 2 and parsed['llmcore:engines_ready{replica="1"}'] == 1
    assert parsed['llmcore:model_experts_computed{replica="1"}'] == 2
    assert text.count("# TYPE llmcore:requests_total counter") == 1  # one family, labelled series
    assert split_replica_label('llmcore:requests_total{replica="12"}') == ("llmcore:requests_total", 12)
    assert split_replica_label('x{le="0.5"}') == ('x{le="0.5"}', None)
    assert "replica=" not in to_prometheus(replica_stats(1))  # one engine: as before


def test_dashboard_groups_slot_rows_by_replica():
    st = aggregate([replica_stats(1), None], status="ok", model="m", n_slots=2)
    for snap in (P.from_engine_stats(st), P.from_http(slots_json(st), to_prometheus(st), {})):
        assert [r["status"] for r in snap.replicas] == ["ok", "down"]
        assert snap.replicas[0]["requests_total"] == 10
        groups = F.slot_groups(snap.slots, snap.replicas)
        assert [g.header.split()[:3] for g in groups] == [["replica", "0", "ok"], ["replica", "1", "down"]]
        assert [len(g.slots) for g in groups] == [2, 0] and [g.ok for g in groups] == [True, False]
        text = F.to_text(snap)
        assert re.search(r"^replica 0  ok  processing 1  queued 0  done 10", text, re.M)
        assert re.search(r"^replica 1  down$", text, re.M)
    table = SlotTable()
    table.show(snap.slots, snap.replicas)
    lines = [t.plain for t in table.lines(120)]
    assert lines[1].startswith("replica 0") and lines[4] == "replica 1  down"
    one = P.from_engine_stats(replica_stats(1))
    assert one.replicas == () and F.slot_groups(one.slots)[0].header is None


def test_fleet_view_keeps_the_newest_report_and_marks_silence_down():
    fleet = FleetView(2)
    assert fleet.n_up == 0 and fleet.reports() == [None, None]
    fleet.update(ReplicaReport(0, 11, "n", "act0", replica_stats(3)))
    fleet.update(ReplicaReport(0, 11, "n", "act0", replica_stats(2)))  # older: ignored
    assert fleet.reports()[0].stats.time == 3.0 and fleet.n_up == 1
    fleet.update_stats(0, replica_stats(4))
    assert fleet.reports()[0].stats.time == 4.0 and fleet.rank_of_actor("act0") == 0
    fleet.mark_down(0)
    fleet.update_stats(0, replica_stats(5))  # a batch from a replica marked down does not revive it
    assert fleet.reports() == [None, None]
    fleet.update(ReplicaReport(0, 12, "n", "act1", replica_stats(1)))  # its replacement
    assert fleet.reports()[0].pid == 12 and fleet.rank_of_actor("act0") is None


# ---- the pool's checks and a lost replica, without Ray -------------------------------------------
def ready_pool(n_up: int = 2) -> ReplicaPool:
    """A pool that looks started (no Ray): facts set, `n_up` replicas reporting."""
    pool = ReplicaPool("/nowhere/fake.gguf", EngineConfig(n_parallel=2), ClusterConfig(replicas=2))
    pool.start = lambda: None
    pool.stop = lambda timeout=0: None
    pool.tokenizer, pool.chat_template = FakeTokenizer(), FakeChatTemplate()
    pool.facts = ReplicaFacts(n_ctx=256, n_ctx_slot=256, n_slots=2, n_vocab=FakeTokenizer.vocab_size,
                              n_ctx_train=256, needs_checkpoints=False, memory_plan={"kv_max_bytes": 10},
                              version="x")
    pool.n_ctx, pool.n_ctx_slot = 512, 256
    pool.info["n_vocab"] = FakeTokenizer.vocab_size
    pool.status = EngineStatus.READY
    for rank in range(n_up):
        pool.fleet.update(ReplicaReport(rank, 100 + rank, "n", f"a{rank}", replica_stats(1)))
    return pool


async def test_pool_checks_requests_before_any_replica_sees_them():
    pool = ready_pool()
    with pytest.raises(RequestError, match="id_slot"):
        pool.submit([1, 2, 3], GenParams(id_slot=0))
    with pytest.raises(ContextFullError):
        pool.submit(list(range(3, 300)), GenParams())
    with pytest.raises(RequestError, match="invalid token"):
        pool.submit([1, 10_000], GenParams())
    with pytest.raises(RequestError, match="empty"):
        pool.submit([], GenParams())
    assert pool.memory_plan == {"kv_max_bytes": 20}  # the fleet's budgets
    assert pool.stats().n_slots == 4 and pool.stats().engines_ready == 2


async def test_a_stopping_pool_refuses_new_requests_and_slot_files(aiohttp_client):
    pool = ready_pool()
    client = await aiohttp_client(create_app(pool, ServerConfig(keepalive_s=0.05)))
    r = await client.post("/slots/0?action=save", json={"filename": "a.bin"})
    assert r.status == 501 and "--replicas" in (await r.json())["error"]["message"]
    assert pool.n_active == 0
    pool.close_intake()  # the server's graceful shutdown
    with pytest.raises(ShuttingDownError):
        pool.submit([1, 2, 3], GenParams())
    r = await client.post("/completion", json={"prompt": "abc"})
    assert r.status == 503 and "shutting down" in (await r.json())["error"]["message"]


async def test_no_replica_up_is_503_with_retry_after(aiohttp_client):
    pool = ready_pool(n_up=0)
    with pytest.raises(ReplicaUnavailableError):
        pool.require_ready()
    client = await aiohttp_client(create_app(pool, ServerConfig(keepalive_s=0.05)))
    r = await client.post("/completion", json={"prompt": "abc"})
    assert r.status == 503 and r.headers["Retry-After"] == "5"
    assert "no replica" in (await r.json())["error"]["message"]
    r = await client.post("/v1/messages", json={"model": "m", "max_tokens": 4,
                                               "messages": [{"role": "user", "content": "hi"}]})
    assert r.status == 529 and r.headers["Retry-After"] == "5"  # Anthropic clients retry 529
    r = await client.get("/health")
    assert r.status == 503


class LosingEngine(Engine):
    """An engine whose every request ends as if its replica died (before any token)."""

    def submit(self, prompt, params=None, loop=None, sync=False):
        task = super().submit(prompt, params)
        task.cancel()
        lost = Task(task.prompt, task.params, asyncio.get_running_loop(), lambda: None)
        lost.put(ErrorEvent(ReplicaLostError("replica 1 stopped while running this request", 1, 3.0)))
        return lost


async def test_a_lost_replica_is_503_retry_after_or_an_error_event(aiohttp_client):
    eng = LosingEngine(EngineConfig(sampling=GREEDY), model=FakeModel(), tokenizer=FakeTokenizer(),
                       chat_template=FakeChatTemplate())
    client = await aiohttp_client(create_app(eng, ServerConfig(keepalive_s=0.05)))
    r = await client.post("/completion", json={"prompt": "abc"})
    assert r.status == 503 and r.headers["Retry-After"] == "3"
    assert "replica 1 stopped" in (await r.json())["error"]["message"]
    r = await client.post("/completion", json={"prompt": "abc", "stream": True})
    assert r.status == 200  # the stream had started: the error comes in-band
    frames = [json.loads(line[6:]) for line in (await r.text()).splitlines() if line.startswith("data: ")]
    assert frames[-1]["error"]["code"] == 503 and "replica 1" in frames[-1]["error"]["message"]


# ---- two replicas on a local Ray instance -------------------------------------------------------------
def has_ray_serve() -> bool:
    with warnings.catch_warnings():  # Ray's own deprecation warnings on import
        warnings.simplefilter("ignore")
        try:
            import ray.serve  # noqa: F401
        except ImportError:
            return False
    return True


_needs_ray = pytest.mark.skipif(not has_ray_serve(), reason="needs ray[serve] (pip install 'llmcore[cluster]')")


def needs_ray(test):
    """A test on the local Ray instance (marked `cluster`: -m 'not cluster' leaves them out)."""
    return pytest.mark.cluster(_needs_ray(test))


N_SLOTS = 2  # per replica


@pytest.fixture(scope="module")
def fleet(built_model):
    """Two replicas of the tiny chat model (one thread, two slots each) behind the server."""
    cfg = EngineConfig(n_parallel=N_SLOTS, n_ctx=8192, sampling=GREEDY)
    cluster = ClusterConfig(replicas=2, threads_per_replica=1, block_size=8, stats_interval_s=0.5,
                            health_check_period_s=1.0, retry_after_s=2.0, object_store_mib=80,
                            log_to_driver=False)
    pool = ReplicaPool(built_model("chat"), cfg, cluster)
    with LiveServer(pool, ServerConfig(keepalive_s=0.2)) as srv:
        if not pool.wait_ready(180):
            pytest.fail(f"the replicas did not start: {pool.load_error}")
        yield srv
    assert pool.status is EngineStatus.READY


async def get(url, path, as_json=True):
    async with aiohttp.ClientSession() as s, s.get(url + path) as r:
        assert r.status == 200, (path, r.status, await r.text())
        return await r.json() if as_json else await r.text()


async def chat(session, url, messages, stream=False, max_tokens=8):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        if not stream:
            return await r.json()
        frames = [line[6:] for line in (await r.text()).splitlines() if line.startswith("data: ")]
        assert frames[-1] == "[DONE]", frames[-3:]
        return [json.loads(f) for f in frames[:-1]]


def per_replica(metrics_text: str, name: str) -> dict[int, float]:
    out = {}
    for k, v in parse_prometheus(metrics_text).items():
        base, rep = split_replica_label(k)
        if base == name and rep is not None:
            out[rep] = v
    return out


@needs_ray
async def test_concurrent_requests_all_succeed(fleet):
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(*[
            chat(s, fleet.url, [{"role": "user", "content": f"question {i}: what colour is the sky at {i} o'clock?"}],
                 stream=i % 2 == 1) for i in range(8)])
    for i, res in enumerate(results):
        if i % 2:
            assert any(f["choices"] and f["choices"][0]["delta"].get("content") for f in res), res
        else:
            assert res["choices"][0]["message"]["content"] and res["usage"]["completion_tokens"] == 8
    done = per_replica(await get(fleet.url, "/metrics", False), "llmcore:requests_total")
    assert sorted(done) == [0, 1] and min(done.values()) >= 2, done  # both replicas took some


@needs_ray
async def test_a_returning_conversation_is_served_by_the_replica_holding_it(fleet):
    tag = uuid.uuid4().hex[:8]  # no replica has seen this conversation before
    history = [{"role": "user", "content": f"[{tag}] My name is Ada and I collect old maps of harbours."}]
    async with aiohttp.ClientSession() as s:
        first = await chat(s, fleet.url, history)
        n_first = first["usage"]["prompt_tokens"]
        # others run meanwhile, on both replicas, and take over the slots
        await asyncio.gather(*[chat(s, fleet.url, [{"role": "user", "content": f"Unrelated request {i} about "
                                                   f"{'trains boats planes'.split()[i % 3]} number {i}."}])
                               for i in range(8)])
        history += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "What do I collect?"}]
        second = await chat(s, fleet.url, history)
    # the whole first turn was reused: only the replica that ran it holds that
    assert second["timings"]["cache_n"] >= n_first, (second["timings"], n_first)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == second["timings"]["cache_n"]


@needs_ray
async def test_the_fleet_in_metrics_slots_props_and_the_dashboard(fleet):
    metrics = await get(fleet.url, "/metrics", False)
    parsed = parse_prometheus(metrics)
    assert parsed["llmcore:engines_ready"] == 2
    assert per_replica(metrics, "llmcore:slots_total") == {0: N_SLOTS, 1: N_SLOTS}
    assert parsed["llmcore:slots_total"] == 2 * N_SLOTS
    slots = await get(fleet.url, "/slots")
    assert [(s["id"], s["replica"]) for s in slots] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    props = await get(fleet.url, "/props")
    assert props["total_slots"] == 2 * N_SLOTS and props["status"] == "ok"
    assert [(r["replica"], r["status"], r["n_slots"]) for r in props["replicas"]] == [(0, "ok", 2), (1, "ok", 2)]
    assert (await get(fleet.url, "/health")) == {"status": "ok"}
    from llmcore.tui.source import HttpSource

    src = HttpSource(fleet.url)
    try:
        snap = await src.fetch()
    finally:
        await src.close()
    text = F.to_text(snap)
    assert re.search(r"^replica 0  ok", text, re.M) and re.search(r"^replica 1  ok", text, re.M), text
    assert snap.get("n_slots") == 4


@needs_ray
async def test_grammars_and_embeddings_reach_the_replicas(fleet):
    """A grammar travels as its text and is compiled again on the replica (its matcher is
    native); embeddings come back from the replica's engine."""
    async with aiohttp.ClientSession() as s:
        body = {"prompt": "Pick:", "n_predict": 12, "temperature": 0, "grammar": 'root ::= ("yes" | "no") "."'}
        async with s.post(fleet.url + "/completion", json=body) as r:
            out = await r.json()
            assert r.status == 200, out
        assert out["content"] in ("yes.", "no."), out
        async with s.post(fleet.url + "/v1/embeddings", json={"input": ["one text", "another text"]}) as r:
            emb = await r.json()
            assert r.status == 200, emb
    vecs = [d["embedding"] for d in emb["data"]]
    assert len(vecs) == 2 and len(vecs[0]) == 64 and vecs[0] != vecs[1]


@needs_ray
async def test_id_slot_is_refused(fleet):
    async with aiohttp.ClientSession() as s:
        async with s.post(fleet.url + "/completion", json={"prompt": "hello", "id_slot": 1}) as r:
            assert r.status == 400 and "id_slot" in (await r.json())["error"]["message"]


async def stream_completion(session, url, prompt, n_predict, out: dict):
    """A native streaming completion, followed in `out`: its first chunk's slot (once it
    started), how it ended and when."""
    out.update(slot=None, end=None, n=0, error="")
    body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "stream": True, "temperature": 0}
    async with session.post(url + "/completion", json=body) as r:
        out["status"] = r.status
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            frame = json.loads(line[6:])
            if "error" in frame:
                out["end"], out["error"] = "error", frame["error"]["message"]
                break
            if out["slot"] is None and frame.get("id_slot") is not None:
                out["slot"] = frame["id_slot"]
            if frame.get("stop"):
                out["end"], out["n"] = "done", frame["tokens_predicted"]
                break
    out["t_end"] = time.monotonic()
    return out


class LoopLag:
    """The longest the server's event loop was late for a 10 ms tick (nothing in it may
    wait on a replica)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.worst = 0.0
        self.running = True
        self.future = asyncio.run_coroutine_threadsafe(self._tick(), loop)

    async def _tick(self) -> None:
        while self.running:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.perf_counter() - t - 0.01)

    def stop(self) -> float:
        self.running = False
        self.future.result(5)
        return self.worst


@needs_ray
async def test_killing_a_replica_mid_load(fleet):
    """Last in this module: it takes a replica away (Ray brings it back)."""
    pool: ReplicaPool = fleet.app[ENGINE]
    victim = pool.replica_reports()[1]
    assert victim is not None
    lag = LoopLag(fleet._loop)
    long_n = 3000
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        # no two prompts share a block: the router spreads them by queue length
        openings = ["Once upon a time", "Dear diary, today", "The recipe starts with", "In the year 3000"]
        follow = [{} for _ in openings]
        streams = [asyncio.ensure_future(stream_completion(s, fleet.url, f"{o} {i}", long_n, follow[i]))
                   for i, o in enumerate(openings)]
        for _ in range(600):  # until each replica runs one of them
            if {f["slot"] // N_SLOTS for f in follow if f.get("slot") is not None and f["end"] is None} == {0, 1}:
                break
            await asyncio.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        t_kill = time.monotonic()

        async def short(i):
            body = {"prompt": f"After the crash {i}", "n_predict": 8, "ignore_eos": True, "temperature": 0}
            async with s.post(fleet.url + "/completion", json=body) as r:
                return r.status, r.headers.get("Retry-After"), await r.json()

        shorts = await asyncio.gather(*[short(i) for i in range(4)])
        t = time.perf_counter()  # the fleet's numbers do not wait for the lost replica
        await get(fleet.url, "/metrics", False)
        await get(fleet.url, "/slots")
        assert time.perf_counter() - t < 1.0
        ended = await asyncio.gather(*streams)
    for e in ended:  # what ran on replica 0, or waited there, finished; the rest failed clearly
        if e["end"] == "done":
            assert e["n"] == long_n and e["slot"] // N_SLOTS == 0 or e["t_end"] < t_kill, e
        else:
            assert e["end"] == "error" and "replica 1 stopped" in e["error"], e
            assert e["slot"] is None or e["slot"] // N_SLOTS == 1, e
    assert any(e["end"] == "done" and e["slot"] // N_SLOTS == 0 for e in ended), ended
    assert any(e["end"] == "error" and e["slot"] is not None for e in ended), ended  # one was mid-stream
    for status, retry_after, body in shorts:
        if status == 503:  # sent to the dead replica before the router knew
            assert retry_after == "2" and "replica" in body["error"]["message"], body
        else:
            assert status == 200 and body["tokens_predicted"] == 8, body
    assert sum(st == 200 for st, _, _ in shorts) >= 2  # new requests go around it
    # Ray replaces it: the same rank comes back as a new process
    for _ in range(240):
        rep = pool.replica_reports()[1]
        if rep is not None and rep.pid != victim.pid:
            break
        await asyncio.sleep(0.5)
    assert rep is not None and rep.pid != victim.pid, "replica 1 did not come back"
    assert time.monotonic() - t_kill < 120
    parsed = parse_prometheus(await get(fleet.url, "/metrics", False))
    assert parsed["llmcore:engines_ready"] == 2
    async with aiohttp.ClientSession() as s:
        again = await asyncio.gather(*[chat(s, fleet.url, [{"role": "user", "content": f"hello again {i}"}])
                                       for i in range(4)])
    assert all(a["usage"]["completion_tokens"] == 8 for a in again)
    assert lag.stop() < 1.0, "the server's event loop stalled"



# ---- the command line ---------------------------------------------------------------------------------
def test_replica_flags_make_the_cluster_config():
    import llmcore.cli as cli
    from llmcore.errors import LLMCoreError

    opts = cli.ServerOptions(replicas=3, threads=2, ray_address="auto", routing="power_of_two")
    c = opts.cluster_config()
    assert (c.replicas, c.threads_per_replica, c.ray_address, str(c.routing)) == (3, 2, "auto", "power_of_two")
    assert cli.ServerOptions(replicas=2).cluster_config().threads_per_replica >= 1  # -t 0: the CPUs split
    with pytest.raises(LLMCoreError, match="--routing"):
        cli.ServerOptions(replicas=2, routing="random").cluster_config()
    with pytest.raises(LLMCoreError, match="--replicas"):
        cli.ServerOptions(replicas=-1).cluster_config()
    assert isinstance(cli.ServerOptions().make_engine("/m.gguf", EngineConfig()), Engine)


@_needs_ray
def test_replicas_flag_makes_a_pool():
    import llmcore.cli as cli

    opts = cli.ServerOptions(replicas=2, threads=1, parallel=3)
    pool = opts.make_engine("/m.gguf", opts.engine_config())
    assert isinstance(pool, ReplicaPool) and pool.cluster.replicas == 2 and pool.cfg.n_parallel == 6
    assert pool.status is EngineStatus.LOADING  # not started: nothing runs yet


def test_a_replica_that_cannot_start_says_why():
    from types import SimpleNamespace

    from llmcore.cluster.pool import DEPLOYMENT, _why_replicas_failed

    msg = ("The deployment failed to start 3 times in a row.\nTraceback (most recent call last):\n"
           '  File "replica.py", line 50, in __init__\n    raise ModelLoadError(...)\n'
           "llmcore.errors.ModelLoadError: /m.gguf: no such file on node 10.1.2.3 (every node ...)\n")
    dep = SimpleNamespace(message=msg)
    serve = SimpleNamespace(status=lambda: SimpleNamespace(applications={
        "llmcore": SimpleNamespace(deployments={DEPLOYMENT: dep})}))
    assert _why_replicas_failed(serve, "llmcore").startswith("llmcore.errors.ModelLoadError: /m.gguf: no such file")
    dep.message = "no CPUs free"
    assert _why_replicas_failed(serve, "llmcore") == "no CPUs free"
    assert _why_replicas_failed(serve, "other") == ""
