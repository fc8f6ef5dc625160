"""The server's life as an operator sees it, through `llmcore serve` processes: a
conversation survives a SIGTERM and a restart through the disk tier (same tokens and
log-probabilities as without the restart); SIGTERM lets running requests finish within
--shutdown-timeout, ends the rest with an error event and [DONE], exits 0; the field's
llama-server command line runs verbatim; POST /slots/{id}?action=; --api-key."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    def __init__(self, model, *args, host="127.0.0.1"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, "-m", "llmcore.cli", "serve", "-m", str(model), "--host", host,
                                      "--port", str(self.port), *args], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.result: tuple[int, str] | None = None
        end = time.time() + 120
        while True:
            if self.proc.poll() is not None or time.time() > end:
                rc, out = self.stop(timeout=5)
                raise AssertionError(f"server not healthy (exit {rc}):\n{out[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)

    def post(self, path, body, headers=None, timeout=120):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def stop(self, timeout=60) -> tuple[int, str]:
        """SIGTERM, then the exit code and the log (once; again: the same answer)."""
        if self.result is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                out, _ = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate()
            self.result = (self.proc.returncode, out)
        return self.result


def complete(srv, prompt, n=4):
    return srv.post("/completion", {"prompt": prompt, "n_predict": n, "n_probs": 3, "temperature": 0,
                                    "ignore_eos": True, "return_tokens": True, "cache_prompt": True})


def toks(seed, n):
    return np.random.default_rng(seed).integers(3, 250, size=n).tolist()  # the tiny vocabulary: 384


def probs(r):
    return [(p["id"], p["logprob"], [(t["id"], t["logprob"]) for t in p["top_logprobs"]])
            for p in r["completion_probabilities"]]


@pytest.mark.parametrize("name", ["chat", "mamba2"])
def test_sigterm_then_restart_serves_the_conversation_from_disk(built_model, tmp_path, name):
    model, d = built_model(name), tmp_path / "cache"
    p1 = toks(1, 160)
    a = Serve(model, "--cache-dir", str(d), "-c", "4096")
    try:
        r1 = complete(a, p1)
    finally:
        rc, out = a.stop()
    assert rc == 0, out
    assert "written at stop" in out and any(d.iterdir())
    p2 = p1 + r1["tokens"] + toks(2, 30)
    ref_srv = Serve(model, "-c", "4096")  # the same conversation without a restart
    try:
        assert complete(ref_srv, p1)["tokens"] == r1["tokens"]
        ref = complete(ref_srv, p2)
    finally:
        ref_srv.stop()
    b = Serve(model, "--cache-dir", str(d), "-c", "4096")
    try:
        r2 = complete(b, p2)
        t = r2["timings"]
        assert t["cache_source"] == "disk" and t["cache_n"] == ref["timings"]["cache_n"] > 100
        assert r2["tokens"] == ref["tokens"] and probs(r2) == probs(ref)
        m = urllib.request.urlopen(b.url + "/metrics", timeout=10).read().decode()
        assert "llmcore:disk_cache_hits_total 1" in m
    finally:
        b.stop()


def stream_chat(url, max_tokens, out: list):
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    out.append(line[5:].strip())
    except Exception as e:  # noqa: BLE001 - recorded for the test
        out.append(f"EXC {e!r}")


def test_sigterm_finishes_short_requests_ends_long_ones_with_an_error_and_done(built_model, tmp_path):
    srv = Serve(built_model("chat"), "-np", "2", "-c", "200000", "--shutdown-timeout", "1.5",
                "--cache-dir", str(tmp_path / "c"))
    try:
        _drain_check(srv)
    finally:
        srv.stop()


def _drain_check(srv):
    long_out, short_out = [], []
    long_t = threading.Thread(target=stream_chat, args=(srv.url, 150000, long_out))
    long_t.start()
    deadline = time.time() + 30
    while len(long_out) < 3 and time.time() < deadline:  # it is generating
        time.sleep(0.02)
    short_t = threading.Thread(target=stream_chat, args=(srv.url, 40, short_out))
    short_t.start()
    time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    short_t.join(60)
    long_t.join(60)
    rc, log = srv.stop()
    assert rc == 0, log
    assert short_out[-1] == "[DONE]" and any('"finish_reason":"length"' in x for x in short_out), short_out[-3:]
    assert long_out[-1] == "[DONE]", long_out[-3:]
    err = json.loads(long_out[-2])
    assert err["error"]["type"] == "unavailable_error" and "shutting down" in err["error"]["message"]
    assert "ending 1 request(s)" in log
    with pytest.raises(OSError):  # not listening any more
        urllib.request.urlopen(srv.url + "/health", timeout=2)


def test_the_field_command_line_runs_verbatim(built_model):
    srv = Serve(built_model("chat"), "-ctk", "q4_0", "-ctv", "q4_0", "-ngl", "999", "-a", "field-model",
                "-np", "32", "-c", "4500000", host="0.0.0.0")
    try:
        assert [m["id"] for m in srv.get("/v1/models")["data"]] == ["field-model"]
        r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r["model"] == "field-model" and r["usage"]["completion_tokens"] >= 1
        assert srv.get("/props")["total_slots"] == 32
    finally:
        rc, out = srv.stop()
    assert rc == 0
    assert "-ngl 999: llmcore is a CPU engine, nothing is offloaded to a GPU" in out


def http(srv, method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    h = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(srv.url + path, data=data, method=method, headers={**h, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_slots_actions_over_http(built_model, tmp_path):
    srv = Serve(built_model("chat"), "-np", "2", "--slot-save-path", str(tmp_path / "slots"),
                "--cache-ram", "0", "-c", "8192")
    try:
        p1 = toks(3, 120)
        r1 = srv.post("/completion", {"prompt": p1, "n_predict": 4, "temperature": 0, "ignore_eos": True,
                                      "id_slot": 0, "return_tokens": True})
        st, saved = http(srv, "POST", "/slots/0?action=save", {"filename": "conv.bin"})
        assert st == 200 and saved["id_slot"] == 0 and saved["filename"] == "conv.bin"
        assert saved["n_saved"] == len(p1) + 3 and saved["n_written"] > 0 and "save_ms" in saved["timings"]
        st, restored = http(srv, "POST", "/slots/1?action=restore", {"filename": "conv.bin"})
        assert st == 200 and restored["n_restored"] == len(p1) + 3 and restored["n_read"] == saved["n_written"]
        assert "restore_ms" in restored["timings"]
        p2 = p1 + r1["tokens"] + toks(4, 10)
        a = complete_on(srv, p2, 1)
        b = complete_on(srv, p2, 0)
        assert a["timings"]["cache_n"] == len(p1) + 3 and a["tokens"] == b["tokens"]
        st, erased = http(srv, "POST", "/slots/1?action=erase")  # no body, as llama-server's clients send it
        assert st == 200 and erased == {"id_slot": 1, "n_erased": len(p2) + 3}
        assert http(srv, "POST", "/slots/0?action=save", {"filename": "../x"})[0] == 400
        st, err = http(srv, "POST", "/slots/0?action=restore", {"filename": "nope.bin"})
        assert st == 400 and "file not found" in err["error"]["message"]
        assert http(srv, "POST", "/slots/9?action=erase")[0] == 400
        assert http(srv, "POST", "/slots/0?action=dump", {"filename": "x"})[0] == 400
    finally:
        srv.stop()
    off = Serve(built_model("chat"))
    try:
        st, err = http(off, "POST", "/slots/0?action=save", {"filename": "x"})
        assert st == 501 and err["error"]["type"] == "not_supported_error"
    finally:
        off.stop()


def complete_on(srv, prompt, slot):
    return srv.post("/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0, "ignore_eos": True,
                                    "id_slot": slot, "return_tokens": True, "n_probs": 2})


def test_api_key(built_model):
    srv = Serve(built_model("chat"), "--api-key", "s3cret")
    try:
        assert srv.get("/health") == {"status": "ok"}  # probes need no key
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        st, err = http(srv, "POST", "/v1/chat/completions", body)
        assert st == 401 and err["error"]["type"] == "authentication_error"
        assert http(srv, "POST", "/v1/chat/completions", body, {"Authorization": "Bearer nope"})[0] == 401
        assert http(srv, "POST", "/v1/chat/completions", body, {"Authorization": "Bearer s3cret"})[0] == 200
        assert http(srv, "POST", "/v1/messages", {**body, "model": "m"}, {"x-api-key": "s3cret"})[0] == 200
        assert http(srv, "GET", "/slots")[0] == 401
    finally:
        srv.stop()
