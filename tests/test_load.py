"""Load test in reduced form (the full one is bench/serve_load.py).

1. The load driver against an in-process server with the fake model: concurrent streamed
   chat requests, returning conversations, malformed JSON, an oversized prompt and a
   client that leaves mid-stream; every stream validated; the server keeps serving.
2. The same driver against `llmcore serve` as a subprocess on SmolLM2 with -np 4 and
   q4_0 KV: 12 concurrent clients, short prompts and outputs, RSS sampled.
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from fakes import FakeChatTemplate, FakeModel, FakeTokenizer
from llmcore.engine import Engine, EngineConfig
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import serve_load  # noqa: E402
from serve_load import ServerProcess, announced_memory, format_report, run_load  # noqa: E402


def fake_app(np_: int = 3):
    eng = Engine(EngineConfig(n_parallel=np_, sampling=SamplingParams(temperature=0.0)),
                 model=FakeModel(n_ctx_train=512, delay=0.005), tokenizer=FakeTokenizer(),
                 chat_template=FakeChatTemplate(), info={"name": "fake", "path": "/m/fake.gguf"})
    return create_app(eng, ServerConfig(keepalive_s=0.05))


async def test_load_driver_fake_server(aiohttp_server):
    server = await aiohttp_server(fake_app())
    base = str(server.make_url("")).rstrip("/")
    eng = server.app[serve_load_engine_key()]
    rep = await asyncio.wait_for(
        run_load(base, n_clients=10, prompt_tokens=(60, 120), gen_tokens=(3, 8), seed=1), 60)
    text = format_report(rep)
    assert rep.passed, text
    # 10 clients, the multi-turn ones came back for a second turn
    n_multi = rep.by_kind.get("multi", {}).get("n", 0)
    assert rep.requests == 10 + rep.by_kind.get("return", {}).get("n", 0)
    assert rep.by_kind.get("return", {}).get("n", 0) == n_multi > 0
    assert {c.name.split(" ->")[0] for c in rep.checks} >= {"malformed JSON", "client disconnects mid-stream"}
    assert any("longer than the context" in c.name for c in rep.checks)
    # the token counts reported by the streams are the engine's own
    st = eng.stats()
    assert st.tokens_predicted_total >= rep.completion_tokens
    assert st.requests_cancelled >= 1
    assert rep.ttft_p50 is not None and rep.ttft_p50 <= rep.ttft_max


def serve_load_engine_key():
    from llmcore.server.keys import ENGINE

    return ENGINE


async def test_stream_checks_catch_a_broken_stream(aiohttp_server):
    """The validator must fail a stream that lacks [DONE]/usage, not just pass everything."""
    from aiohttp import web

    async def broken(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
        await resp.write(b'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n\n')
        return resp

    async def garbage(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: {not json\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", broken)
    app.router.add_post("/g/v1/chat/completions", garbage)
    server = await aiohttp_server(app)
    base = str(server.make_url("")).rstrip("/")
    import aiohttp

    async with aiohttp.ClientSession() as s:
        r = await serve_load.stream_chat(s, base, [{"role": "user", "content": "x"}], 1)
        assert not r.ok and "no [DONE]" in r.error and "no usage" in r.error
        r = await serve_load.stream_chat(s, base + "/g", [{"role": "user", "content": "x"}], 1)
        assert not r.ok and "unparsable" in r.error


def test_announced_memory_parsing():
    assert announced_memory({"memory": {"budget_bytes": 123456789}}) == (123456789, "/props memory.budget_bytes")
    b, src = announced_memory({}, "INFO llmcore.engine: memory budget: 1.5 GiB (KV pool + RAM cache)\n")
    assert b == int(1.5 * 2**30) and src.startswith("log")
    assert announced_memory({"n_ctx": 4096}, "INFO model loaded (n_ctx 4096, 4 slots)") is None
    plan = {"cache": {"memory": {"kv_max_bytes": 1000, "checkpoints_max_bytes": 24, "host_total_bytes": 9}}}
    assert announced_memory(plan)[0] == 1024


@pytest.mark.realmodel
def test_load_smollm2_subprocess(smollm2_path, tmp_path):
    """`llmcore serve` on SmolLM2, -np 4, q4_0 KV, all caches on: 12 concurrent clients."""
    srv = ServerProcess(["-m", str(smollm2_path), "-np", "4", "-c", "8192", "-ctk", "q4_0", "-ctv", "q4_0",
                         "-n", "64"], log_path=tmp_path / "serve.log")
    with srv:
        rep = asyncio.run(asyncio.wait_for(
            run_load(srv.url, n_clients=12, prompt_tokens=(48, 96), gen_tokens=(4, 8), seed=3,
                     pid=srv.proc.pid, log_text=srv.log_text, alive=srv.alive, request_timeout=120), 150))
        alive = srv.alive()
    text = format_report(rep) + "\n--- server log tail ---\n" + srv.log_text()[-2000:]
    assert rep.passed, text
    assert alive
    assert rep.rss_peak is not None and rep.rss_peak >= rep.rss_start > 0
    # the shared system prompt was reused across requests (slot prefix or RAM cache)
    shared = [k for k in ("shared", "multi", "return") if k in rep.by_kind]
    assert sum(rep.by_kind[k]["cached"] for k in shared) > 0, text
