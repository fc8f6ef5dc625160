"""Tool-call / reasoning parsers (llmcore.toolcalls) and the server's big-prompt handling."""
import asyncio
import time

import pytest

from fakes import FakeChatTemplate, FakeModel, FakeTokenizer
from llmcore.engine import Engine, EngineConfig
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app


def make_app(model=None, n_ctx=0, np_=1):
    ecfg = EngineConfig(n_parallel=np_, n_ctx=n_ctx, sampling=SamplingParams(temperature=0.0))
    eng = Engine(ecfg, model=model or FakeModel(), tokenizer=FakeTokenizer(),
                 chat_template=FakeChatTemplate(), info={"name": "fake", "path": "/m/fake.gguf"})
    return create_app(eng, ServerConfig(keepalive_s=0.05))


# ---- step 1: large prompts ---------------------------------------------------------------

async def test_huge_text_prompt_rejected_early(aiohttp_client):
    client = await aiohttp_client(make_app())
    big = "x" * (4 * 1024 * 1024)  # >> 256-token context even at 5 bytes per token
    t0 = time.perf_counter()
    r = await client.post("/v1/completions", json={"prompt": big, "max_tokens": 1})
    assert r.status == 400
    err = (await r.json())["error"]
    assert "exceeds the available context size" in err["message"]
    assert err["n_ctx"] == 256 and err["n_prompt_tokens"] >= 4 * 1024 * 1024 // 5
    r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": big}]})
    assert r.status == 400 and "maximum context length" in (await r.json())["error"]["message"]
    r = await client.post("/completion", json={"prompt": big})
    assert r.status == 400
    assert time.perf_counter() - t0 < 10


async def test_big_prompt_tokenized_off_the_loop(aiohttp_client, monkeypatch):
    """A large prompt that fits the lower bound is tokenized in a worker thread: the event
    loop keeps answering (a /health request completes while tokenization is stalled)."""
    import threading

    client = await aiohttp_client(make_app(n_ctx=1 << 20))
    from llmcore.server import params as P

    seen = {}
    orig = P.tokenize_prompt

    def slow_tokenize(eng, prompt, field="prompt"):
        seen["thread"] = threading.current_thread() is not threading.main_thread()
        time.sleep(0.5)
        return [1, 3 + ord("a")]

    monkeypatch.setattr(P, "tokenize_prompt", slow_tokenize)
    from llmcore.server.handlers import openai as O
    monkeypatch.setattr(O, "tokenize_prompt", slow_tokenize)
    gen = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "y" * 100_000, "max_tokens": 2}))
    await asyncio.sleep(0.1)
    t0 = time.perf_counter()
    r = await client.get("/health")
    assert r.status == 200
    assert time.perf_counter() - t0 < 0.3  # not stuck behind the 0.5 s tokenization
    r = await gen
    assert r.status == 200 and (await r.json())["choices"][0]["text"] == "bc"
    assert seen["thread"] and orig is not None
