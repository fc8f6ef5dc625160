"""One log line per request: method, path, status, tokens in (with the reused ones and
their cache layer), tokens out, time; pollers' routes stay quiet unless they fail."""
import logging
import re

from fakes import FakeChatTemplate, FakeModel, FakeTokenizer

from llmcore.engine import Engine, EngineConfig
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app


def access_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "llmcore.access"]


async def test_one_line_per_request(aiohttp_client, caplog):
    eng = Engine(EngineConfig(n_parallel=1, sampling=SamplingParams(temperature=0.0)), model=FakeModel(),
                 tokenizer=FakeTokenizer(), chat_template=FakeChatTemplate(), info={"name": "fake"})
    client = await aiohttp_client(create_app(eng, ServerConfig()))
    with caplog.at_level(logging.INFO, logger="llmcore.access"):
        r = await client.post("/completion", json={"prompt": "abcdef", "n_predict": 3})
        assert r.status == 200
        r = await client.post("/completion", json={"prompt": "abcdefgh", "n_predict": 2, "stream": True})
        assert r.status == 200 and "data: " in await r.text()  # read to the end: the line is written then
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 2})
        assert r.status == 200
        for path in ("/health", "/metrics", "/slots", "/props"):
            assert (await client.get(path)).status == 200
        assert (await client.get("/nowhere")).status == 404
        assert (await client.post("/v1/chat/completions", data=b"{not json",
                                  headers={"Content-Type": "application/json"})).status == 400
    lines = access_lines(caplog)
    assert len(lines) == 5, lines
    assert re.fullmatch(r"POST /completion 200  in 7  out 3  \d+\.\d\d s", lines[0]), lines[0]
    # the second prompt starts with the first one: its prefix came from the slot
    assert re.fullmatch(r"POST /completion 200  in 9 \(\d+ cached, slot\)  out 2  \d+\.\d\d s", lines[1]), lines[1]
    assert re.fullmatch(r"POST /v1/chat/completions 200  in \d+( \(.*\))?  out 2  \d+\.\d\d s", lines[2])
    assert re.fullmatch(r"GET /nowhere 404  \d+\.\d\d s", lines[3]), lines[3]
    assert lines[4].startswith("POST /v1/chat/completions 400  ")
    eng.stop()
