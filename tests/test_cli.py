"""The command line's shared options: declared once (RuntimeOptions, ServerOptions), offered
the same way by every command that takes them, and turned into the engine's and server's
configuration (the flags' defaults are the engine's defaults)."""
import dataclasses

import pytest
import typer.main
from typer.testing import CliRunner

import llmcore.cli as cli
from llmcore.engine import EngineConfig
from llmcore.sampling import SamplingParams
from llmcore.server import ServerConfig


def params(command: str) -> dict:
    """option name -> (flags, default, help) of one command."""
    cmd = typer.main.get_command(cli.app).commands[command]
    return {p.name: (tuple(p.opts), tuple(p.secondary_opts), p.default, p.help) for p in cmd.params}


def test_shared_options_are_the_same_everywhere():
    serve, tui, generate = params("serve"), params("tui"), params("generate")
    server_fields = [f.name for f in dataclasses.fields(cli.ServerOptions)]
    runtime_fields = [f.name for f in dataclasses.fields(cli.RuntimeOptions)]
    assert set(serve) == {"model", *server_fields}
    assert set(tui) == {"model", "url", "interval", "no_tui", "once", "json_out", "mock", *server_fields}
    for name in ["model", *server_fields]:
        assert serve[name] == tui[name], name
    for name in ["model", *runtime_fields]:
        assert generate[name] == serve[name], name
    assert serve["parallel"][0] == ("-np", "--parallel") and serve["parallel"][2] == 1
    assert serve["cache_idle_slots"][:3] == (("--cache-idle-slots",), ("--no-cache-idle-slots",), True)


def test_flag_defaults_are_the_engine_defaults():
    assert cli.ServerOptions().engine_config() == EngineConfig()
    assert cli.RuntimeOptions().engine_config() == EngineConfig()
    assert cli.ServerOptions().server_config() == ServerConfig()


def test_options_become_engine_and_server_config():
    opts = cli.ServerOptions(threads=3, ctx_size=4096, parallel=4, batch_size=256, ubatch_size=1024,
                             cache_type_k="q8_0", cache_type_v="q8_0", cache_ram=0, cache_idle_slots=False,
                             ctx_checkpoints=2, checkpoint_every=-1, sps=0.5, swa_full=True, alias="x",
                             n_predict=7, temp=0.1, top_k=5, top_p=0.5, min_p=0.2, host="0.0.0.0", port=0)
    assert opts.engine_config() == EngineConfig(
        n_ctx=4096, n_parallel=4, n_batch=256, n_ubatch=256, n_threads=3, n_threads_batch=3,
        cache_type_k="q8_0", cache_type_v="q8_0", cache_ram_mib=0, cache_idle_slots=False, ctx_checkpoints=2,
        checkpoint_every_n_tokens=-1, slot_prompt_similarity=0.5, swa_full=True, model_alias="x",
        sampling=SamplingParams(temperature=0.1, top_k=5, top_p=0.5, min_p=0.2), n_predict=7)
    assert opts.server_config() == ServerConfig(host="0.0.0.0", port=0)


@pytest.mark.parametrize("opts,needle", [
    (cli.ServerOptions(parallel=0), "-np must be >= 1"),
    (cli.ServerOptions(ctx_size=-1), "-c must be >= 0"),
    (cli.RuntimeOptions(ubatch_size=0), "-b and -ub must be >= 1"),
    (cli.RuntimeOptions(cache_type_v="q5"), "--cache-type-v 'q5'"),
])
def test_bad_values_name_their_flag(opts, needle):
    with pytest.raises(cli.LLMCoreError, match=needle):
        opts.engine_config()
    with pytest.raises(cli.LLMCoreError, match="--port 65536"):
        cli.ServerOptions(port=65536).server_config()


class _Engine:
    status = "ok"
    load_error = ""

    def stop(self):
        pass


def test_serve_and_tui_pass_the_parsed_flags_on(monkeypatch, tmp_path):
    import llmcore.engine
    import llmcore.server
    import llmcore.tui.run

    made, served, dashboards = [], [], []
    monkeypatch.setattr(llmcore.engine.Engine, "from_path", classmethod(
        lambda cls, path, cfg: made.append((path, cfg)) or _Engine()))
    monkeypatch.setattr(llmcore.server, "run_server", lambda engine, cfg, sock: served.append((cfg, sock)))
    monkeypatch.setattr(llmcore.tui.run, "main", lambda **kw: dashboards.append(kw) or 0)
    monkeypatch.setattr(cli, "_check_model", lambda path: None)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    flags = ["-m", str(model), "-np", "3", "-c", "1024", "--temp", "0.3", "--no-cache-idle-slots",
             "--port", "0", "--log-level", "warning"]
    r = CliRunner().invoke(cli.app, ["serve", *flags])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli.app, ["tui", *flags, "--interval", "2", "--no-tui"])
    assert r.exit_code == 0, r.output
    assert [p for p, _ in made] == [model, model]
    for _, cfg in made:
        assert (cfg.n_parallel, cfg.n_ctx, cfg.sampling.temperature, cfg.cache_idle_slots) == (3, 1024, 0.3, False)
    [(cfg, sock)] = served
    assert cfg == ServerConfig(port=0) and sock.getsockname()[0] == "127.0.0.1"  # bound before loading
    sock.close()
    [kw] = dashboards
    assert kw["server_cfg"] == ServerConfig(port=0) and kw["interval"] == 2.0 and kw["no_tui"]
    assert kw["sock"].getsockname()[1] > 0
    kw["sock"].close()
    assert kw["log_level"] == "warning" and kw["fmt"] == "text" and kw["url"] is None
