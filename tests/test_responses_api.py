"""POST /v1/responses (OpenAI Responses API, stateless; for Codex CLI)."""
import json

from test_toolcalls import QWEN3, scripted_app

TOOLS = [{"type": "function", "name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}},
    {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}},
    {"type": "web_search"}, {"type": "local_shell"}]
CALLS = [("read_file", {"path": "src/main.py", "limit": 50}), ("get_weather", {"location": "Paris, FR"})]


async def test_responses_non_stream_function_calls(aiohttp_client):
    client = await aiohttp_client(scripted_app(QWEN3))
    r = await client.post("/v1/responses", json={"model": "gpt-5-codex", "instructions": "be brief",
                                                 "input": "read main.py", "tools": TOOLS, "store": False,
                                                 "reasoning": {"effort": "low"}, "include": []})
    d = await r.json()
    assert r.status == 200, d
    assert d["object"] == "response" and d["status"] == "completed"
    assert [o["type"] for o in d["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert d["output"][1]["content"][0]["text"] == "Let me read it.\n"
    fcs = d["output"][2:]
    assert [(f["name"], json.loads(f["arguments"])) for f in fcs] == CALLS
    assert all(f["id"].startswith("fc_") and f["call_id"].startswith("call_") for f in fcs)
    u = d["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert u["output_tokens_details"]["reasoning_tokens"] > 0


async def test_responses_stream_lifecycle(aiohttp_client):
    client = await aiohttp_client(scripted_app(QWEN3))
    r = await client.post("/v1/responses", json={"input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "earlier"}]},
        {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{\"path\": \"a\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "body"}],
        "tools": TOOLS, "stream": True})
    evs = []
    async for raw in r.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            evs.append(json.loads(line[6:]))
    types = [e["type"] for e in evs]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.output_text.delta" in types and "response.output_text.done" in types
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert text == "Let me read it.\n"
    done = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["reasoning", "message", "function_call", "function_call"]
    assert [(i["name"], json.loads(i["arguments"])) for i in done[2:]] == CALLS
    added = [e for e in evs if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1, 2, 3]
    final = evs[-1]["response"]
    assert final["status"] == "completed" and len(final["output"]) == 4 and final["usage"]["output_tokens"] > 0


async def test_responses_plain_text_and_incomplete(aiohttp_client):
    client = await aiohttp_client(scripted_app("Hello world"))
    d = await (await client.post("/v1/responses", json={"input": "hi"})).json()
    assert [o["type"] for o in d["output"]] == ["message"] and d["output"][0]["content"][0]["text"] == "Hello world"
    d = await (await client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 3})).json()
    assert d["status"] == "incomplete" and d["incomplete_details"]["reason"] == "max_output_tokens"


async def test_responses_context_overflow_code(aiohttp_client):
    client = await aiohttp_client(scripted_app("x", n_ctx=64))
    r = await client.post("/v1/responses", json={"input": "y" * 500})
    d = await r.json()
    assert r.status == 400 and d["error"]["code"] == "context_length_exceeded"
    r = await client.post("/v1/responses", json={"input": 5})
    assert r.status == 400
