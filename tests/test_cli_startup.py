"""Start-up as a newcomer meets it: `llmcore --version`; every start-up error (bad flag,
bad model, port in use) is one line and an exit code before any model loads or any screen
opens; `tui --once` reads a running server and never starts one; the server binds its port
before the model loads and logs "listening" only once it listens."""
import asyncio
import logging
import signal
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fakes import FakeChatTemplate, FakeModel, FakeTokenizer
from typer.testing import CliRunner

import llmcore
import llmcore.cli as cli
from llmcore.engine import Engine, EngineConfig
from llmcore.errors import ModelLoadError
from llmcore.server import ServerConfig, listen_socket, run_server


def run(*args):
    r = CliRunner().invoke(cli.app, list(args))
    return r.exit_code, r.output


def one_line_error(out: str) -> str:
    assert "Traceback" not in out and "│" not in out and "Usage:" not in out, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    return lines[0]


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail the test if a model starts loading or a dashboard opens."""
    import llmcore.engine
    import llmcore.tui.app

    def no_engine(*a, **kw):
        raise AssertionError("a model was loaded")

    def no_screen(self, *a, **kw):
        raise AssertionError("a screen was opened")

    monkeypatch.setattr(llmcore.engine.Engine, "from_path", classmethod(no_engine))
    monkeypatch.setattr(llmcore.tui.app.Dashboard, "run", no_screen)


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    """A file the up-front model check accepts (the check itself is tested elsewhere)."""
    p = tmp_path / "ok.gguf"
    p.write_bytes(b"GGUF")
    monkeypatch.setattr(cli, "_check_model", lambda path: None)
    return p


def test_version():
    code, out = run("--version")
    assert code == 0 and out.strip() == f"llmcore {llmcore.__version__}"


@pytest.mark.parametrize("args,needle", [
    (["tui", "--bogus"], "No such option: --bogus"),
    (["serve", "--port", "abc"], "Invalid value for '--port'"),
    (["tui", "-np", "two"], "Invalid value for '-np'"),
    (["generate"], "Missing option '-p'"),
])
def test_bad_flags_are_one_line_and_exit_2(args, needle, nothing_starts):
    code, out = run(*args)
    assert code == 2, out
    line = one_line_error(out)
    assert needle in line and line.endswith("--help)"), line


def test_no_arguments_show_the_help():
    code, out = run()
    assert "serve" in out and "tui" in out and "error" not in out


@pytest.mark.parametrize("cmd", ["tui", "serve"])
def test_port_in_use_is_one_line_before_anything_loads(cmd, taken_port, model_file, nothing_starts):
    code, out = run(cmd, "-m", str(model_file), "--port", str(taken_port))
    assert code == 1
    line = one_line_error(out)
    assert f"cannot listen on 127.0.0.1:{taken_port}" in line and "in use" in line.lower()


@pytest.mark.parametrize("args,needle", [
    (["-m", "README.md"], "not a GGUF file"),
    (["-m", "/nonexistent/model.gguf"], "neither a file nor a known name"),
    (["-c", "-1"], "-c must be >= 0"),
    (["--port", "70000"], "--port 70000"),
    (["--interval", "0"], "--interval 0"),
])
def test_tui_start_up_errors_are_one_line_before_the_screen(args, needle, nothing_starts, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)  # README.md of the repo: a file, not a model
    code, out = run("tui", *args)
    assert code == 1
    assert needle in one_line_error(out)


def test_once_never_starts_a_server(monkeypatch, nothing_starts):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out = run("tui", "--once", "--port", str(port))
    assert code == 1
    line = one_line_error(out)
    assert f"no llmcore server answers at http://127.0.0.1:{port}" in line


def test_once_reads_a_running_server(nothing_starts):
    """`tui --once --json` against a server that runs (here in a thread of this process)."""
    import json

    from llmcore.tui.run import InProcessServer

    eng = Engine(EngineConfig(n_parallel=2), model=FakeModel(), tokenizer=FakeTokenizer(),
                 chat_template=FakeChatTemplate(), info={"name": "fake", "path": "/m/fake.gguf"})
    server = InProcessServer(eng, ServerConfig(host="127.0.0.1", port=0))
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def serve():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        assert started.wait(10)
        port = server.url.rsplit(":", 1)[1]
        code, out = run("tui", "--once", "--json", "--port", port)
        assert code == 0, out
        d = json.loads(out.strip().splitlines()[-1])
        assert d["connected"] and d["stats"]["model"] == "fake.gguf" and len(d["slots"]) == 2
        code, out = run("tui", "--once", "--url", server.url)
        assert code == 0 and "fake.gguf  status ok" in out and "KV cache:" in out
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


def test_server_binds_before_loading_and_says_listening_once_it_listens(caplog):
    """The port is taken before the model starts loading; "listening" is logged when the
    server accepts connections, and /health answers 503 while the model loads."""
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen = {}
    release = threading.Event()

    def loader():
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            seen["bound_at_load"] = True  # the port answers before the model exists
        release.wait(20)
        raise ModelLoadError("stop here: the test is over")

    def client():
        for _ in range(500):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                seen["health"] = 200
                break
            except urllib.error.HTTPError as e:
                seen["health"] = e.code
                seen["listening_logged"] = any("listening on" in r.getMessage() for r in caplog.records)
                break
            except OSError:
                threading.Event().wait(0.02)
        release.set()

    eng = Engine(EngineConfig(), loader=loader)
    fired = threading.Event()

    def guard(*_):
        fired.set()
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, guard)
    signal.alarm(30)
    threading.Thread(target=client, daemon=True).start()
    try:
        with caplog.at_level(logging.INFO, logger="llmcore.server"):
            run_server(eng, ServerConfig(port=0, shutdown_timeout=1), sock=sock)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not fired.is_set()
    assert seen == {"bound_at_load": True, "health": 503, "listening_logged": True}
    [msg] = [r.getMessage() for r in caplog.records if "listening on" in r.getMessage()]
    assert msg == f"listening on http://127.0.0.1:{port}"
