"""What agents and SDKs rely on, through the server on the fake model (the real clients
on a real model are in test_sdk_clients.py): API keys, structured output and forced
tool calls, /infill, embeddings, template routes, /v1/models and /props, and the smaller
gaps (min_tokens, text_offset, context_length_exceeded, previous_response_id, images)."""
import base64
import json

import numpy as np
import pytest

from fakes import FakeChatTemplate, FakeModel, FakeTokenizer
from llmcore.engine import Engine, EngineConfig
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig, create_app

GREEDY = SamplingParams(temperature=0.0)
TOOLS = [{"type": "function", "function": {"name": "spell", "parameters": {
    "type": "object", "properties": {"word": {"type": "string", "maxLength": 5}}, "required": ["word"]}}}]


class NoToolsTemplate(FakeChatTemplate):
    reads_tools = False  # like SmolLM2's: the server writes the tools into the system prompt


def fake_engine(np_=2, template=None, **cfg):
    return Engine(EngineConfig(n_parallel=np_, sampling=GREEDY, **cfg), model=FakeModel(), tokenizer=FakeTokenizer(),
                  chat_template=template or FakeChatTemplate(), info={"name": "fake", "path": "/m/fake.gguf",
                                                                     "n_embd": FakeModel.N_EMBD})


@pytest.fixture
async def client(aiohttp_client):
    return await aiohttp_client(create_app(fake_engine(), ServerConfig(keepalive_s=0.05)))


# ---- API keys ---------------------------------------------------------------------------------


@pytest.fixture
async def keyed(aiohttp_client):
    return await aiohttp_client(create_app(fake_engine(), ServerConfig(keepalive_s=0.05, api_keys=("k1", "k2"))))


async def test_api_key_accepted_missing_and_wrong(keyed):
    body = {"prompt": "a", "n_predict": 3}
    r = await keyed.post("/v1/completions", json=body)
    assert r.status == 401
    err = (await r.json())["error"]
    assert err["type"] == "authentication_error" and "API key" in err["message"]
    r = await keyed.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert r.status == 401 and (await r.json())["error"]["message"] == "invalid API key"
    r = await keyed.post("/v1/completions", json=body, headers={"Authorization": "Bearer k2"})
    assert r.status == 200 and (await r.json())["choices"][0]["text"] == "bcd"
    r = await keyed.post("/v1/messages", json={"max_tokens": 3, "messages": [{"role": "user", "content": "a"}]},
                         headers={"x-api-key": "bad"})
    assert r.status == 401 and await r.json() == {
        "type": "error", "error": {"type": "authentication_error", "message": "invalid API key"}}
    r = await keyed.post("/v1/messages", json={"max_tokens": 3, "messages": [{"role": "user", "content": "a"}]},
                         headers={"x-api-key": "k1"})
    assert r.status == 200
    assert (await keyed.get("/health")).status == 200  # load balancers probe without a key
    assert (await keyed.get("/metrics")).status == 401
    assert (await keyed.get("/v1/models", headers={"Authorization": "Bearer k1"})).status == 200


def test_api_keys_compare_every_key():
    from llmcore.server.access import key_matches

    assert key_matches("b", ("a", "b", "c")) and not key_matches("d", ("a", "b")) and not key_matches("", ("a",))


def test_cli_reads_api_keys(tmp_path):
    from llmcore.cli import ServerOptions
    from llmcore.errors import LLMCoreError

    f = tmp_path / "keys"
    f.write_text("# ours\nalpha\n\nbeta\n")
    assert ServerOptions(api_key="x, y", api_key_file=str(f)).server_config().api_keys == ("x", "y", "alpha", "beta")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(LLMCoreError, match="no key"):
        ServerOptions(api_key_file=str(tmp_path / "empty")).server_config()
    with pytest.raises(LLMCoreError, match="--api-key-file"):
        ServerOptions(api_key_file=str(tmp_path / "missing")).server_config()


# ---- structured output and tools ---------------------------------------------------------------


async def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 4}}, "required": ["w"]}
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "a"}], "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    d = await r.json()
    assert r.status == 200, d
    out = json.loads(d["choices"][0]["message"]["content"])
    assert isinstance(out["w"], str) and len(out["w"]) <= 4
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "a"}], "max_tokens": 40, "response_format": {"type": "json_object"}})
    assert isinstance(json.loads((await r.json())["choices"][0]["message"]["content"]), dict)


async def test_bad_schema_or_grammar_is_a_400_naming_it(client):
    r = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "a"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}})
    assert r.status == 400 and "nonsense" in (await r.json())["error"]["message"]
    r = await client.post("/completion", json={"prompt": "a", "grammar": "root ::= ("})
    assert r.status == 400 and "grammar" in (await r.json())["error"]["message"]
    r = await client.post("/completion", json={"prompt": "a", "grammar": 'root ::= "x"', "json_schema": {}})
    assert r.status == 400


async def test_gbnf_grammar_and_json_schema_on_completion(client):
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 20, "grammar": 'root ::= [0-9]{3} "!"'})
    d = await r.json()
    assert d["content"][:3].isdigit() and d["content"][3] == "!" and d["stop_type"] == "eos"
    r = await client.post("/completion", json={"prompt": "a", "n_predict": 40,
                                               "json_schema": {"type": "array", "items": {"type": "integer"},
                                                               "maxItems": 2}})
    assert isinstance(json.loads((await r.json())["content"]), list)


async def test_responses_text_format(client):
    r = await client.post("/v1/responses", json={"input": "a", "max_output_tokens": 40, "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"type": "object", "properties": {"k": {"const": 1}},
                                                        "required": ["k"]}}}})
    d = await r.json()
    assert json.loads(d["output"][0]["content"][0]["text"]) == {"k": 1}


async def test_forced_tool_call_in_the_generic_format(aiohttp_client):
    tmpl = NoToolsTemplate()
    eng = fake_engine(template=tmpl, n_ctx=2048)
    client = await aiohttp_client(create_app(eng, ServerConfig(keepalive_s=0.05)))
    seen = {}
    real = tmpl.render

    def render(messages, **kw):
        seen["system"] = messages[0]["content"]
        return real(messages, **kw)

    tmpl.render = render
    for choice in ("required", {"type": "function", "function": {"name": "spell"}}):
        r = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "a"}], "tools": TOOLS, "tool_choice": choice, "max_tokens": 200})
        d = await r.json()
        assert r.status == 200, d
        assert d["choices"][0]["finish_reason"] == "tool_calls", d
        call = d["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "spell" and len(json.loads(call["arguments"])["word"]) <= 5
    assert '"spell"' in seen["system"] and "tool_calls" in seen["system"]
    # Anthropic's tool_choice any: a tool_use block
    r = await client.post("/v1/messages", json={
        "max_tokens": 200, "messages": [{"role": "user", "content": "a"}], "tool_choice": {"type": "any"},
        "tools": [{"name": "spell", "input_schema": TOOLS[0]["function"]["parameters"]}]})
    d = await r.json()
    assert d["stop_reason"] == "tool_use" and d["content"][-1]["type"] == "tool_use"


async def test_earlier_calls_are_shown_in_the_generic_format():
    from llmcore.toolcalls.generic import render_messages

    msgs = render_messages([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "spell", "arguments": '{"word": "ab"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "AB"}], TOOLS, None)
    assert msgs[0]["role"] == "system" and "spell" in msgs[0]["content"]
    assert json.loads(msgs[2]["content"]) == {"tool_calls": [{"name": "spell", "arguments": {"word": "ab"}}]}
    assert msgs[3]["role"] == "user" and json.loads(msgs[3]["content"])["tool_response"]["content"] == "AB"


# ---- /infill ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fim_engine(built_model):
    from llmcore.engine import load_engine

    eng = load_engine(built_model("fim"), EngineConfig(n_ctx=256, sampling=GREEDY, cache_ram_mib=0))
    yield eng
    eng.stop()


async def test_infill_with_fim_tokens(aiohttp_client, fim_engine):
    from llmcore.server.prompt import build_infill_tokens

    tok = fim_engine.tokenizer
    fim = tok.fim
    assert (fim.pre, fim.suf, fim.mid) == tuple(tok.token_id(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>",
                                                                          "<|fim_middle|>"))
    ids = build_infill_tokens(fim_engine, {"input_prefix": "def f(", "input_suffix": "):\n", "prompt": "a",
                                           "input_extra": [{"filename": "u.py", "text": "x = 1"}]})
    assert ids[-1] == fim.mid and ids.count(fim.pre) == 1 and ids.index(fim.pre) < ids.index(fim.suf)
    assert tok.decode(ids[ids.index(fim.pre) + 1:ids.index(fim.suf)]) == "def f(a"
    assert "x = 1" in tok.decode(ids[:ids.index(fim.pre)])
    client = await aiohttp_client(create_app(fim_engine, ServerConfig(keepalive_s=0.05)))
    r = await client.post("/infill", json={"input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 4})
    d = await r.json()
    assert r.status == 200 and d["tokens_predicted"] == 4 and d["tokens_evaluated"] == len(
        build_infill_tokens(fim_engine, {"input_prefix": "def f(", "input_suffix": "):\n"}))
    r = await client.post("/v1/completions", json={"prompt": "def f(", "suffix": "):\n", "max_tokens": 3})
    assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 3
    assert (await (await client.get("/props")).json())["infill"] is True


async def test_infill_without_fim_tokens_is_a_400(client):
    r = await client.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status == 400 and "fill-in-the-middle" in (await r.json())["error"]["message"]
    r = await client.post("/v1/completions", json={"prompt": "a", "suffix": "b"})
    assert r.status == 400


# ---- embeddings ------------------------------------------------------------------------------


async def test_embeddings_shape_order_and_encoding(client):
    r = await client.post("/v1/embeddings", json={"input": ["abc", "abd", "%%%"]})
    d = await r.json()
    assert r.status == 200 and [x["index"] for x in d["data"]] == [0, 1, 2]
    v = np.array([x["embedding"] for x in d["data"]])
    assert v.shape == (3, FakeModel.N_EMBD) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2]  # near letters, near vectors
    assert d["usage"]["prompt_tokens"] == 3 * 4  # BOS + 3 bytes each
    r = await client.post("/v1/embeddings", json={"input": "abc", "encoding_format": "base64"})
    b = np.frombuffer(base64.b64decode((await r.json())["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(b, v[0], atol=1e-6)
    r = await client.post("/embedding", json={"content": "abc"})
    assert np.allclose((await r.json())[0]["embedding"][0], v[0], atol=1e-6)


async def test_embeddings_run_beside_a_generation(aiohttp_client):
    eng = fake_engine()
    client = await aiohttp_client(create_app(eng, ServerConfig(keepalive_s=0.05)))
    import asyncio

    gen = asyncio.ensure_future(client.post("/completion", json={"prompt": "a", "n_predict": 30, "ignore_eos": True}))
    emb = await client.post("/v1/embeddings", json={"input": ["x" * 40]})
    assert emb.status == 200
    assert (await (await gen).json())["tokens_predicted"] == 30


# ---- templates, models, props ----------------------------------------------------------------


async def test_apply_template(client):
    r = await client.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]})
    assert await r.json() == {"prompt": "<s><|user|>hi\n<|assistant|>"}


async def test_models_and_props_show_the_serving_context(client):
    d = await (await client.get("/v1/models")).json()
    m = d["data"][0]
    assert m["id"] == "fake.gguf" and m["max_model_len"] == 256 and m["meta"]["n_ctx"] == 256
    r = await client.get("/v1/models/fake.gguf")
    assert r.status == 200 and (await r.json())["id"] == "fake.gguf"
    r = await client.get("/v1/models/other")
    assert r.status == 404 and (await r.json())["error"]["type"] == "not_found_error"
    p = await (await client.get("/props")).json()
    assert p["n_ctx"] == p["max_model_len"] == 256 and p["model_alias"] == "fake.gguf" and p["warnings"] == []


def test_template_overrides(built_model, tmp_path, caplog):
    from llmcore.errors import ModelLoadError
    from llmcore.gguf_file import GGUFFile
    from llmcore.loader import NO_TEMPLATE_WARNING, choose_template
    from llmcore.tokenizer import Tokenizer

    gf = GGUFFile(built_model("chat"))
    tok = Tokenizer.from_gguf(gf)
    t, origin = choose_template(gf, tok, text="{{ messages[0]['content'] | upper }}")
    assert origin == "file" and t.render([{"role": "user", "content": "hi"}]) == "HI"
    t, origin = choose_template(gf, tok, name="chatml")
    assert origin == "name" and t.render([{"role": "user", "content": "x"}]).startswith("<|im_start|>user")
    t, origin = choose_template(gf, tok, name="gemma")
    assert origin == "name" and "<start_of_turn>user\nx<end_of_turn>" in t.render([{"role": "user", "content": "x"}])
    with pytest.raises(ModelLoadError, match="not a template of this model"):
        choose_template(gf, tok, name="nope")
    with pytest.raises(ModelLoadError, match="does not compile"):
        choose_template(gf, tok, text="{% if %}")
    meta = {k: v for k, v in gf.meta.items() if k != "tokenizer.chat_template"}

    class NoTemplate:
        pass

    bare = NoTemplate()
    bare.meta = meta
    with caplog.at_level("WARNING"):
        t, origin = choose_template(bare, tok)
    assert origin == "none" and NO_TEMPLATE_WARNING in caplog.text


async def test_reasoning_format_none_keeps_the_think_block(aiohttp_client):
    class Thinker(FakeChatTemplate):
        def render(self, messages, **kw):
            return super().render(messages, **kw) + "<think>"

    from llmcore.server.prompt import ReasoningOptions, build_chat_prompt

    eng = fake_engine(template=Thinker())
    body = {"messages": [{"role": "user", "content": "a"}]}
    assert build_chat_prompt(eng, body).parse_reasoning
    p = build_chat_prompt(eng, body, reasoning=ReasoningOptions(format="none"))
    assert not p.parse_reasoning
    p = build_chat_prompt(eng, {**body, "reasoning_budget": 5})
    assert p.reasoning_budget.tokens == 5 and p.reasoning_budget.starts_inside


# ---- smaller gaps --------------------------------------------------------------------------


async def test_text_offset_and_min_tokens(client):
    r = await client.post("/v1/completions", json={"prompt": "w", "max_tokens": 8, "logprobs": 1, "min_tokens": 5})
    d = await r.json()
    lp = d["choices"][0]["logprobs"]
    text = d["choices"][0]["text"]
    assert len(text) >= 5  # "xyz" then EOS, held back until 5 tokens
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]


async def test_context_length_exceeded_code(client):
    r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 400}]})
    err = (await r.json())["error"]
    assert r.status == 400 and err["code"] == "context_length_exceeded"


async def test_a_request_without_a_limit_is_bounded_by_a_slot_share(client):
    r = await client.post("/completion", json={"prompt": "a", "ignore_eos": True})
    assert (await r.json())["tokens_predicted"] == 256 // 2  # n_ctx 256, 2 slots


async def test_previous_response_id(client):
    r = await client.post("/v1/responses", json={"input": "a", "max_output_tokens": 3})
    first = await r.json()
    r = await client.post("/v1/responses", json={"input": "b", "max_output_tokens": 3,
                                                 "previous_response_id": first["id"]})
    d = await r.json()
    assert r.status == 200 and d["previous_response_id"] == first["id"]
    assert d["usage"]["input_tokens"] > first["usage"]["input_tokens"]  # the first turn came along
    r = await client.post("/v1/responses", json={"input": "b", "previous_response_id": "resp_unknown"})
    assert r.status == 400 and "resp_unknown" in (await r.json())["error"]["message"]
    r = await client.post("/v1/responses", json={"input": "c", "store": False, "max_output_tokens": 2})
    unstored = (await r.json())["id"]
    r = await client.post("/v1/responses", json={"input": "d", "previous_response_id": unstored})
    assert r.status == 400


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
    ("/v1/responses", {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}),
])
async def test_images_refused_the_same_way_everywhere(client, path, body):
    r = await client.post(path, json=body)
    d = await r.json()
    msg = d["error"]["message"]
    assert r.status == 400 and "image input is not supported" in msg
