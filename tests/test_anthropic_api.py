"""POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages, for Claude Code)."""
import json

from test_toolcalls import QWEN3, ScriptedModel, make_app, scripted_app

TOOLS = [{"name": "read_file", "description": "read", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}},
    {"name": "get_weather", "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}}},
    {"type": "web_search_20250305", "name": "web_search"}]
BODY = {"model": "claude-sonnet-4", "max_tokens": 1000, "tools": TOOLS,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc"},
                   {"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "read main.py"}]}
CALLS = [("read_file", {"path": "src/main.py", "limit": 50}), ("get_weather", {"location": "Paris, FR"})]


async def events(resp):
    out, name = [], None
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            d = json.loads(line[6:])
            assert d["type"] == name
            out.append(d)
    return out


async def test_messages_non_stream_tool_use(aiohttp_client):
    client = await aiohttp_client(scripted_app(QWEN3))
    r = await client.post("/v1/messages", json=BODY)
    d = await r.json()
    assert r.status == 200, d
    assert d["type"] == "message" and d["role"] == "assistant" and d["stop_reason"] == "tool_use"
    kinds = [b["type"] for b in d["content"]]
    assert kinds == ["thinking", "text", "tool_use", "tool_use"]
    assert d["content"][1]["text"] == "Let me read it.\n"
    assert [(b["name"], b["input"]) for b in d["content"][2:]] == CALLS
    u = d["usage"]
    assert u["output_tokens"] > 0 and u["input_tokens"] + u["cache_read_input_tokens"] > 0


async def test_messages_stream_event_sequence(aiohttp_client):
    client = await aiohttp_client(scripted_app(QWEN3))
    r = await client.post("/v1/messages", json={**BODY, "stream": True})
    evs = await events(r)
    types = [e["type"] for e in evs]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert evs[-2]["delta"]["stop_reason"] == "tool_use" and evs[-2]["usage"]["output_tokens"] > 0
    blocks, open_ = {}, None
    for e in evs[1:-2]:
        if e["type"] == "content_block_start":
            assert open_ is None
            open_ = e["index"]
            blocks[open_] = [e["content_block"], ""]
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_
            dl = e["delta"]
            blocks[open_][1] += dl.get("text") or dl.get("thinking") or dl.get("partial_json") or ""
        else:
            assert e["type"] == "content_block_stop" and e["index"] == open_
            open_ = None
    assert [b[0]["type"] for b in blocks.values()] == ["thinking", "text", "tool_use", "tool_use"]
    assert blocks[1][1] == "Let me read it.\n"
    assert [(b[0]["name"], json.loads(b[1])) for b in list(blocks.values())[2:]] == CALLS


async def test_messages_end_turn_max_tokens_and_history(aiohttp_client):
    client = await aiohttp_client(scripted_app("Hello world"))
    hist = {"model": "m", "max_tokens": 100, "system": "sys", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "file body"}]}]}]}
    d = await (await client.post("/v1/messages", json=hist)).json()
    assert d["content"] == [{"type": "text", "text": "Hello world"}] and d["stop_reason"] == "end_turn"
    d = await (await client.post("/v1/messages", json={**hist, "max_tokens": 3})).json()
    assert d["stop_reason"] == "max_tokens" and d["content"][0]["text"] == "Hel"
    d = await (await client.post("/v1/messages", json={**hist, "stop_sequences": ["wor"]})).json()
    assert d["stop_reason"] == "stop_sequence" and d["stop_sequence"] == "wor"


async def test_count_tokens_and_billing_header_stripped(aiohttp_client):
    app = scripted_app("x")
    client = await aiohttp_client(app)
    r = await client.post("/v1/messages/count_tokens", json=BODY)
    n = (await r.json())["input_tokens"]
    # FakeChatTemplate renders "<s><|role|>content\n" per message: the billing block is gone
    expect = len(("<|system|>You are helpful.\n<|user|>read main.py\n<|assistant|>").encode()) + 1
    assert n == expect
    body2 = {**BODY, "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=zzz"}, BODY["system"][1]]}
    assert (await (await client.post("/v1/messages/count_tokens", json=body2)).json())["input_tokens"] == n


async def test_messages_errors_in_anthropic_envelope(aiohttp_client):
    client = await aiohttp_client(make_app(model=ScriptedModel("x", n_ctx_train=64)))
    r = await client.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "y" * 500}]})
    d = await r.json()
    assert r.status == 400 and d["type"] == "error"
    assert d["error"]["type"] == "invalid_request_error" and "prompt is too long" in d["error"]["message"]
    r = await client.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]})
    assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
