import asyncio
import json
import threading

import pytest

from fakes import FakeChatTemplate, FakeModel, FakeTokenizer, expected_text
from llmcore.engine import Engine, EngineConfig
from llmcore.metrics import parse_prometheus
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app
from llmcore.server.keys import ENGINE

GREEDY = SamplingParams(temperature=0.0)


def make_app(np_=1, model=None, loader=None, **cfg):
    ecfg = EngineConfig(n_parallel=np_, sampling=SamplingParams(temperature=0.0), **cfg)
    if loader is not None:
        eng = Engine(ecfg, loader=loader)
    else:
        eng = Engine(ecfg, model=model or FakeModel(), tokenizer=FakeTokenizer(),
                     chat_template=FakeChatTemplate(), info={"name": "fake", "path": "/m/fake.gguf"})
    return create_app(eng, ServerConfig(keepalive_s=0.05))


@pytest.fixture
async def client(aiohttp_client):
    return await aiohttp_client(make_app())


async def sse_frames(resp):
    """Parsed `data:` frames of an SSE response; '[DONE]' kept as a string."""
    frames = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line or line.startswith(":"):
            continue
        assert line.startswith("data: "), line
        data = line[6:]
        frames.append(data if data == "[DONE]" else json.loads(data))
    return frames


async def test_health_models_props(client):
    r = await client.get("/health")
    assert r.status == 200 and await r.json() == {"status": "ok"}
    r = await client.get("/v1/models")
    d = await r.json()
    assert d["object"] == "list" and d["data"][0]["id"] == "fake.gguf"
    assert d["data"][0]["meta"]["n_vocab"] == FakeTokenizer.vocab_size
    r = await client.get("/models")
    assert r.status == 200
    r = await client.get("/props")
    p = await r.json()
    assert p["total_slots"] == 1 and p["n_ctx"] == 256


async def test_health_503_while_loading(aiohttp_client):
    gate = threading.Event()

    def loader():
        gate.wait(5)
        return FakeModel(), FakeTokenizer(), FakeChatTemplate(), {}

    client = await aiohttp_client(make_app(loader=loader))
    r = await client.get("/health")
    assert r.status == 503
    assert (await r.json())["error"]["message"] == "Loading model"
    r = await client.post("/completion", json={"prompt": "a"})
    assert r.status == 503
    gate.set()
    for _ in range(100):
        r = await client.get("/health")
        if r.status == 200:
            break
        await asyncio.sleep(0.02)
    assert r.status == 200


async def test_completion_native(client):
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 4, "return_tokens": True})
    assert r.status == 200
    d = await r.json()
    assert d["content"] == expected_text("a", 4)
    assert d["stop"] is True and d["stop_type"] == "limit"
    assert d["tokens_predicted"] == 4 and d["tokens_evaluated"] == 2 and len(d["tokens"]) == 4
    t = d["timings"]
    assert t["prompt_n"] == 2 and t["predicted_n"] == 4 and t["cache_n"] == 0
    # same prompt again: prefix reuse shows up as cache_n
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 1})
    assert (await r.json())["timings"]["cache_n"] == 1
    # token-id prompt
    tok = FakeTokenizer()
    r = await client.post("/completion", json={"prompt": tok.encode("x"), "n_predict": 5})
    d = await r.json()
    assert d["content"] == "yz" and d["stop_type"] == "eos"


async def test_completion_stop_words_and_stream(client):
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 20, "stop": ["ef"]})
    d = await r.json()
    assert d["content"] == "bcd" and d["stop_type"] == "word" and d["stopping_word"] == "ef"
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 6, "stream": True})
    assert r.headers["Content-Type"].startswith("text/event-stream")
    frames = await sse_frames(r)
    assert "".join(f["content"] for f in frames) == expected_text("a", 6)
    assert [f["stop"] for f in frames] == [False] * 6 + [True]
    assert frames[-1]["timings"]["predicted_n"] == 6


async def test_completion_n_probs(client):
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 2, "n_probs": 3})
    d = await r.json()
    probs = d["completion_probabilities"]
    assert len(probs) == 2 and probs[0]["token"] == "b" and len(probs[0]["top_logprobs"]) == 3
    assert probs[0]["top_logprobs"][0]["logprob"] >= probs[0]["top_logprobs"][1]["logprob"]


async def test_chat_non_stream(client):
    msgs = [{"role": "user", "content": "hi"}]
    r = await client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 3})
    assert r.status == 200
    d = await r.json()
    assert d["object"] == "chat.completion"
    # the fake template ends the prompt with '>', after which the fake model writes 'abc'
    assert d["choices"][0]["message"] == {"role": "assistant", "content": "abc"}
    assert d["choices"][0]["finish_reason"] == "length"
    u = d["usage"]
    prompt_len = len(FakeTokenizer().encode(FakeChatTemplate().render(msgs), parse_special=True)) - 1
    assert u["prompt_tokens"] == prompt_len and u["completion_tokens"] == 3
    assert u["total_tokens"] == prompt_len + 3
    # max_completion_tokens wins over max_tokens; stop as a plain string
    r = await client.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 2, "max_completion_tokens": 30, "stop": "e"})
    d = await r.json()
    assert d["choices"][0]["message"]["content"] == "abcd" and d["choices"][0]["finish_reason"] == "stop"
    assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_len - 1


async def test_chat_stream_done_and_usage(client):
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True})
    assert r.status == 200
    frames = await sse_frames(r)
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "abcd"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


async def test_chat_logprobs(client):
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True,
        "top_logprobs": 2})
    d = await r.json()
    lp = d["choices"][0]["logprobs"]["content"]
    assert [x["token"] for x in lp] == ["a", "b"] and len(lp[0]["top_logprobs"]) == 2
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})
    assert r.status == 400


async def test_v1_completions_stream_and_plain(client):
    r = await client.post("/v1/completions", json={"prompt": "k", "max_tokens": 3})
    d = await r.json()
    assert d["object"] == "text_completion" and d["choices"][0]["text"] == "lmn"
    assert d["usage"]["completion_tokens"] == 3
    r = await client.post("/v1/completions", json={"prompt": [FakeTokenizer().encode("k")], "max_tokens": 3, "stream": True})
    frames = await sse_frames(r)
    assert frames[-1] == "[DONE]" and "usage" in frames[-2]
    assert "".join(f["choices"][0]["text"] for f in frames[:-2]) == "lmn"


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", "{not json"),
    ("/v1/chat/completions", json.dumps([1, 2])),
    ("/v1/chat/completions", json.dumps({"messages": "hi"})),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "10"})),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "stop": 5})),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2})),
    ("/v1/completions", json.dumps({"max_tokens": 3})),
    ("/completion", json.dumps({"prompt": {"a": 1}})),
    ("/completion", json.dumps({"prompt": "a", "id_slot": 9})),
    ("/tokenize", json.dumps({"content": 3})),
    ("/detokenize", json.dumps({"tokens": ["a"]})),
])
async def test_bad_requests_are_400(client, path, body):
    r = await client.post(path, data=body, headers={"Content-Type": "application/json"})
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400 and err["message"]
    # and the server keeps serving
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 1})
    assert r.status == 200


async def test_prompt_too_long_is_400(client):
    r = await client.post("/completion", json={"prompt": "x" * 300, "n_predict": 1})
    assert r.status == 400
    err = (await r.json())["error"]
    assert "context" in err["message"] and err["n_ctx"] == 256
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "y" * 300}], "stream": True})
    assert r.status == 400


async def test_unknown_route_404_json(client):
    r = await client.get("/nope")
    assert r.status == 404
    assert (await r.json())["error"]["code"] == 404


async def test_tokenize_round_trip(client):
    text = "héllo wörld"
    r = await client.post("/tokenize", json={"content": text})
    ids = (await r.json())["tokens"]
    assert ids == FakeTokenizer().encode(text, add_special=False)
    r = await client.post("/detokenize", json={"tokens": ids})
    assert (await r.json())["content"] == text
    r = await client.post("/tokenize", json={"content": "é", "with_pieces": True, "add_special": True})
    toks = (await r.json())["tokens"]
    assert toks[0] == {"id": 1, "piece": "<s>"}
    assert toks[1]["piece"] == list("é".encode())[:1]  # a lone UTF-8 lead byte comes as bytes


async def test_metrics_parse(client):
    await client.post("/completion", json={"prompt": "a", "n_predict": 3})
    r = await client.get("/metrics")
    assert r.status == 200
    m = parse_prometheus(await r.text())
    assert m["llamacpp:tokens_predicted_total"] == 3
    assert m["llamacpp:prompt_tokens_total"] == 2
    assert m["llamacpp:requests_processing"] == 0 and m["llamacpp:requests_deferred"] == 0
    assert "llamacpp:prompt_tokens_seconds" in m and "llamacpp:predicted_tokens_seconds" in m
    r = await client.get("/slots")
    slots = await r.json()
    assert len(slots) == 1 and slots[0]["is_processing"] is False and slots[0]["n_tokens"] == 4


async def test_queued_requests_all_complete(aiohttp_client):
    client = await aiohttp_client(make_app(np_=2, model=FakeModel(delay=0.001)))
    letters = "abcdefghij"

    async def one(ch):
        r = await client.post("/completion", json={"prompt": ch, "n_predict": 5})
        return (await r.json())["content"]

    outs = await asyncio.gather(*(one(ch) for ch in letters))
    assert outs == [expected_text(ch, 5) for ch in letters]
    st = client.server.app[ENGINE].stats()
    assert st.requests_total == 10 and st.requests_deferred == 0


async def test_disconnect_mid_stream_frees_slot(aiohttp_client):
    model = FakeModel(n_ctx_train=100000, delay=0.01)
    client = await aiohttp_client(make_app(np_=1, model=model))
    eng = client.server.app[ENGINE]
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "go"}], "stream": True, "ignore_eos": True})
    n = 0
    async for raw in r.content:
        if raw.startswith(b"data: "):
            n += 1
            if n == 3:
                break
    r.close()
    for _ in range(200):
        if eng.stats().requests_cancelled == 1 and eng.stats().requests_processing == 0:
            break
        await asyncio.sleep(0.02)
    st = eng.stats()
    assert st.requests_cancelled == 1 and st.requests_processing == 0
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 2})
    assert (await r.json())["content"] == "bc"


async def test_disconnect_while_queued_non_stream(aiohttp_client):
    model = FakeModel(n_ctx_train=100000, delay=0.01)
    client = await aiohttp_client(make_app(np_=1, model=model))
    eng = client.server.app[ENGINE]
    busy = asyncio.ensure_future(client.post("/completion", json={"prompt": "a", "n_predict": 30}))
    await asyncio.sleep(0.05)
    waiter = asyncio.ensure_future(client.post("/completion", json={"prompt": "b", "n_predict": 1000, "ignore_eos": True}))
    for _ in range(1000):  # until the engine holds it in its queue (slow when the machine is busy)
        if eng.stats().requests_deferred == 1:
            break
        await asyncio.sleep(0.01)
    assert eng.stats().requests_deferred == 1
    waiter.cancel()  # client gives up while queued
    r = await busy
    assert (await r.json())["content"] == expected_text("a", 30)
    for _ in range(1000):
        st = eng.stats()
        if st.requests_processing == 0 and st.requests_deferred == 0 and st.requests_cancelled:
            break
        await asyncio.sleep(0.02)
    assert eng.stats().requests_processing == 0 and eng.stats().requests_cancelled == 1


# ---- CLI ------------------------------------------------------------------------------


def test_cli_help_on_every_command():
    from typer.testing import CliRunner

    from llmcore.cli import app

    runner = CliRunner()
    for cmd in ([], ["serve"], ["generate"], ["pull"], ["info"]):
        r = runner.invoke(app, [*cmd, "--help"])
        assert r.exit_code == 0, (cmd, r.output)
        assert "Usage" in r.output


def test_cli_errors_are_one_line(tmp_path):
    from typer.testing import CliRunner

    from llmcore.cli import app

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    r = CliRunner().invoke(app, ["info", str(bad)])
    assert r.exit_code == 1 and "not a GGUF file" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["serve", "-m", str(bad), "-np", "0"])
    assert r.exit_code == 1 and "-np must be >= 1" in r.output


# ---- end to end on a real model (when the model, tokenizer and chat pieces exist) ----


@pytest.mark.slow
@pytest.mark.realmodel
async def test_real_model_end_to_end(aiohttp_client, smollm2_path):
    pytest.importorskip("llmcore.models")
    pytest.importorskip("llmcore.tokenizer")
    from llmcore.engine import Engine

    eng = Engine.from_path(smollm2_path, EngineConfig(n_ctx=512, n_parallel=2, n_ubatch=64))
    client = await aiohttp_client(create_app(eng, ServerConfig()))
    for _ in range(600):
        r = await client.get("/health")
        if r.status != 503:
            break
        await asyncio.sleep(0.1)
    assert r.status == 200, await r.text()
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0, "stream": True}
    r = await client.post("/v1/chat/completions", json=body)
    frames = await sse_frames(r)
    assert frames[-1] == "[DONE]" and frames[-2]["usage"]["completion_tokens"] >= 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in frames[:-1] if c["choices"])
    # the same request again: greedy gives the same text, and the prompt comes from the slot
    body["stream"] = False
    r = await client.post("/v1/chat/completions", json=body)
    d = await r.json()
    assert d["choices"][0]["message"]["content"] == text
    assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == d["usage"]["prompt_tokens"] - 1
    r = await client.post("/tokenize", json={"content": "Hello world"})
    ids = (await r.json())["tokens"]
    r = await client.post("/detokenize", json={"tokens": ids})
    assert (await r.json())["content"] == "Hello world"


async def test_keepalive_comments_while_waiting(aiohttp_client):
    # each forward takes 0.12 s > keepalive_s (0.05 s): comment lines keep the stream alive
    client = await aiohttp_client(make_app(model=FakeModel(delay=0.12)))
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 2, "stream": True})
    raw = (await r.read()).decode()
    assert ": keep-alive" in raw
    frames = [json.loads(l[6:]) for l in raw.splitlines() if l.startswith("data: ")]
    assert "".join(f["content"] for f in frames) == "bc" and frames[-1]["stop"] is True


# ---- the request path: one prompt build per request, errors by class ------------------


class CountingTemplate(FakeChatTemplate):
    def __init__(self):
        self.renders = 0

    def render(self, messages, add_generation_prompt=True, tools=None, **extra):
        self.renders += 1
        return super().render(messages, add_generation_prompt, tools, **extra)


HISTORY = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
           {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CHAT_BODIES = {  # the same conversation through every chat-style API
    "/v1/chat/completions": {"messages": HISTORY, "tools": [TOOL], "max_tokens": 2},
    "/v1/messages": {"system": "be brief", "messages": HISTORY[1:], "max_tokens": 2,
                     "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
    "/v1/responses": {"instructions": "be brief", "max_output_tokens": 2,
                      "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                      "input": [{"type": "message", **m} for m in HISTORY[1:]]},
}


async def chat_client(aiohttp_client, monkeypatch, needs_checkpoints: bool):
    from llmcore.engine import Engine as E

    monkeypatch.setattr(E, "needs_checkpoints", property(lambda self: needs_checkpoints))
    tmpl = CountingTemplate()
    eng = Engine(EngineConfig(sampling=GREEDY), model=FakeModel(), tokenizer=FakeTokenizer(),
                 chat_template=tmpl, info={"name": "fake"})
    client = await aiohttp_client(create_app(eng, ServerConfig(keepalive_s=0.05)))
    submitted = []
    submit = eng.submit

    def spy(prompt, params=None, **kw):
        submitted.append((list(prompt), params))
        return submit(prompt, params, **kw)

    monkeypatch.setattr(eng, "submit", spy)
    return client, tmpl, submitted


@pytest.mark.parametrize("path", list(CHAT_BODIES))
async def test_chat_prompt_rendered_once_without_checkpoints(aiohttp_client, monkeypatch, path):
    client, tmpl, submitted = await chat_client(aiohttp_client, monkeypatch, needs_checkpoints=False)
    r = await client.post(path, json=CHAT_BODIES[path])
    assert r.status == 200, await r.text()
    assert tmpl.renders == 1
    assert submitted[0][1].checkpoint_at is None


@pytest.mark.parametrize("path", list(CHAT_BODIES))
async def test_checkpoint_at_where_the_last_user_message_starts(aiohttp_client, monkeypatch, path):
    client, tmpl, submitted = await chat_client(aiohttp_client, monkeypatch, needs_checkpoints=True)
    r = await client.post(path, json=CHAT_BODIES[path])
    assert r.status == 200, await r.text()
    assert tmpl.renders == 2  # the prompt, and the conversation before its last user message
    prompt, params = submitted[0]
    head = FakeTokenizer().encode(FakeChatTemplate().render(HISTORY[:3], add_generation_prompt=False),
                                  parse_special=True)[1:]  # the template writes BOS itself
    assert params.checkpoint_at == len(head) and prompt[:len(head)] == head
    assert len(prompt) > len(head)


async def test_count_tokens_renders_once_even_with_checkpoints(aiohttp_client, monkeypatch):
    client, tmpl, _ = await chat_client(aiohttp_client, monkeypatch, needs_checkpoints=True)
    r = await client.post("/v1/messages/count_tokens", json=CHAT_BODIES["/v1/messages"])
    assert r.status == 200 and tmpl.renders == 1


async def test_responses_bad_stream_flag_leaves_no_task(aiohttp_client):
    client = await aiohttp_client(make_app(model=FakeModel(n_ctx_train=100_000, delay=0.01)))
    eng = client.server.app[ENGINE]
    r = await client.post("/v1/responses", json={"input": "go", "stream": "yes", "ignore_eos": True})
    assert r.status == 400 and "'stream'" in (await r.json())["error"]["message"]
    await asyncio.sleep(0.2)
    st = eng.stats()
    assert st.requests_processing == 0 and st.requests_deferred == 0 and st.requests_total == 0


async def test_anthropic_failure_after_submit_uses_anthropic_envelope(aiohttp_client):
    from fakes import tid

    client = await aiohttp_client(make_app(model=FakeModel(fail_token=tid("b"))))
    r = await client.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "a"}]})
    assert r.status == 500
    assert await r.json() == {"type": "error", "error": {"type": "api_error",
                                                          "message": "RuntimeError: fake model failure"}}


def test_errors_map_to_status_by_class_not_by_message():
    from llmcore.errors import (ContextFullError, EngineFailure, LLMCoreError, ModelLoadFailedError,
                                ModelLoadingError, RequestError, ShuttingDownError)
    from llmcore.server.errors import anthropic_error, openai_error, responses_error

    assert openai_error(ModelLoadingError()) == (503, {"error": {
        "message": "Loading model", "type": "unavailable_error", "code": 503}})
    assert anthropic_error(ModelLoadingError()) == (529, {"type": "error", "error": {
        "type": "overloaded_error", "message": "Loading model"}})
    # the same words in another class mean nothing
    assert openai_error(LLMCoreError("Loading model"))[0] == 500
    assert anthropic_error(LLMCoreError("Loading model"))[0] == 500
    assert openai_error(ModelLoadFailedError("model failed to load: x"))[0] == 503
    assert anthropic_error(ModelLoadFailedError("x"))[1]["error"]["type"] == "api_error"
    exc = EngineFailure("step failed")
    assert openai_error(exc) == (500, {"error": {"message": str(exc), "type": "server_error", "code": 500}})
    # a stopping server is unavailable, not broken: clients retry
    assert openai_error(ShuttingDownError()) == (503, {"error": {
        "message": "server is shutting down", "type": "unavailable_error", "code": 503}})
    assert openai_error(RuntimeError("boom"))[1]["error"]["message"] == "internal error: RuntimeError: boom"
    assert anthropic_error(RuntimeError("boom"))[1]["error"]["message"] == "RuntimeError: boom"
    assert openai_error(RequestError("bad"))[0] == 400
    full = ContextFullError("too long", n_prompt_tokens=300, n_ctx=256)
    status, body = openai_error(full)
    assert status == 400 and body["error"]["n_prompt_tokens"] == 300 and body["error"]["n_ctx"] == 256
    assert anthropic_error(full)[1]["error"]["message"] == "prompt is too long: 300 tokens > 256 maximum"
    assert responses_error(full)[1]["error"]["code"] == "context_length_exceeded"
    assert responses_error(RequestError("bad"))[1]["error"]["code"] == 400


async def test_health_and_requests_503_when_the_model_failed_to_load(aiohttp_client):
    def loader():
        raise RuntimeError("bad file")

    client = await aiohttp_client(make_app(loader=loader))
    eng = client.server.app[ENGINE]
    for _ in range(200):
        if eng.status != "loading":
            break
        await asyncio.sleep(0.01)
    assert eng.status == "error"
    for path, body in (("/health", None), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        r = await (client.get(path) if body is None else client.post(path, json=body))
        assert r.status == 503
        assert (await r.json())["error"]["message"] == "model failed to load: bad file"
