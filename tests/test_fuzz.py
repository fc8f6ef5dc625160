"""Fuzzing every route through its request schema (hypothesis), on a real loopback server.

The bodies come from each POST route's own schema (`accepts(...)`, requests/schema.py):
bodies that fit it, and bodies with a value of the wrong kind anywhere. Every answer must
be a JSON answer other than 500, within its time budget, while another stream runs, and
nothing may reach the server's log as an error or a traceback.

Bounded for CI: derandomized, no example database, a fixed number of examples per route.
LLMCORE_FUZZ_EXAMPLES=N makes a longer, random run (a failure prints the body to replay)."""
import http.client
import json
import logging
import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes import FakeModel, FakeTokenizer
from live_server import LiveServer
from llmcore.chat import ChatTemplate
from llmcore.engine import Engine, EngineConfig
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig
from llmcore.server.requests import schema as S

EXAMPLES = int(os.environ.get("LLMCORE_FUZZ_EXAMPLES", "40"))
EXPLORE = "LLMCORE_FUZZ_EXAMPLES" in os.environ
BUDGET_S = 5.0  # any one answer (generation is bounded by the 128-token context)
# the background stream's largest pause between tokens: looser than test_hardening's 0.5 s,
# as hypothesis itself runs in this process (and holds the GIL while it draws and shrinks)
GAP_S = 1.0
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not EXPLORE, database=None,
                suppress_health_check=list(HealthCheck))

# a template in the style of real ones: roles, tool calls, tools as JSON, a thinking switch
TEMPLATE = (
    "{%- if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
    "{%- for m in messages %}<|{{ m['role'] }}|>"
    "{%- if m['content'] is string %}{{ m['content'] }}{% elif m['content'] %}"
    "{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}"
    "{%- for c in m.get('tool_calls') or [] %}<call>{{ c['function']['name'] }}"
    "{{ c['function']['arguments'] | tojson }}</call>{% endfor %}\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
    "<nothink>{% endif %}{% endif %}")


# ---- strategies from the schema ------------------------------------------------------------

def json_values(max_leaves=6):
    leaves = st.none() | st.booleans() | st.integers(-2 ** 40, 2 ** 40) | st.floats(allow_nan=False) | \
        st.text(max_size=8)
    return st.recursive(leaves, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.text(max_size=5), kids, max_size=3), max_leaves=max_leaves)


def fitting(spec: S.Spec, depth: int = 0):
    """Values that fit `spec` (small: few optional fields deep down)."""
    if isinstance(spec, S.Anything):
        return json_values()
    if isinstance(spec, S.Str):
        return st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
            ["", "<s>", "</s>", "<|im_start|>", "{{ x }}", "\ufffd", "a" * 40])
    if isinstance(spec, S.Int):
        lo = spec.lo if spec.lo is not None else -3
        hi = spec.hi if spec.hi is not None else 300
        return st.integers(lo, max(lo, hi)) | st.integers(min_value=spec.lo, max_value=spec.hi)
    if isinstance(spec, S.Num):
        return st.floats(-3, 3) | st.floats(spec.lo, spec.hi, allow_nan=False, allow_infinity=False)
    if isinstance(spec, S.Bool):
        return st.booleans()
    if isinstance(spec, S.Enum):
        return st.sampled_from(spec.values)
    if isinstance(spec, S.List):
        hi = min(spec.max_items if spec.max_items is not None else 3, 3 if depth < 3 else 1)
        return st.lists(fitting(spec.item, depth + 1), min_size=spec.min_items, max_size=max(hi, spec.min_items))
    if isinstance(spec, S.Map):
        return st.dictionaries(st.text(max_size=6), fitting(spec.value, depth + 1), max_size=2)
    if isinstance(spec, S.AnyOf):
        return st.one_of([fitting(o, depth) for o in spec.options])
    if isinstance(spec, S.Tagged):
        variants = [_obj(v, depth, {spec.key: st.just(tag)}) for tag, v in spec.variants.items()]
        if spec.other is not None:
            variants.append(_obj(spec.other, depth, {spec.key: st.text(max_size=6)}))
        return st.one_of(variants)
    if isinstance(spec, S.Obj):
        return _obj(spec, depth)
    raise TypeError(spec)


def _obj(spec: S.Obj, depth: int, extra=None):
    required = {k: fitting(spec.fields[k], depth + 1) for k in spec.required}
    optional = {k: fitting(v, depth + 1) for k, v in spec.fields.items() if k not in spec.required}
    if depth > 3:  # deep down: only what is required
        optional = {}
    return st.fixed_dictionaries({**required, **(extra or {})}, optional=optional)


def _paths(v, at=()):
    yield at
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, at + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, at + (i,))


def _replace(v, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(v, dict):
        return {**v, head: _replace(v[head], rest, new)}
    return [_replace(x, rest, new) if i == head else x for i, x in enumerate(v)]


def _kind(v):
    return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__


@st.composite
def one_wrong(draw, spec: S.Obj):
    """A fitting body with one value anywhere replaced by one of another JSON kind (what
    a careless client sends: a string where a list goes, an object for a string...); the
    rest fits, so the wrong value reaches the code deep down."""
    body = draw(fitting(spec))
    paths = [p for p in _paths(body) if p]
    if not paths:
        return body
    deep = [p for p in paths if len(p) >= 2]
    path = draw(st.sampled_from(deep if deep and draw(st.booleans()) else paths))
    old = body
    for k in path:
        old = old[k]
    new = draw(json_values(3).filter(lambda x: x is not None and _kind(x) != _kind(old)))
    return _replace(body, path, new)


# ---- the server, a stream beside it, and its log --------------------------------------------


class ErrorLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


class BackgroundStream(threading.Thread):
    """Streams /completion again and again; the largest gap between two tokens."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.stop, self.max_gap, self.tokens = port, threading.Event(), 0.0, 0

    def run(self):
        body = json.dumps({"prompt": "a", "n_predict": 10_000, "ignore_eos": True, "stream": True})
        while not self.stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            last = None
            for line in resp:
                if self.stop.is_set():
                    break
                if line.startswith(b"data: "):
                    now = time.perf_counter()
                    if last is not None:
                        self.max_gap = max(self.max_gap, now - last)
                        if now - last > 0.2 and os.environ.get("FUZZ_DEBUG"):
                            print(f"\nGAP {now - last:.3f} at {now:.3f}", flush=True)
                    last = now
                    self.tokens += 1
            conn.close()


@pytest.fixture(scope="module")
def live():
    eng = Engine(EngineConfig(n_parallel=2, sampling=SamplingParams(temperature=0.0)),
                 model=FakeModel(n_ctx_train=128, delay=0.001), tokenizer=FakeTokenizer(),
                 chat_template=ChatTemplate(TEMPLATE, bos_token="<s>", eos_token="</s>"), info={"name": "fake"})
    errors = ErrorLog()
    root = logging.getLogger()
    root.addHandler(errors)
    try:
        with LiveServer(eng, ServerConfig(keepalive_s=0.05, template_timeout_s=2.0)) as srv:
            assert eng.wait_ready(30)
            stream = BackgroundStream(srv.port)
            stream.start()
            time.sleep(1.5)  # the stream alone first: how much this machine pauses it already
            quiet_gap, stream.max_gap = stream.max_gap, 0.0
            yield srv, errors, stream
            stream.stop.set()
            stream.join(10)
        assert stream.tokens > 100, "the background stream did not run"
        # the fuzzing must not stall the stream beyond what a busy machine does to it anyway
        allowed = max(GAP_S, 2.0 * quiet_gap)
        assert stream.max_gap < allowed, f"a stream paused {stream.max_gap:.2f} s during the fuzzing " \
                                         f"(alone: {quiet_gap:.2f} s)"
    finally:
        root.removeHandler(errors)


def routes(app):
    """(path, schema) of each POST route with a body schema, one path per handler."""
    seen, out = set(), []
    for r in app.router.routes():
        schema = getattr(r.handler, "body_schema", None)
        if r.method == "POST" and schema is not None and r.handler not in seen:
            seen.add(r.handler)
            out.append((r.resource.canonical, schema))
    return out


def call(port, method, path, body: bytes | None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=BUDGET_S * 2)
    t0 = time.perf_counter()
    try:
        conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
        if os.environ.get("FUZZ_DEBUG") and time.perf_counter() - t0 > 0.1:
            print(f"\nSLOW {time.perf_counter() - t0:.3f} {t0:.3f} {path} {str(body)[:300]}", flush=True)
        return resp.status, resp.getheader("Content-Type") or "", data, time.perf_counter() - t0
    finally:
        conn.close()


def check_answer(live, path, body, status, ctype, data, took):
    srv, errors, _ = live
    bad = [f"{r.name}: {r.getMessage()}" for r in errors.records]
    errors.records.clear()
    assert status < 500, (path, body, status, data[:300])
    assert took < BUDGET_S, (path, body, f"{took:.2f} s")
    if "text/event-stream" not in ctype:
        assert ctype.startswith("application/json"), (path, ctype, data[:200])
        d = json.loads(data)
        if status >= 400:
            assert isinstance(d.get("error"), dict) and d["error"].get("message"), d
    assert not bad, (path, body, bad)


def test_the_fuzzer_covers_every_post_route(live):
    srv, _, _ = live
    paths = {p for p, _ in routes(srv.app)}
    assert {"/v1/chat/completions", "/v1/completions", "/completion", "/tokenize", "/detokenize",
            "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"} <= paths


ROUTES = ["/v1/chat/completions", "/v1/completions", "/completion", "/tokenize", "/detokenize",
          "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]


def _schema(live, path):
    return dict(routes(live[0].app))[path]


@pytest.mark.parametrize("wrong", [False, True], ids=["fitting", "one-wrong"])
@pytest.mark.parametrize("path", ROUTES)
def test_fuzz_route(live, path, wrong):
    schema = _schema(live, path)

    @FUZZ
    @given(body=one_wrong(schema) if wrong else fitting(schema))
    def run(body):
        raw = json.dumps(body).encode()
        status, ctype, data, took = call(live[0].port, "POST", path, raw)
        check_answer(live, path, body, status, ctype, data, took)
        assert status in (200, 400, 413), (path, body, status, data[:300])

    run()


@FUZZ
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode) | json_values().map(
    lambda v: json.dumps(v).encode()), path=st.sampled_from(ROUTES))
def test_fuzz_raw_bodies(live, raw, path):
    status, ctype, data, took = call(live[0].port, "POST", path, raw)
    check_answer(live, path, raw, status, ctype, data, took)
    assert 400 <= status < 500 or status == 200 and raw.startswith(b"{")


@FUZZ
@given(path=st.sampled_from(["/health", "/props", "/slots", "/metrics", "/v1/models", "/slots?fail_on_no_slot=1"]),
       query=st.text(st.characters(codec="ascii", categories=["L", "N"]), max_size=8))
def test_fuzz_get_routes(live, path, query):
    sep = "&" if "?" in path else "?"
    status, ctype, data, took = call(live[0].port, "GET", f"{path}{sep}{query}={query}", None)
    assert status in (200, 503), (path, status, data[:200])
    assert took < 1.0
    live[1].records.clear()
