"""The CLI on bad input: one clear line on stderr, exit code 1, no traceback, and no server
left running when the model cannot be served."""
import json
import re
import signal
import socket
import threading

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from fixtures import CATALOGUE, build_tiny
from llmcore.cli import app


def run(*args):
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


def assert_one_line_error(code, out, *needles):
    assert code == 1, out
    assert "Traceback" not in out and "│" not in out, out  # no plain or rich traceback
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: "), out
    for n in needles:
        assert n in last, (n, last)


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_models")
    tiny = build_tiny(d / "tiny.gguf", "llama", "q8_0")  # no tokenizer in it
    data = tiny.read_bytes()
    (d / "truncated.gguf").write_bytes(data[: len(data) // 2])
    (d / "header_only.gguf").write_bytes(data[:100])
    (d / "text.gguf").write_text("hello, I am not a model\n")
    (d / "empty.gguf").write_bytes(b"")
    w = gguf.GGUFWriter(str(d / "bert.gguf"), "bert")
    w.add_block_count(1)
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d


@pytest.mark.parametrize("cmd", ["serve", "generate"])
@pytest.mark.parametrize("name,needle", [
    ("truncated.gguf", "truncated"),
    ("header_only.gguf", "GGUF"),
    ("text.gguf", "not a GGUF file"),
    ("empty.gguf", "not a GGUF file"),
    ("bert.gguf", "unsupported architecture 'bert'"),
    ("tiny.gguf", "no tokenizer"),
    ("", "is a directory"),
])
def test_unusable_model_file_is_one_line(bad_files, cmd, name, needle):
    # before this was checked, `serve` printed a traceback and kept a server up that
    # answered 500 to everything
    extra = ["-p", "hi"] if cmd == "generate" else ["--port", "0"]
    code, out = run(cmd, "-m", str(bad_files / name), *extra)
    assert_one_line_error(code, out, needle)


def test_unknown_model_name_or_path():
    code, out = run("serve", "-m", "/nonexistent/model.gguf")
    assert_one_line_error(code, out, "neither a file nor a known name")


@pytest.mark.parametrize("args,needle", [
    (["-c", "-5"], "-c must be >= 0"),
    (["--port", "70000"], "--port 70000"),
    (["--port", "-1"], "--port -1"),
    (["-np", "0"], "-np must be >= 1"),
    (["-ctk", "q5_9"], "cache-type-k"),
])
def test_bad_serve_options(bad_files, args, needle):
    code, out = run("serve", "-m", str(bad_files / "text.gguf"), *args)
    assert_one_line_error(code, out, needle)


@pytest.fixture(scope="module")
def tiny_chat_model(built_model):
    return built_model("chat")


def test_port_in_use_is_one_line(tiny_chat_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        code, out = run("serve", "-m", str(tiny_chat_model), "--port", str(port), "-c", "256")
    assert_one_line_error(code, out, f"cannot listen on 127.0.0.1:{port}")


def test_server_exits_when_the_model_fails_to_load_in_background():
    # what the up-front check cannot see (memory, a kernel missing...) fails on the engine
    # thread: run_server must return instead of serving errors forever
    from llmcore.engine import Engine, EngineConfig
    from llmcore.errors import ModelLoadError
    from llmcore.server import ServerConfig, run_server

    def loader():
        raise ModelLoadError("this model cannot load")

    eng = Engine(EngineConfig(), loader=loader)
    fired = threading.Event()

    def guard(*_):
        fired.set()
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, guard)
    signal.alarm(20)
    try:
        run_server(eng, ServerConfig(port=0, shutdown_timeout=1))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not fired.is_set(), "run_server kept serving a model that failed to load"
    assert eng.status == "error" and "cannot load" in eng.load_error


def test_generate_empty_prompt(tiny_chat_model):
    code, out = run("generate", "-m", str(tiny_chat_model), "-p", "", "-c", "256")
    assert_one_line_error(code, out, "the prompt is empty")


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_info_on_every_built_model(built_model, name):
    path = built_model(name)
    r = gguf.GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    code, out = run("info", str(path))
    assert code == 0, (name, out)
    fields = dict(line.split(None, 1) for line in out.splitlines() if line and not line.startswith(" "))
    assert fields["architecture"].strip() == arch, (name, out)
    assert fields["block_count"].strip() == str(r.fields[f"{arch}.block_count"].contents())
    assert f"in {len(r.tensors)} tensors" in out
    has_template = "yes" if "tokenizer.chat_template" in r.fields else "no"
    assert re.search(rf"^chat template +{has_template}$", out, re.M), (name, out)


def test_info_on_every_conformance_model(conformance):
    """Files written elsewhere, against their MANIFEST (more architectures than CATALOGUE)."""
    manifest = json.loads((conformance / "models" / "MANIFEST.json").read_text())
    for name, entry in manifest.items():
        code, out = run("info", str(conformance / "models" / entry["file"]))
        assert code == 0, (name, out)
        fields = dict(line.split(None, 1) for line in out.splitlines() if line and not line.startswith(" "))
        assert fields["architecture"].strip() == entry["arch"], (name, out)
        assert fields["block_count"].strip() == str(entry["metadata"][f"{entry['arch']}.block_count"])
        assert f"in {len(entry['tensors'])} tensors" in out


def test_info_on_bad_files(bad_files):
    for name, needle in (("truncated.gguf", "truncated"), ("text.gguf", "not a GGUF file")):
        code, out = run("info", str(bad_files / name))
        assert_one_line_error(code, out, needle)
