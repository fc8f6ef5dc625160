"""Hardening: no request can stall or crash the server, no web page or foreign host can
drive it, a slow or stuck client holds a connection for a bounded time.

Every test here goes through a real loopback socket (tests/live_server.py: the listener
`llmcore serve` uses), the server on its own event loop in a thread."""
import asyncio
import gzip
import json
import logging
import random
import socket
import time

import aiohttp
import pytest

from fakes import FakeChatTemplate, FakeModel, FakeTokenizer
from fixtures import tiny_models  # noqa: F401
from live_server import LiveServer
from llmcore.chat import ChatTemplate
from llmcore.engine import Engine, EngineConfig
from llmcore.engine.config import MAX_STOP_CHARS, MAX_STOP_STRINGS
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig
from llmcore.server.access import check_host, host_name, is_loopback_address, warn_if_exposed

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "abc"}]
GAP_S = 0.5  # a stream's largest pause between tokens, and /health's answer time
_quiet_gap = [0.0]  # the last stream's largest pause before the attack (this machine's noise)


def allowed_gap() -> float:
    """GAP_S, or twice the pause the stream already had before the attack when the machine
    itself is that busy (other processes on 2 cores): the attack must not add a stall."""
    return max(GAP_S, 2.0 * _quiet_gap[0])


def fake_engine(delay=0.0, n_ctx=256, template=None, np_=2, **cfg):
    return Engine(EngineConfig(n_parallel=np_, sampling=SamplingParams(temperature=0.0), **cfg),
                  model=FakeModel(n_ctx_train=n_ctx, delay=delay), tokenizer=FakeTokenizer(),
                  chat_template=template or FakeChatTemplate(), info={"name": "fake"})


def server(eng=None, **cfg) -> LiveServer:
    cfg.setdefault("keepalive_s", 0.05)
    return LiveServer(eng or fake_engine(), ServerConfig(**cfg))


async def post(session, url, body=None, data=None, headers=None):
    async with session.post(url, json=body, data=data, headers=headers) as r:
        return r.status, await r.read()


# ---- one request cannot freeze the others -------------------------------------------------


async def stalls_while(srv: LiveServer, attack) -> tuple[float, float, object, float]:
    """Run `attack(session)` while a stream runs and /health is polled: (the stream's
    largest gap between tokens, the slowest /health, the attack's result, its duration)."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        stream = await session.post(srv.url + "/completion", json={
            "prompt": "a", "n_predict": 100_000, "ignore_eos": True, "stream": True})
        assert stream.status == 200
        times: list[float] = []

        async def read():
            async for line in stream.content:
                if line.startswith(b"data: "):
                    times.append(loop.time())

        reader = asyncio.create_task(read())
        while len(times) < 5:
            await asyncio.sleep(0.01)
        q0 = loop.time()  # a second of the stream alone: how much the machine pauses it
        await asyncio.sleep(1.0)
        quiet = [t for t in times if t >= q0]
        _quiet_gap[0] = max((b - a for a, b in zip(quiet, quiet[1:])), default=0.0)
        health: list[float] = []
        done = asyncio.Event()

        async def poll():
            while not done.is_set():
                t0 = loop.time()
                async with session.get(srv.url + "/health") as r:
                    assert r.status == 200
                    await r.read()
                health.append(loop.time() - t0)
                await asyncio.sleep(0.05)

        poller = asyncio.create_task(poll())
        t0 = loop.time()
        result = await attack(session)
        t1 = loop.time()
        await asyncio.sleep(0.3)
        done.set()
        await poller
        reader.cancel()
        stream.close()
    window = [t for t in times if t >= t0 - 1.0]
    gaps = [b - a for a, b in zip(window, window[1:])]
    assert len(window) > 10, "the stream stopped"
    return max(gaps), max(health), result, t1 - t0


async def test_a_2mb_tokenize_does_not_stall_a_stream_or_health():
    text = "abcdefgh " * (2 * 1024 * 1024 // 9)

    async def attack(session):
        async with session.post(srv.url + "/tokenize", json={"content": text}) as r:
            return r.status, len(await r.read())

    # a context that could hold it: tokenized (in a worker), seconds of work
    with server(fake_engine(delay=0.01, n_ctx=4_000_000)) as srv:
        gap, health, (status, n), took = await stalls_while(srv, attack)
    print(f"2 MB /tokenize: {took:.2f} s, stream gap {gap:.3f} s, /health {health:.3f} s")
    assert status == 200 and n > len(text)
    assert gap < allowed_gap() and health < allowed_gap(), (gap, health, took)
    # the usual context: refused at once, before any tokenizing
    with server(fake_engine(delay=0.01)) as srv:
        gap, health, (status, _), took = await stalls_while(srv, attack)
    assert status == 413 and took < 1.0
    assert gap < allowed_gap() and health < allowed_gap()


async def test_a_gzip_body_expanding_to_60mb_is_refused_while_it_expands():
    raw = json.dumps({"messages": [{"role": "user", "content": "a" * 60_000_000}]}).encode()
    body = gzip.compress(raw, 6)
    assert len(body) < 200_000

    async def attack(session):
        return await post(session, srv.url + CHAT, data=body,
                          headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})

    with server(fake_engine(delay=0.01)) as srv:
        gap, health, (status, out), took = await stalls_while(srv, attack)
    assert status == 413 and "once decoded" in json.loads(out)["error"]["message"]
    assert gap < allowed_gap() and health < allowed_gap(), (gap, health, took)


# a template that loops without output (only the time limit stops it), one that writes
# gigabytes, one that doubles a string
HOSTILE_TEMPLATES = {
    "spins": "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
    "writes": "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
    "doubles": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
               "{% endfor %}{{ ns.s }}",
}


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
async def test_a_hostile_template_is_stopped_without_stalling(name):
    eng = fake_engine(delay=0.01, template=ChatTemplate(HOSTILE_TEMPLATES[name]))

    async def attack(session):
        return await post(session, srv.url + CHAT, {"messages": MSG})

    with server(eng, template_timeout_s=1.0) as srv:
        gap, health, (status, out), took = await stalls_while(srv, attack)
    msg = json.loads(out)["error"]["message"]
    assert status == 400 and took < 3.0, (status, msg, took)
    assert ("took longer than 1 s" in msg) if name == "spins" else ("context" in msg)
    assert gap < allowed_gap() and health < allowed_gap(), (gap, health, took)


@pytest.mark.parametrize("source", [
    "{{ 'x' * 100000000 }}", "{{ 'x'.ljust(100000000) }}", "{{ 'x' | center(100000000) }}",
    "{{ '%0999999999d' % 1 }}", "{{ '%*d' % (999999999, 1) }}", "{{ '{:>999999999}'.format(1) }}",
    "{{ '{:>{}}'.format(1, 999999999) }}", "{{ range(10) | batch(100000000, 'x') | list | length }}",
    "{{ range(100000) | join('x' * 1000) }}",
    "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s | replace('x', 'xx') %}{% endfor %}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{{ messages | tojson(indent=100000000) }}",
])
def test_template_tricks_that_build_huge_strings_stop_at_the_size_limit(source):
    from llmcore.chat import RenderLimits, TemplateLimitError

    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitError):
        ChatTemplate(source).render(MSG, limits=RenderLimits(max_chars=100_000, timeout_s=5.0))
    assert time.perf_counter() - t0 < 1.0
    # the same template without limits is the caller's own business: not refused here
    assert ChatTemplate("{{ 'ab' * 3 }}").render(MSG, limits=RenderLimits(max_chars=6)) == "ababab"


def test_real_templates_render_the_same_within_limits(smollm2_path, gemma3_path):
    from llmcore.chat import RenderLimits
    from llmcore.loader import load_gguf

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "user", "content": "more"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for path in (smollm2_path, gemma3_path):
        tmpl = load_gguf(path).chat_template
        plain = tmpl.render(msgs, tools=tools)
        limited = tmpl.render(msgs, tools=tools, limits=RenderLimits(max_chars=len(plain) + 1, timeout_s=5.0))
        assert limited == plain


async def test_many_long_stop_strings_are_capped_and_cheap():
    rng = random.Random(1)

    def stops(n, length):
        return ["".join(rng.choice("abcdefgh ") for _ in range(length)) for _ in range(n)]

    async def attack(session):
        huge = await post(session, srv.url + "/completion",
                          {"prompt": "a", "n_predict": 50, "stop": stops(128, 3000)})
        # at the caps: accepted, and the matcher keeps up with the stream
        at_cap = await post(session, srv.url + "/completion",
                            {"prompt": "a", "n_predict": 200, "ignore_eos": True,
                             "stop": stops(MAX_STOP_STRINGS, MAX_STOP_CHARS)})
        return huge, at_cap

    with server(fake_engine(delay=0.01, n_ctx=4096)) as srv:
        gap, health, (huge, at_cap), took = await stalls_while(srv, attack)
    assert huge[0] == 400 and "at most" in json.loads(huge[1])["error"]["message"]
    assert at_cap[0] == 200 and json.loads(at_cap[1])["tokens_predicted"] == 200
    assert gap < allowed_gap() and health < allowed_gap(), (gap, health, took)


async def test_a_body_of_too_many_json_values_is_refused_before_parsing():
    body = json.dumps({"tokens": [0] * 1_500_000}).encode()

    async def attack(session):
        return await post(session, srv.url + "/detokenize", data=body,
                          headers={"Content-Type": "application/json"})

    with server(fake_engine(delay=0.01)) as srv:
        gap, health, (status, out), took = await stalls_while(srv, attack)
    assert status == 413 and "JSON values" in json.loads(out)["error"]["message"]
    assert gap < allowed_gap() and health < allowed_gap()


# ---- limits refused early ------------------------------------------------------------------


async def test_size_limits_answer_413():
    with server(max_body_bytes=4096) as srv:
        async with aiohttp.ClientSession() as s:
            status, out = await post(s, srv.url + CHAT, {"messages": MSG, "pad": "x" * 5000})
            assert status == 413 and "too large" in json.loads(out)["error"]["message"]
            status, out = await post(s, srv.url + "/detokenize", {"tokens": [5] * 300})
            assert status == 413 and "more than the context" in json.loads(out)["error"]["message"]
            # 256 tokens of context, tokens of at most 5 bytes: 2000 bytes are 400 tokens or more
            status, out = await post(s, srv.url + "/tokenize", {"content": "y" * 2000})
            assert status == 413 and "at least 400 tokens" in json.loads(out)["error"]["message"]
            status, _ = await post(s, srv.url + "/tokenize", {"content": "y" * 200})
            assert status == 200


async def test_stop_string_caps_name_the_limit():
    with server() as srv:
        async with aiohttp.ClientSession() as s:
            status, out = await post(s, srv.url + "/completion",
                                     {"prompt": "a", "stop": ["x"] * (MAX_STOP_STRINGS + 1)})
            assert status == 400 and f"at most {MAX_STOP_STRINGS}" in json.loads(out)["error"]["message"]
            status, out = await post(s, srv.url + CHAT,
                                     {"messages": MSG, "stop": ["y" * (MAX_STOP_CHARS + 1)]})
            assert status == 400 and f"at most {MAX_STOP_CHARS}" in json.loads(out)["error"]["message"]


# ---- one schema for every field; no 500 without a bug report --------------------------------


@pytest.mark.parametrize("path,body,field", [
    (CHAT, {"messages": [{"role": "user", "content": 12}]}, "messages[0].content"),
    (CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0].function.name"),
    (CHAT, {"messages": MSG, "tool_choice": "sometimes"}, "tool_choice"),
    (CHAT, {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": 3}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text"),
    ("/v1/messages", {"messages": MSG, "system": [{"type": "text"}]}, "system[0].text"),
    ("/v1/messages", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/v1/responses", {"input": [{"type": "message", "role": "user", "content": 3}]}, "input[0].content"),
    ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": 1}]}, "tools[0].name"),
    ("/completion", {"prompt": ["a", -3]}, "prompt[1]"),
    ("/detokenize", {"tokens": [1, "2"]}, "tokens[1]"),
    ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
])
async def test_a_wrong_type_anywhere_is_400_naming_the_field(path, body, field):
    with server() as srv:
        async with aiohttp.ClientSession() as s:
            status, out = await post(s, srv.url + path, body)
    assert status == 400, out
    d = json.loads(out)
    msg = d["error"]["message"]
    assert f"'{field}'" in msg, msg


@pytest.mark.parametrize("item", [
    {"type": "reasoning", "content": "thinking as a string", "summary": []},
    {"type": "reasoning", "summary": "a summary as a string"},
    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "t"}], "summary": {"text": "x"}},
])
async def test_responses_reasoning_items_that_are_not_lists_are_400(item):
    body = {"input": [{"type": "message", "role": "user", "content": "hi"}, item,
                      {"type": "message", "role": "assistant", "content": "yo"}]}
    with server() as srv:
        async with aiohttp.ClientSession() as s:
            status, out = await post(s, srv.url + "/v1/responses", body)
            assert status == 400, out
            assert "'input[1]." in json.loads(out)["error"]["message"]
            ok = {**body, "input": [body["input"][0], {"type": "reasoning", "summary": [
                {"type": "summary_text", "text": "s"}]}, body["input"][2]], "max_output_tokens": 2}
            status, out = await post(s, srv.url + "/v1/responses", ok)
            assert status == 200, out


async def test_an_unexpected_failure_is_500_and_a_bug_report_in_the_log(monkeypatch, caplog):
    from llmcore.server.encoders import openai_chat

    def broken(self, ev):
        raise ZeroDivisionError("an encoder bug")

    monkeypatch.setattr(openai_chat.OpenAIChatEncoder, "body", broken)
    with server() as srv, caplog.at_level(logging.ERROR, logger="llmcore.server"):
        async with aiohttp.ClientSession() as s:
            status, out = await post(s, srv.url + CHAT, {"messages": MSG, "max_tokens": 2})
    assert status == 500 and "ZeroDivisionError" in json.loads(out)["error"]["message"]
    bugs = [r for r in caplog.records if "a bug: please report it" in r.getMessage()]
    assert bugs and bugs[0].exc_info and bugs[0].exc_info[0] is ZeroDivisionError


# ---- template variables ------------------------------------------------------------------

THINK_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                  "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
                  "{{ bos_token }}<|assistant|>")


async def test_chat_template_kwargs_reach_only_what_the_template_reads():
    tmpl = ChatTemplate(THINK_TEMPLATE, bos_token="<s>")
    assert tmpl.request_variables == frozenset({"enable_thinking"})
    with server(fake_engine(template=tmpl)) as srv:
        async with aiohttp.ClientSession() as s:
            base = {"messages": MSG, "max_tokens": 1}

            async def prompt_tokens(extra):
                status, out = await post(s, srv.url + CHAT, {**base, **extra})
                assert status == 200, out
                return json.loads(out)["usage"]["prompt_tokens"]

            plain = await prompt_tokens({})
            assert await prompt_tokens({"chat_template_kwargs": {"enable_thinking": False}}) == plain + len("<nothink>")
            # a variable this template does not read: dropped, not an error
            assert await prompt_tokens({"chat_template_kwargs": {"reasoning_effort": "high"}}) == plain
            for name in ("bos_token", "eos_token", "raise_exception"):
                status, out = await post(s, srv.url + CHAT, {**base, "chat_template_kwargs": {name: "X"}})
                assert status == 400 and f"'chat_template_kwargs.{name}'" in json.loads(out)["error"]["message"]


# ---- a browser cannot drive a local server ---------------------------------------------------


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", None])
async def test_a_post_body_that_is_not_json_is_refused(ctype):
    body = json.dumps({"prompt": "a", "n_predict": 2}).encode()
    eng = fake_engine()
    with server(eng) as srv:
        async with aiohttp.ClientSession() as s:
            headers = {"Content-Type": ctype} if ctype else {}
            async with s.post(srv.url + "/completion", data=body, headers=headers,
                              skip_auto_headers=["Content-Type"]) as r:
                assert r.status == 415, await r.text()
                assert "application/json" in (await r.json())["error"]["message"]
            status, _ = await post(s, srv.url + "/completion", data=body,
                                   headers={"Content-Type": "application/json; charset=utf-8"})
            assert status == 200
    assert eng.stats().requests_processing == 0


async def test_cors_is_off_by_default_and_on_for_named_origins():
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    with server() as srv:
        async with aiohttp.ClientSession() as s:
            async with s.options(srv.url + CHAT, headers=preflight) as r:
                assert r.status == 405 and "Access-Control-Allow-Origin" not in r.headers
            async with s.post(srv.url + CHAT, json={"messages": MSG, "max_tokens": 1},
                              headers={"Origin": "http://app.example"}) as r:
                assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
    with server(cors_origins=("http://app.example",)) as srv:
        async with aiohttp.ClientSession() as s:
            async with s.options(srv.url + CHAT, headers=preflight) as r:
                assert r.status == 204
                assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
                assert "POST" in r.headers["Access-Control-Allow-Methods"]
            async with s.post(srv.url + CHAT, json={"messages": MSG, "max_tokens": 1, "stream": True},
                              headers={"Origin": "http://app.example"}) as r:
                assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
                await r.read()
            async with s.options(srv.url + CHAT, headers={**preflight, "Origin": "http://evil.example"}) as r:
                assert r.status == 405 and "Access-Control-Allow-Origin" not in r.headers


async def raw_exchange(port: int, data: bytes, wait_s: float = 5.0) -> bytes:
    """Send `data` on a fresh connection; everything the server sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), wait_s)
    finally:
        writer.close()


@pytest.mark.parametrize("host,status", [
    ("evil.example", 403), ("evil.example:8080", 403), ("192.168.1.7", 403), ("localhost.evil.example", 403),
    ("localhost", 200), ("localhost:8080", 200), ("127.0.0.1:1234", 200), ("[::1]:8080", 200),
    ("app.localhost", 200),
])
async def test_a_foreign_host_header_on_a_loopback_bind_is_refused(host, status):
    with server() as srv:
        out = await raw_exchange(srv.port, f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    assert out.startswith(f"HTTP/1.1 {status}".encode()), out[:200]
    if status == 403:
        assert b"not a loopback name" in out


def test_host_rules_and_the_exposed_bind_warning(caplog):
    assert is_loopback_address("127.0.0.1") and is_loopback_address("127.8.9.1")
    assert is_loopback_address("::1") and is_loopback_address("[::1]") and is_loopback_address("LOCALHOST.")
    assert not is_loopback_address("0.0.0.0") and not is_loopback_address("10.0.0.1")
    assert not is_loopback_address("::") and not is_loopback_address("example.com")
    assert host_name("[::1]:80") == "::1" and host_name("a.b:80") == "a.b" and host_name("::1") == "::1"

    class Req:
        headers = {"Host": "evil.example"}

    check_host(Req(), "0.0.0.0")  # bound for other machines: any name
    with caplog.at_level(logging.WARNING, logger="llmcore.server"):
        warn_if_exposed(ServerConfig(host="127.0.0.1"))
        assert not caplog.records
        warn_if_exposed(ServerConfig(host="0.0.0.0"))
        assert "without an API key" in caplog.text
        caplog.clear()
        warn_if_exposed(ServerConfig(host="0.0.0.0", api_keys=("k",)))
        assert not caplog.records


# ---- a slow or stuck client holds a connection for a bounded time ----------------------------


async def test_an_unfinished_chunked_body_past_the_body_timeout_is_refused():
    eng = fake_engine()
    with server(eng, body_timeout_s=0.5) as srv:
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\n{\"mes\r\n")
        t0 = time.perf_counter()
        out = await raw_exchange(srv.port, head)
        took = time.perf_counter() - t0
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    assert b"did not arrive within 0.5 s" in out
    assert 0.4 < took < 3.0
    assert eng.stats().requests_processing == 0


async def test_unfinished_headers_past_the_header_timeout_are_refused():
    with server(header_timeout_s=0.5) as srv:
        t0 = time.perf_counter()
        out = await raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        took = time.perf_counter() - t0
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    assert 0.4 < took < 3.0


async def test_an_idle_connection_is_closed_after_the_idle_timeout():
    with server(idle_timeout_s=0.5) as srv:
        t0 = time.perf_counter()
        assert await raw_exchange(srv.port, b"") == b""  # nothing sent: closed, nothing said
        assert 0.4 < time.perf_counter() - t0 < 3.0
        # kept alive after an answer, then closed when no next request comes
        t0 = time.perf_counter()
        out = await raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200") and 0.4 < time.perf_counter() - t0 < 3.0


async def test_a_client_that_stops_reading_a_stream_frees_its_slot_after_the_timeout():
    eng = fake_engine(n_ctx=100_000)
    with server(eng, body_timeout_s=0.5) as srv:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.port))
        # big frames (100 top log-probabilities a token) fill the socket buffers fast
        body = json.dumps({"prompt": "a", "n_predict": 90_000, "ignore_eos": True, "stream": True,
                           "n_probs": 100}).encode()
        sock.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        try:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 20:
                st = eng.stats()
                if st.requests_cancelled >= 1 and st.requests_processing == 0:
                    break
                await asyncio.sleep(0.05)
            # freed within the body timeout plus the time to fill the socket buffers (seconds
            # on a busy machine), not held for the rest of a 90,000-token generation
            assert st.requests_cancelled >= 1 and st.requests_processing == 0, "the slot is still held"
        finally:
            sock.close()


async def test_connections_per_client_address_are_capped():
    with server(max_conns_per_client=3, idle_timeout_s=30) as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(3)]
        try:
            await asyncio.sleep(0.1)
            out = await raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 429"), out[:200]
            held.pop().close()
            await asyncio.sleep(0.1)
            out = await raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 200"), out[:200]
        finally:
            for c in held:
                c.close()


# ---- a small prompt cache under a returning multi-turn load ---------------------------------


def _conversations(n_conv, seed=0):
    rng = random.Random(seed)
    system = [rng.randrange(3, 250) for _ in range(150)]
    return [system + [rng.randrange(3, 250) for _ in range(rng.randrange(200, 350))] for _ in range(n_conv)]


def _load_engine(models, name, **cfg):
    cfg = EngineConfig(sampling=SamplingParams(temperature=0.0), **cfg)
    tiny_models, built_model = models
    if name in tiny_models:  # fixtures.py models carry no tokenizer: token-id prompts only
        from llmcore.models import load_model

        return Engine(cfg, model=load_model(tiny_models[name]), tokenizer=FakeTokenizer())
    return Engine.from_path(built_model(name), cfg)  # a catalogue model with its tokenizer


@pytest.mark.parametrize("name,cache_ram,n_conv,turns", [
    ("llama-f32", 16, 12, 5), ("llama-f32", 1, 12, 5), ("gemma3-swa", 2, 8, 3)])
async def test_multi_turn_load_on_a_small_cache_logs_no_restore_failure(tiny_models, built_model, caplog, name,
                                                                        cache_ram, n_conv, turns):
    # -np 4, a small --cache-ram, conversations that come back; for the tiny llama KV is 256 B
    # a token: 1 MiB holds 4096 tokens, less than the conversations (~5000 apart from their
    # shared start). gemma3-swa (sliding window 32, built in fixtures) restores checkpoints too.
    models = (tiny_models, built_model)
    eng = _load_engine(models, name, n_parallel=4, n_ctx=4096, n_ubatch=64, cache_ram_mib=cache_ram)
    ref = _load_engine(models, name, n_parallel=1, n_ctx=1024, cache_ram_mib=0)
    ref.start()
    assert ref.wait_ready(60), ref.load_error
    convs = _conversations(n_conv)  # 4 slots: the others wait, their states go to the cache
    rng = random.Random(1)
    with caplog.at_level(logging.WARNING), server(eng) as srv:
        assert await asyncio.to_thread(eng.wait_ready, 60), eng.load_error
        async with aiohttp.ClientSession() as s:
            for turn in range(turns):
                async def step(i):
                    status, out = await post(s, srv.url + "/completion", {
                        "prompt": convs[i], "n_predict": 6, "ignore_eos": True, "return_tokens": True})
                    assert status == 200, out
                    return json.loads(out)

                outs = await asyncio.gather(*[step(i) for i in range(len(convs))])
                for i, d in enumerate(outs):
                    if turn == turns - 1:  # what the cache restored gives what recomputing gives
                        assert d["tokens"] == ref.generate_sync(convs[i], _gen(6)).tokens
                    convs[i] = convs[i] + d["tokens"] + [rng.randrange(3, 250) for _ in range(rng.randrange(5, 30))]
        st = eng.stats()
    ref.stop()
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                and ("restor" in r.getMessage() or "refcount" in r.getMessage() or r.exc_info)]
    assert not failures, failures
    assert st.ram_hits > 0
    if cache_ram < 16:
        assert st.cache_ram_evictions > 0  # the budget was under pressure


def _gen(n):
    from llmcore.engine import GenParams

    return GenParams(n_predict=n, ignore_eos=True, cache_prompt=False, sampling=SamplingParams(temperature=0.0))


# ---- the flags -----------------------------------------------------------------------------


def test_serve_and_tui_take_the_hardening_flags(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import llmcore.engine
    import llmcore.server
    import llmcore.tui.run
    from llmcore import cli

    class Idle:
        status, load_error = "ok", ""

        def stop(self):
            pass

    served, dashboards = [], []
    monkeypatch.setattr(llmcore.engine.Engine, "from_path", classmethod(lambda cls, path, cfg: Idle()))
    monkeypatch.setattr(llmcore.server, "run_server", lambda engine, cfg, sock=None: served.append(cfg))
    monkeypatch.setattr(cli, "_listen", lambda opts: None)
    monkeypatch.setattr(llmcore.tui.run, "main", lambda **kw: dashboards.append(kw["server_cfg"]) or 0)
    monkeypatch.setattr(cli, "_check_model", lambda path: None)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    flags = ["-m", str(model), "--cors", "http://a.example", "--cors", "http://b.example/,http://c.example",
             "-to", "30", "--header-timeout", "4", "--idle-timeout", "2.5",
             "--max-connections-per-client", "8", "--max-body-mib", "2"]
    for cmd in (["serve"], ["tui", "--no-tui"]):
        r = CliRunner().invoke(cli.app, [*cmd, *flags])
        assert r.exit_code == 0, r.output
    want = ServerConfig(cors_origins=("http://a.example", "http://b.example", "http://c.example"),
                        body_timeout_s=30.0, header_timeout_s=4.0, idle_timeout_s=2.5,
                        max_conns_per_client=8, max_body_bytes=2 * 1024 * 1024)
    assert served == [want] and dashboards == [want]
    defaults = cli.ServerOptions().server_config()
    assert (defaults.cors_origins, defaults.body_timeout_s, defaults.idle_timeout_s) == ((), 600.0, 5.0)
    r = CliRunner().invoke(cli.app, ["serve", "-m", str(model), "--idle-timeout", "0"])
    assert r.exit_code == 1 and "--idle-timeout" in r.output
