"""Bad input as real clients send it: a clear 4xx OpenAI error (never a 500, never a
traceback), nothing lost, and the server keeps serving. One regression test per bug found
by hitting `llmcore serve` with curl, aiohttp and the openai SDK."""
import asyncio
import gzip
import json

import pytest
from aiohttp.test_utils import TestServer

from fakes import FakeModel, FakeTokenizer, expected_text, tid
from llmcore.chat import ChatTemplate
from llmcore.engine import Engine, EngineConfig
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app
from llmcore.server.keys import ENGINE

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "abc"}]
# a template like SmolLM2's: concatenates content, knows nothing of tool calls
CONCAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '\n' }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")



def make_app(model=None, template=None, keepalive_s=0.05, np_=1):
    eng = Engine(EngineConfig(n_parallel=np_, sampling=SamplingParams(temperature=0.0)),
                 model=model or FakeModel(), tokenizer=FakeTokenizer(),
                 chat_template=template or ChatTemplate(CONCAT_TEMPLATE), info={"name": "fake"})
    return create_app(eng, ServerConfig(keepalive_s=keepalive_s))


@pytest.fixture
async def client(aiohttp_client):
    return await aiohttp_client(make_app())


async def assert_error(r, status=400) -> dict:
    assert r.status == status, await r.text()
    assert r.content_type == "application/json"
    err = (await r.json())["error"]
    assert err["message"] and err["code"] == status
    assert err["type"] == "invalid_request_error"
    assert "Traceback" not in err["message"] and "internal error" not in err["message"]
    return err


async def still_serves(client) -> None:
    r = await client.post("/completion", json={"prompt": "c", "n_predict": 3})
    assert r.status == 200
    assert (await r.json())["content"] == expected_text("c", 3)


# ---- request bodies that used to give 500 ---------------------------------------------


async def test_bad_gzip_body_is_400(client):
    r = await client.post(CHAT, data=b"this is not gzip",
                          headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    err = await assert_error(r)
    assert "gzip" in err["message"]
    await still_serves(client)


async def test_good_gzip_body_is_read(client):
    body = gzip.compress(json.dumps({"messages": MSG, "max_tokens": 2}).encode())
    r = await client.post(CHAT, data=body, headers={"Content-Type": "application/json",
                                                     "Content-Encoding": "gzip"})
    assert r.status == 200
    assert (await r.json())["choices"][0]["message"]["content"] == expected_text(">", 2)


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000,
                                  b'{"a":' * 20_000 + b"1" + b"}" * 20_000])
async def test_deeply_nested_json_is_400(client, body):
    err = await assert_error(await client.post(CHAT, data=body,
                                               headers={"Content-Type": "application/json"}))
    assert "nested too deeply" in err["message"]
    await still_serves(client)


async def test_lone_surrogate_escape_becomes_replacement_char(client):
    # JSON.stringify of a string cut mid-emoji gives a lone "\ud83d": valid JSON, not UTF-8
    body = '{"content": "a\\ud83d b \\udcff", "add_special": false}'
    r = await client.post("/tokenize", data=body, headers={"Content-Type": "application/json"})
    assert r.status == 200
    assert (await r.json())["tokens"] == FakeTokenizer().encode("a\ufffd b \ufffd", add_special=False)
    # a valid surrogate pair still decodes to its character
    body = '{"content": "\\ud83d\\ude00", "add_special": false}'
    r = await client.post("/tokenize", data=body, headers={"Content-Type": "application/json"})
    assert (await r.json())["tokens"] == FakeTokenizer().encode("\U0001F600", add_special=False)
    body = '{"messages": [{"role": "user", "content": "x\\udcff"}], "max_tokens": 2}'
    r = await client.post(CHAT, data=body, headers={"Content-Type": "application/json"})
    assert r.status == 200
    await still_serves(client)


# ---- field validation ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["repeat_penalty", "repetition_penalty"])
async def test_repeat_penalty_type_error_names_the_field(client, key):
    r = await client.post(CHAT, json={"messages": MSG, key: "x"})
    err = await assert_error(r)
    assert f"'{key}'" in err["message"]


@pytest.mark.parametrize("path,body", [
    (CHAT, b"null"),
    (CHAT, b'"text"'),
    (CHAT, b""),
    (CHAT, b"\xff\xfe\x00garbage"),
    (CHAT, '{"messages":[{"role":"user","content":"h\xe9"}]}'.encode("latin-1")),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"temperature":NaN}'),
    (CHAT, b'{"messages":[{"role":"user","content":"x"}],"max_tokens":Infinity}'),
    (CHAT, json.dumps({"messages": []}).encode()),
    (CHAT, json.dumps({"messages": [1]}).encode()),
    (CHAT, json.dumps({"messages": [{"role": 5, "content": "x"}]}).encode()),
    (CHAT, json.dumps({"messages": [{"role": "user", "content": 12}]}).encode()),
    (CHAT, json.dumps({"messages": [{"role": "user", "content": [1]}]}).encode()),
    (CHAT, json.dumps({"messages": MSG, "max_tokens": -5}).encode()),
    (CHAT, json.dumps({"messages": MSG, "max_tokens": 2.5}).encode()),
    (CHAT, json.dumps({"messages": MSG, "stream": "yes"}).encode()),
    (CHAT, json.dumps({"messages": MSG, "stop": [5]}).encode()),
    (CHAT, json.dumps({"messages": MSG, "seed": "x"}).encode()),
    (CHAT, json.dumps({"messages": MSG, "logit_bias": {"5": "x"}}).encode()),
    (CHAT, json.dumps({"messages": MSG, "chat_template_kwargs": [1]}).encode()),
    (CHAT, json.dumps({"messages": MSG, "max_completion_tokens": "x"}).encode()),
    ("/completion", json.dumps({"prompt": [1, 2, 10 ** 30]}).encode()),
    ("/completion", json.dumps({"prompt": [-1]}).encode()),
    ("/completion", json.dumps({"prompt": [1.5]}).encode()),
    ("/completion", json.dumps({"prompt": [True]}).encode()),
    ("/completion", json.dumps({"prompt": []}).encode()),
    ("/completion", json.dumps({"prompt": "a", "n_probs": -1}).encode()),
    ("/completion", json.dumps({"prompt": "a", "n_predict": -7}).encode()),
    ("/detokenize", json.dumps({"tokens": [10 ** 9]}).encode()),
    ("/detokenize", json.dumps({"tokens": [-1]}).encode()),
    ("/detokenize", json.dumps({"tokens": [1.0]}).encode()),
])
async def test_bad_bodies_are_400_and_server_keeps_serving(client, path, body):
    await assert_error(await client.post(path, data=body, headers={"Content-Type": "application/json"}))
    await still_serves(client)


@pytest.mark.parametrize("method,path,status", [
    ("GET", CHAT, 405), ("PUT", CHAT, 405), ("GET", "/completion", 405),
    ("POST", "/health", 405), ("GET", "/nope", 404), ("POST", "/nope", 404),
])
async def test_wrong_method_and_unknown_route_are_json(client, method, path, status):
    r = await client.request(method, path, data=b"{}")
    assert r.status == status
    assert (await r.json())["error"]["code"] == status
    await still_serves(client)


async def test_huge_limits_are_clamped_not_errors(client):
    # max_tokens far beyond the context: generation stops at EOS / context end (FakeModel
    # reaches EOS after 'z'); huge n_probs is capped
    for extra in ({"max_tokens": 10 ** 30}, {"max_tokens": 1e300}, {"n_predict": 2 ** 63},
                  {"max_tokens": 5, "logprobs": True, "top_logprobs": 10 ** 9}):
        r = await client.post(CHAT, json={"messages": [{"role": "user", "content": "w"}], **extra})
        assert r.status == 200, (extra, await r.text())
        d = await r.json()
        assert d["choices"][0]["message"]["content"] == expected_text(">", 5 if "logprobs" in extra else 100)
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 2, "n_probs": 10 ** 9})
    assert r.status == 200 and len((await r.json())["completion_probabilities"][0]["top_logprobs"]) > 0


# ---- chat rendering ----------------------------------------------------------------------

async def test_tool_call_turn_with_null_content_renders(aiohttp_client):
    client = await aiohttp_client(make_app(template=ChatTemplate(CONCAT_TEMPLATE)))
    msgs = [
        {"role": "user", "content": "what is in x?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": None, "type": "function", "function": {"name": "read", "arguments": "{\"p\": \"x\"}"}}]},
        {"role": "tool", "tool_call_id": None, "content": "abc"},
        {"role": "user", "content": "and then d"},
    ]
    r = await client.post(CHAT, json={"messages": msgs, "max_tokens": 3})
    assert r.status == 200, await r.text()
    d = await r.json()
    expected = ChatTemplate(CONCAT_TEMPLATE).render(
        [{**m, "content": m["content"] or ""} for m in msgs], add_generation_prompt=True)
    ids = FakeTokenizer().encode(expected, add_special=True, parse_special=True)
    assert d["usage"]["prompt_tokens"] == len(ids)


async def test_chat_template_kwargs_cannot_clash_with_the_call(aiohttp_client):
    tmpl = ChatTemplate(CONCAT_TEMPLATE)
    client = await aiohttp_client(make_app(template=tmpl))
    r = await client.post(CHAT, json={"messages": MSG, "max_tokens": 2,
                                      "chat_template_kwargs": {"add_generation_prompt": False}})
    assert r.status == 200, await r.text()
    no_gen = FakeTokenizer().encode(tmpl.render(MSG, add_generation_prompt=False), parse_special=True)
    assert (await r.json())["usage"]["prompt_tokens"] == len(no_gen)
    r = await client.post(CHAT, json={"messages": MSG, "max_tokens": 2,
                                      "chat_template_kwargs": {"messages": 1, "tools": 2}})
    assert r.status == 200, await r.text()
    gen = FakeTokenizer().encode(tmpl.render(MSG, add_generation_prompt=True), parse_special=True)
    assert (await r.json())["usage"]["prompt_tokens"] == len(gen)


# ---- disconnects ---------------------------------------------------------------------------


class ProdServer(TestServer):
    """aiohttp's test server cancels a handler when its client leaves; `web.run_app` (what
    `llmcore serve` runs) does not, so the handlers must notice by themselves."""

    async def _make_runner(self, **kwargs):
        kwargs["handler_cancellation"] = False
        return await super()._make_runner(**kwargs)


async def wait_idle(eng, timeout=3.0) -> float:
    t0 = asyncio.get_running_loop().time()
    while asyncio.get_running_loop().time() - t0 < timeout:
        st = eng.stats()
        if st.requests_processing == 0 and st.requests_deferred == 0:
            return asyncio.get_running_loop().time() - t0
        await asyncio.sleep(0.02)
    raise AssertionError(f"engine still busy after {timeout} s: {eng.stats().requests_processing} running")


async def test_non_stream_client_gone_mid_generation_cancels(aiohttp_client):
    # keep-alive far away: tokens keep coming, so only the per-token check can notice
    model = FakeModel(n_ctx_train=20_000, delay=0.01)  # ~200 s to the end of the context
    client = await aiohttp_client(ProdServer(make_app(model=model, keepalive_s=60)))
    eng = client.server.app[ENGINE]
    body = {"prompt": "a", "n_predict": 100_000, "ignore_eos": True}
    with pytest.raises(asyncio.TimeoutError):
        async with client.post("/completion", json=body, timeout=0.3) as r:
            await r.read()
    await wait_idle(eng)
    n = model.tokens_evaluated
    await asyncio.sleep(0.2)
    assert model.tokens_evaluated == n  # nothing more generated for nobody
    assert eng.stats().requests_cancelled >= 1
    await still_serves(client)


async def test_stream_client_gone_mid_prefill_and_mid_stream(aiohttp_client):
    model = FakeModel(n_ctx_train=20_000, delay=0.01)  # ~200 s to the end of the context
    client = await aiohttp_client(ProdServer(make_app(model=model, np_=2)))
    eng = client.server.app[ENGINE]
    body = {"messages": MSG, "max_tokens": 100_000, "ignore_eos": True, "stream": True}
    async with client.post(CHAT, json=body) as r:
        n = 0
        async for _ in r.content:
            n += 1
            if n > 5:
                break
    await wait_idle(eng)
    assert eng.stats().requests_cancelled >= 1
    await still_serves(client)


async def test_more_requests_than_slots_all_answered(aiohttp_client):
    client = await aiohttp_client(make_app(model=FakeModel(delay=0.002), np_=2))
    letters = "abcdefg"
    rs = await asyncio.gather(*[client.post("/completion", json={"prompt": c, "n_predict": 4})
                                for c in letters])
    assert [r.status for r in rs] == [200] * len(letters)
    assert [(await r.json())["content"] for r in rs] == [expected_text(c, 4) for c in letters]


def test_fake_token_ids():  # the helpers above rely on this mapping
    assert FakeTokenizer().encode("a", add_special=False) == [tid("a")]
