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
    from llmcore.server import prompt as P

    seen = {}
    orig = P.tokenize_prompt

    def slow_tokenize(eng, prompt, field="prompt"):
        seen["thread"] = threading.current_thread() is not threading.main_thread()
        time.sleep(0.5)
        return [1, 3 + ord("a")]

    monkeypatch.setattr(P, "tokenize_prompt", slow_tokenize)
    gen = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "y" * 100_000, "max_tokens": 2}))
    await asyncio.sleep(0.1)
    t0 = time.perf_counter()
    r = await client.get("/health")
    assert r.status == 200
    assert time.perf_counter() - t0 < 0.3  # not stuck behind the 0.5 s tokenization
    r = await gen
    assert r.status == 200 and (await r.json())["choices"][0]["text"] == "bc"
    assert seen["thread"] and orig is not None


# ---- parsers --------------------------------------------------------------------------------

import json  # noqa: E402

from llmcore.toolcalls import OutputParser, detect_format, parse_output, prompt_ends_in_think  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}, "env": {"type": "object"}}}}},
]

QWEN3 = ('<think>\nThe user wants the file. I should call read_file.\n</think>\n\n'
         'Let me read it.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "src/main.py", "limit": 50}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris, FR"}}\n</tool_call>')
QWEN3_CODER = ('I will run it.\n<tool_call>\n<function=run>\n<parameter=cmd>\nprint("a")\nprint(\'b\')\n</parameter>\n'
               '<parameter=env>\n{"X": 1}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=read_file>\n'
               '<parameter=path>\na.py\n</parameter>\n<parameter=limit>\n10\n</parameter>\n</function>\n</tool_call>')
HERMES_RAW_NL = ('<tool_call>\n{"name": "run", "arguments": {"cmd": "line1\nline2\t\\"q\\""}}\n</tool_call>')
LLAMA3 = '{"name": "get_weather", "parameters": {"location": "Berlin"}}'
LLAMA3_TAG = '<|python_tag|>{"name": "read_file", "parameters": {"path": "x"}}; {"name": "get_weather", "parameters": {"location": "Rome"}}'
MISTRAL = 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Oslo"}}, {"name": "read_file", "arguments": {"path": "b"}}]'
MISTRAL_V11 = '[TOOL_CALLS]get_weather[ARGS]{"location": "Lima"}[TOOL_CALLS]read_file[ARGS]{"path": "c.txt"}'
HARMONY = ('<|channel|>analysis<|message|>Need weather. Call tool.<|end|><|start|>assistant<|channel|>commentary '
           'to=functions.get_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>')
HARMONY_FINAL = '<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!<|return|>'

CASES = [
    ("hermes", QWEN3, "Let me read it.\n", "The user wants the file. I should call read_file.",
     [("read_file", {"path": "src/main.py", "limit": 50}), ("get_weather", {"location": "Paris, FR"})]),
    ("qwen3coder", QWEN3_CODER, "I will run it.\n", "",
     [("run", {"cmd": "print(\"a\")\nprint('b')", "env": {"X": 1}}), ("read_file", {"path": "a.py", "limit": 10})]),
    ("hermes", HERMES_RAW_NL, "", "", [("run", {"cmd": "line1\nline2\t\"q\""})]),
    ("llama3", LLAMA3, "", "", [("get_weather", {"location": "Berlin"})]),
    ("llama3", LLAMA3_TAG, "", "", [("read_file", {"path": "x"}), ("get_weather", {"location": "Rome"})]),
    ("mistral", MISTRAL, "Sure.", "", [("get_weather", {"location": "Oslo"}), ("read_file", {"path": "b"})]),
    ("mistral", MISTRAL_V11, "", "", [("get_weather", {"location": "Lima"}), ("read_file", {"path": "c.txt"})]),
    ("harmony", HARMONY, "", "Need weather. Call tool.", [("get_weather", {"location": "San Francisco"})]),
    ("harmony", HARMONY_FINAL, "Hello there!", "Simple.", []),
]


def stream(fmt, pieces, **kw):
    p = OutputParser(fmt, tools=TOOLS, **kw)
    ds = []
    for x in pieces:
        ds += p.feed(x)
    ds += p.finish()
    r = {"content": "", "reasoning": "", "calls": []}
    for d in ds:
        if d.kind in ("content", "reasoning"):
            r[d.kind] += d.text
        elif d.kind == "call":
            assert d.index == len(r["calls"]) and d.id.startswith("call_") and d.name
            r["calls"].append([d.name, ""])
        else:
            r["calls"][d.index][1] += d.text
    return r, p


@pytest.mark.parametrize("fmt,text,content,reasoning,calls", CASES)
def test_parse_whole(fmt, text, content, reasoning, calls):
    p = parse_output(text, fmt, tools=TOOLS)
    assert p.content == content
    assert p.reasoning == reasoning
    assert [(c.name, json.loads(c.arguments)) for c in p.calls] == calls
    assert len({c.id for c in p.calls}) == len(calls)
    for marker in ("<tool_call>", "<function", "[TOOL_CALLS]", "<|", "python_tag", "[ARGS]"):
        assert marker not in p.content


@pytest.mark.parametrize("fmt,text,content,reasoning,calls", CASES)
def test_stream_every_split(fmt, text, content, reasoning, calls):
    want = parse_output(text, fmt, tools=TOOLS)
    want = {"content": want.content, "reasoning": want.reasoning,
            "calls": [[c.name, c.arguments] for c in want.calls]}
    for k in range(len(text) + 1):
        got, _ = stream(fmt, [text[:k], text[k:]])
        assert got == want, k
    got, _ = stream(fmt, list(text))  # one character at a time
    assert got == want


def test_no_tools_keeps_markup_as_content_but_splits_think():
    p = parse_output(QWEN3, "hermes", tools=None)
    assert p.calls == [] and p.content.startswith("Let me read it.\n<tool_call>")
    assert p.reasoning.startswith("The user wants")


def test_think_forced_open_and_unclosed():
    p = parse_output("still thinking\n</think>\n\nAnswer.", "hermes", start_in_reasoning=True)
    assert (p.reasoning, p.content) == ("still thinking", "Answer.")
    p = parse_output("<think>\nnever ends", "hermes")
    assert (p.reasoning, p.content) == ("never ends", "")
    assert prompt_ends_in_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_ends_in_think("<|im_start|>assistant\n")


def test_broken_call_falls_back_to_content():
    text = "<tool_call>\nnot json at all\n</tool_call> ok"
    p = parse_output(text, "hermes", tools=TOOLS)
    assert p.calls == [] and "not json at all" in p.content
    got, _ = stream("hermes", list(text))
    assert got["calls"] == [] and got["content"] == p.content


def test_unclosed_call_at_eos_is_repaired():
    p = parse_output('<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"', "hermes", tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in p.calls] == [("read_file", {"path": "a.py"})]


def test_not_parallel_keeps_first_call():
    p = OutputParser("hermes", tools=TOOLS, parallel=False).parse_all(QWEN3)
    assert [c.name for c in p.calls] == ["read_file"]


def test_streamed_args_are_fragments():
    _, p = stream("hermes", list(QWEN3))
    # split char by char: the arguments arrive in several fragments, the name once
    ds = []
    q = OutputParser("hermes", tools=TOOLS)
    for ch in QWEN3:
        ds += q.feed(ch)
    ds += q.finish()
    assert sum(1 for d in ds if d.kind == "call") == 2
    assert sum(1 for d in ds if d.kind == "args" and d.index == 0) > 5


def test_detect_format():
    assert detect_format("{% for m in messages %}<tool_call>{% endfor %}") == "hermes"
    assert detect_format("<tool_call>\n<function=x>\n<parameter=y>") == "qwen3coder"
    assert detect_format("<|start|>{{ m }}<|channel|>") == "harmony"
    assert detect_format("", "gpt-oss") == "harmony"
    assert detect_format("[AVAILABLE_TOOLS] [TOOL_CALLS]") == "mistral"
    assert detect_format("<|python_tag|> ipython") == "llama3"
    assert detect_format(None) == "hermes"
    assert detect_format("{{ '<|tool_call_start|>' }} <|tool_list_start|>") == "lfm2"
    assert detect_format("<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>") == "glm45"
    assert detect_format("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>") == "deepseek"
    assert detect_format("<|tool_calls_section_begin|><|tool_call_begin|>") == "kimi_k2"

    from llmcore.toolcalls import FORMATS, NEEDS_SPECIAL

    assert set(FORMATS) == {"hermes", "qwen3coder", "llama3", "mistral", "harmony", "lfm2", "glm45",
                            "deepseek", "kimi_k2", "generic"}
    assert NEEDS_SPECIAL == {"mistral", "harmony", "lfm2", "glm45", "deepseek", "kimi_k2"}


def _stream_matches_whole(fmt, text, **kw):
    want = parse_output(text, fmt, tools=TOOLS, **kw)
    want = {"content": want.content, "reasoning": want.reasoning,
            "calls": [[c.name, c.arguments] for c in want.calls]}
    for k in range(len(text) + 1):
        assert stream(fmt, [text[:k], text[k:]], **kw)[0] == want, k
    assert stream(fmt, list(text), **kw)[0] == want
    return want


def test_bare_function_after_text():
    """A bare <function=..> call after text longer than the call: the text after the call
    is content again (this once re-read the call forever)."""
    text = "Some text that is longer than the call: <function=run><parameter=cmd>ls</parameter></function> done"
    got = _stream_matches_whole("qwen3coder", text)
    assert got["content"] == "Some text that is longer than the call:  done"
    assert [(n, json.loads(a)) for n, a in got["calls"]] == [("run", {"cmd": "ls"})]


@pytest.mark.parametrize("fmt,text", [
    # a block closed while its JSON is unfinished: the closer is not streamed as arguments
    ("hermes", '<tool_call>{"name": "run", "arguments": {"cmd": "a</tool_call> after'),
    # arguments before the name: a call once the object is complete, never content
    ("llama3", '{"arguments": {"cmd": "x"}, "name": "run"}'),
    ("hermes", '<tool_call>{"arguments": {"cmd": "x"}, "name": "run"}</tool_call>'),
    # parameters with markup in their values, and text between them
    ("qwen3coder", "<tool_call><function=run>\n<parameter=cmd>\na <b>\n</parameter> x "
                   "<parameter=\nno>\n<parameter=env>{}</parameter></function></tool_call>"),
    ("mistral", 'a[TOOL_CALLS] [ {"name": "run", "arguments": {"cmd": "]"}} , 12, {"name": "read_file"} ]'),
    ("harmony", '<|start|>assistant to=functions.run<|channel|>commentary<|message|> {"cmd": "a\nb"} <|call|>'),
])
def test_stream_matches_whole(fmt, text):
    _stream_matches_whole(fmt, text)


def test_invalid_escape_in_a_name_is_not_a_crash():
    p = parse_output('<tool_call>{"name": "r\\q", "arguments": {}</tool_call>', "hermes", tools=TOOLS)
    assert p.calls == [] and "r\\q" in p.content
    _stream_matches_whole("hermes", '<tool_call>{"name": "r\\q", "arguments": {}</tool_call>')


@pytest.mark.parametrize("fmt", ["hermes", "qwen3coder", "llama3", "mistral", "harmony"])
def test_streaming_a_long_argument_is_linear(fmt):
    """A 100k-character argument streamed a few characters at a time: each piece is read
    once (re-parsing the whole text at each piece took minutes)."""
    value = ("def f(x):\n    return {'a': [x, 2]}\t# done\n" * 2500)[:100_000]
    raw = json.dumps(value, ensure_ascii=False)[1:-1].replace("\\n", "\n")  # raw newlines, as models write
    text = {
        "hermes": '<tool_call>\n{"name": "run", "arguments": {"cmd": "' + raw + '"}}\n</tool_call>',
        "qwen3coder": "<tool_call>\n<function=run>\n<parameter=cmd>\n" + value + "\n</parameter>\n</function>\n</tool_call>",
        "llama3": '{"name": "run", "parameters": {"cmd": "' + raw + '"}}',
        "mistral": '[TOOL_CALLS]run[ARGS]{"cmd": "' + raw + '"}',
        "harmony": '<|channel|>commentary to=functions.run<|message|>{"cmd": "' + raw + '"}<|call|>',
    }[fmt]
    t0 = time.perf_counter()
    got, p = stream(fmt, [text[i:i + 4] for i in range(0, len(text), 4)])
    dt = time.perf_counter() - t0
    assert [(n, json.loads(a)) for n, a in got["calls"]] == [("run", {"cmd": value})]
    assert dt < 10, f"{dt:.1f} s"


def test_incremental_json_scan_matches_whole():
    import random

    from llmcore.toolcalls.jsontext import JsonScan, sanitize

    rng = random.Random(0)
    for _ in range(300):
        s = "".join(rng.choice(['{', '}', '[', ']', '"', '\\', 'a', '\n', '\t', '\x01', ' ']) for _ in range(rng.randint(1, 40)))
        whole = "".join(c if c >= " " else "?" for c in s)  # reference: a char-by-char escape
        out, in_str, esc = [], False, False
        for c in s:
            if in_str:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    in_str = False
                elif c < " ":
                    c = {"\n": "\\n", "\t": "\\t"}.get(c, "\\u%04x" % ord(c))
            elif c == '"':
                in_str = True
            out.append(c)
        whole = "".join(out)
        assert sanitize(s) == whole
        scan, parts, i = JsonScan(), [], 0
        while i < len(s):
            k = rng.randint(1, 5)
            parts.append(scan.feed(s[i:i + k], sanitize=True, stop_at_close=False)[0])
            i += k
        assert "".join(parts) == whole, s


def test_marker_scan_matches_find():
    import random

    from llmcore.toolcalls.scan import MarkerScan

    rng = random.Random(1)
    markers = ["</tool_call>", "<tool_call>", "<|end|>"]
    for _ in range(300):
        s = "".join(rng.choice(["<", "/", "tool_call>", "<tool_", "x", "<|end", "|>", "</tool_call>"]) for _ in range(rng.randint(1, 12)))
        hits = [(s.find(m), m) for m in markers if m in s]
        want = (s[:min(hits)[0]], min(hits)[1]) if hits else (s, None)
        scan, before, i = MarkerScan(markers), "", 0
        found = None
        while i < len(s) and found is None:
            k = rng.randint(1, 4)
            f = scan.feed(s[i:i + k])
            before += f.before
            found = f.marker
            i += k
        if found is None:
            before += scan.flush()
        assert (before, found) == want, s


# ---- through the server (a model scripted to emit given text) -----------------------------

from fakes import EOS, N_SPECIAL, FakeModel as _FM  # noqa: E402

import numpy as np  # noqa: E402

MARK = [b + N_SPECIAL for b in b"<|assistant|>"]


class ScriptedModel(_FM):
    """Greedy output = the script (bytes), after the last '<|assistant|>' in the context."""

    def __init__(self, script: str, **kw):
        super().__init__(**kw)
        self.script = [b + N_SPECIAL for b in script.encode()] + [EOS]

    def forward(self, batch, argmax=None):
        out = np.full((len(batch), self.n_vocab), -10.0, dtype=np.float32)
        for i, (state, toks) in enumerate(batch):
            state.tokens.extend(int(t) for t in toks)
            t = state.tokens
            start = max((j + len(MARK) for j in range(len(t) - len(MARK) + 1) if t[j:j + len(MARK)] == MARK), default=len(t))
            k = len(t) - start
            out[i, self.script[min(k, len(self.script) - 1)]] = 10.0
        self.forward_calls += 1
        if argmax is not None:
            argmax[:] = np.argmax(out, axis=1)
        return out


def scripted_app(script, n_ctx=0):
    return make_app(model=ScriptedModel(script, n_ctx_train=4096), n_ctx=n_ctx)


async def sse(resp):
    frames = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            frames.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return frames


CHAT = {"messages": [{"role": "user", "content": "read main.py"}], "tools": TOOLS, "max_tokens": 1000}


async def test_chat_tool_calls_non_stream(aiohttp_client):
    client = await aiohttp_client(scripted_app(QWEN3))
    r = await client.post("/v1/chat/completions", json=CHAT)
    d = await r.json()
    assert r.status == 200, d
    ch = d["choices"][0]
    msg = ch["message"]
    assert ch["finish_reason"] == "tool_calls"
    assert msg["content"] == "Let me read it.\n"
    assert msg["reasoning_content"] == "The user wants the file. I should call read_file."
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == \
        [("function", "read_file", {"path": "src/main.py", "limit": 50}), ("function", "get_weather", {"location": "Paris, FR"})]
    assert all(c["id"].startswith("call_") for c in msg["tool_calls"])
    u = d["usage"]
    assert 0 < u["completion_tokens_details"]["reasoning_tokens"] < u["completion_tokens"]


async def test_chat_tool_calls_stream(aiohttp_client):
    client = await aiohttp_client(scripted_app(QWEN3))
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    frames = await sse(r)
    assert frames[-1] == "[DONE]"
    chunks = [f for f in frames[:-1] if f["choices"]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)
    assert content == "Let me read it.\n" and "<tool_call>" not in content and "<think>" not in content
    assert reasoning == "The user wants the file. I should call read_file."
    calls = {}
    for c in chunks:
        for tc in c["choices"][0]["delta"].get("tool_calls") or []:
            if "id" in tc:
                assert tc["index"] not in calls and tc["type"] == "function"
                calls[tc["index"]] = [tc["id"], tc["function"]["name"], tc["function"]["arguments"]]
            else:
                assert "name" not in tc["function"]
                calls[tc["index"]][2] += tc["function"]["arguments"]
    assert [(n, json.loads(a)) for _, n, a in calls.values()] == \
        [("read_file", {"path": "src/main.py", "limit": 50}), ("get_weather", {"location": "Paris, FR"})]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    usage = frames[-2]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] > 0


async def test_chat_tool_choice_none_and_no_tools(aiohttp_client):
    client = await aiohttp_client(scripted_app(QWEN3))
    for body in ({**CHAT, "tool_choice": "none"}, {k: v for k, v in CHAT.items() if k != "tools"}):
        d = await (await client.post("/v1/chat/completions", json=body)).json()
        m = d["choices"][0]["message"]
        assert "tool_calls" not in m and "<tool_call>" in m["content"]
        assert d["choices"][0]["finish_reason"] == "stop"


async def test_chat_named_tool_choice_and_parallel(aiohttp_client):
    client = await aiohttp_client(scripted_app(QWEN3))
    d = await (await client.post("/v1/chat/completions", json={**CHAT, "parallel_tool_calls": False})).json()
    assert [c["function"]["name"] for c in d["choices"][0]["message"]["tool_calls"]] == ["read_file"]
    r = await client.post("/v1/chat/completions", json={**CHAT, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert r.status == 400


def test_reasoning_on_input_reaches_template():
    from llmcore.chat import ChatTemplate

    t = ChatTemplate("{% for m in messages %}[{{ m.reasoning_content }}|{{ m.thinking }}|{{ m.content }}]{% endfor %}")
    out = t.render([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r1"},
                    {"role": "assistant", "content": "b", "reasoning_content": "r2"}])
    assert "[r1|r1|a]" in out and "[r2|r2|b]" in out


# ---- the block-per-call formats (blocks.py) and the generic format ---------------------------

NEW_FORMATS = [
    ("lfm2", 'Sure. <|tool_call_start|>[run(cmd="ls -l", n=2), read_file(path="a.txt")]<|tool_call_end|> ok',
     "Sure.  ok", [("run", {"cmd": "ls -l", "n": 2}), ("read_file", {"path": "a.txt"})]),
    ("glm45", "Let me.\n<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>",
     "Let me.\n", [("run", {"cmd": "ls"})]),
    ("deepseek", "x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>run\n```json\n"
                 '{"cmd": "ls"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{"path": "b"}'
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "x", [("run", {"cmd": "ls"}), ("read_file", {"path": "b"})]),
    ("kimi_k2", "a<|tool_calls_section_begin|><|tool_call_begin|>functions.run:0<|tool_call_argument_begin|>"
                '{"cmd": "ls"}<|tool_call_end|><|tool_calls_section_end|>b',
     "ab", [("run", {"cmd": "ls"})]),
    ("generic", ' {"tool_calls": [{"name": "run", "arguments": {"cmd": "ls"}}]}', "", [("run", {"cmd": "ls"})]),
    ("generic", '{"response": "Hello there"}', "Hello there", []),
    ("generic", "Just words {not json}", "Just words {not json}", []),
]


@pytest.mark.parametrize("fmt,text,content,calls", NEW_FORMATS)
def test_new_formats_stream_as_they_parse_whole(fmt, text, content, calls):
    got = _stream_matches_whole(fmt, text)
    assert got["content"] == content
    assert [(n, json.loads(a)) for n, a in got["calls"]] == calls


@pytest.mark.parametrize("fmt,text", [
    ("lfm2", "<|tool_call_start|>[run(cmd=os.system('x'))]<|tool_call_end|>"),  # not a literal: never run
    ("lfm2", "<|tool_call_start|>[run(cmd=]<|tool_call_end|>"),
    ("glm45", "<tool_call>run\n<arg_key>cmd</arg_key> stray text\n</tool_call>"),
    ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>run<｜tool▁sep｜>{broken<｜tool▁call▁end｜>"),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.run:0{no args marker}<|tool_call_end|>"),
    ("generic", '{"tool_calls": [{"arguments": {}}]}'),
])
def test_a_call_that_does_not_parse_comes_back_as_content(fmt, text):
    p = parse_output(text, fmt, tools=TOOLS)
    assert not p.calls and p.content.strip()
    _stream_matches_whole(fmt, text)


def test_block_formats_stream_linearly():
    """A long argument in a block format: each piece is scanned once (the block is
    parsed once, when it closes)."""
    import time

    body = "x" * 200_000
    text = f'<|tool_call_start|>[run(cmd="{body}")]<|tool_call_end|>'
    q = OutputParser("lfm2", tools=TOOLS)
    t0 = time.perf_counter()
    for i in range(0, len(text), 7):
        q.feed(text[i:i + 7])
    q.finish()
    assert time.perf_counter() - t0 < 5 and json.loads(q.calls[0].arguments)["cmd"] == body


@pytest.mark.parametrize("pieces, expected", [
    # a think block cut anywhere between events: the tokens from the one completing its
    # start to the one before the one completing its end count
    (["  <th", "ink>a", "b</th", "ink>", "answer"], 2),
    (["<think>", "x" * 5000, "</think>", "y"], 2),
    (["plain ", "<think>", "no"], 0),  # <think> not at the start: content
    (["<|channel|>anal", "ysis<|message|>hm", "<|end|><|channel|>fin", "al<|message|>ok"], 2),
])
def test_collected_output_counts_reasoning_tokens_across_event_cuts(pieces, expected):
    from llmcore.engine import TokenEvent
    from llmcore.server.encoders.chat_output import ChatOutput
    from llmcore.server.prompt import Prompt

    out = ChatOutput(None, Prompt(tokens=[1]))
    for p in pieces:
        out.collect(TokenEvent(tokens=[0], text=p))
    assert out.reasoning_tokens == expected
    assert out.text == "".join(pieces)
