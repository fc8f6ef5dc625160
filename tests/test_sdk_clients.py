"""The official clients against a real server on SmolLM2 (a loopback socket, the path
`llmcore serve` takes): OpenAI's structured output and tool calls, Anthropic's forced
tool use, instructor's modes, a GBNF grammar on /completion, API keys, embeddings.

SmolLM2 has no tools section in its template, so its calls are in the generic format:
what is asserted is what a client relies on, a call that parses and fits the schema."""
import json
from typing import Literal

import numpy as np
import pytest

from live_server import LiveServer

pydantic = pytest.importorskip("pydantic")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.realmodel

KEY = "test-key-1"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}},
                   "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Weather(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(max_length=40)
    unit: Literal["celsius", "fahrenheit"]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=0, le=150)


@pytest.fixture(scope="module")
def server(smollm2_path):
    from llmcore.engine import Engine, EngineConfig
    from llmcore.sampling import SamplingParams
    from llmcore.server import ServerConfig

    eng = Engine.from_path(smollm2_path, EngineConfig(n_ctx=4096, n_parallel=2, cache_ram_mib=256,
                                                      sampling=SamplingParams(temperature=0.0)))
    with LiveServer(eng, ServerConfig(api_keys=(KEY,))) as srv:
        assert eng.wait_ready(120)
        yield srv


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def test_openai_parse_json_schema(oai):
    r = oai.chat.completions.parse(model="smollm2", messages=[{"role": "user", "content": "Invent a person."}],
                                   response_format=Person, max_tokens=60)
    p = r.choices[0].message.parsed
    assert isinstance(p, Person) and 0 <= p.age <= 150
    Person.model_validate_json(r.choices[0].message.content)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_openai_forced_tool_call(oai, choice):
    r = oai.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                    max_tokens=80)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls
    calls = c.message.tool_calls
    if isinstance(choice, dict):
        assert [x.function.name for x in calls] == ["get_weather"]
    for x in calls:
        args = json.loads(x.function.arguments)
        assert x.function.name in ("get_weather", "get_time")
        if x.function.name == "get_weather":
            Weather.model_validate(args)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_openai_forced_tool_call_streamed(oai, choice):
    stream = oai.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice=choice,
                                         max_tokens=80, stream=True)
    names, args, finish = {}, {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        for tc in ch.delta.tool_calls or []:
            if tc.function.name:
                names[tc.index] = tc.function.name
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        finish = ch.finish_reason or finish
    assert finish == "tool_calls" and names and set(names.values()) == {"get_weather"}
    for i in names:
        Weather.model_validate_json(args[i])


def test_anthropic_forced_tool_use(claude):
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": WEATHER["function"]["parameters"]}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        m = claude.messages.create(model="smollm2", max_tokens=80, messages=ASK, tools=tools, tool_choice=choice)
        assert m.stop_reason == "tool_use"
        use = [b for b in m.content if b.type == "tool_use"]
        assert use and use[0].name == "get_weather"
        Weather.model_validate(use[0].input)
    with claude.messages.stream(model="smollm2", max_tokens=80, messages=ASK, tools=tools,
                                tool_choice={"type": "any"}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    Weather.model_validate([b for b in final.content if b.type == "tool_use"][0].input)


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor_modes(oai, mode):
    instructor = pytest.importorskip("instructor")
    client = instructor.from_openai(oai, mode=getattr(instructor.Mode, mode))
    p = client.chat.completions.create(model="smollm2", response_model=Person, max_retries=0, max_tokens=80,
                                       messages=[{"role": "user", "content": "Invent a person."}])
    assert isinstance(p, Person)


def test_gbnf_grammar_on_completion(server):
    import urllib.request

    body = {"prompt": "The answer is", "n_predict": 16,
            "grammar": 'root ::= " " ("yes" | "no") "." [0-9]{2}'}
    req = urllib.request.Request(server.url + "/completion", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        d = json.loads(r.read())
    text = d["content"]
    assert text.split(".")[0] in (" yes", " no") and text.split(".")[1].isdigit() and d["stop_type"] == "eos"


def test_api_key_accepted_missing_wrong(server, oai):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model="smollm2", max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + "/v1/messages", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"max_tokens": 4, "messages": ASK}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 401 and json.loads(e.value.read())["type"] == "error"
    assert oai.models.list().data[0].id == "SmolLM2-135M-Instruct.Q4_1.gguf"  # the next request is served
    assert oai.models.retrieve("SmolLM2-135M-Instruct.Q4_1.gguf").id == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_embeddings_shape_and_cosine_order(oai):
    texts = ["The cat sat on the mat.", "A cat is sitting on a rug.", "Quarterly tax revenue rose by 4 percent."]
    r = oai.embeddings.create(model="smollm2", input=texts)
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, 576) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-4)
    assert v[0] @ v[1] > v[0] @ v[2] and v[0] @ v[1] > v[1] @ v[2]
    assert r.usage.prompt_tokens > 0
