"""`llmcore` command line: serve, tui, generate, pull, info, bench load; `llmcore --version`.

`-m` takes a path or a known model name (pulled when missing); the default is smollm2.
Errors meant for the user print one line, no traceback: LLMCoreError (bad model, port in
use, bad values) exits 1, a bad flag (unknown option, wrong type) exits 2.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import functools
import inspect
import logging
import sys
import time
import typing
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Optional

import typer
import typer.core

from . import __version__
from .errors import LLMCoreError

if TYPE_CHECKING:
    from .cluster import ClusterConfig
    from .engine import EngineClient, EngineConfig
    from .server import ServerConfig

def _click():
    """The click that typer runs on (vendored as typer._click by newer typer releases)."""
    import importlib

    return getattr(typer.core, "_click", None) or importlib.import_module("click")


class OneLineErrors(typer.core.TyperGroup):
    """Usage errors (unknown option, bad value for a flag) as one line, `error: ...`, exit 2,
    instead of a usage block and a framed panel."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        click = _click()
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except (typer.Abort, getattr(click.exceptions, "Abort", typer.Abort)):
            sys.exit(130)
        except click.ClickException as e:
            if not standalone_mode:
                raise
            if type(e).__name__ == "NoArgsIsHelpError":  # plain `llmcore`: the help (printed
                if e.format_message().strip():            # already when rich formats it)
                    click.echo(e.format_message(), err=True)
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            click.echo(f"error: {e.format_message()}{hint}", err=True)
            sys.exit(e.exit_code)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
    help="CPU inference engine and server for GGUF language models.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"llmcore {__version__}")
        raise typer.Exit()


@app.callback()
def _main_options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    pass


def friendly(fn):
    """Print LLMCoreError as one line and exit 1 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LLMCoreError as e:
            typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper


# options ----------------------------------------------------------------------------------
# Each shared option is declared once, as a field of RuntimeOptions (every command that runs
# a model) or ServerOptions (serve and tui, which starts the same server); `with_options`
# makes a dataclass's fields a command's options.
ModelOpt = typer.Option(None, "-m", "--model", help="GGUF path or known model name (default smollm2)")


@dataclass(frozen=True)
class RuntimeOptions:
    """How the model runs: threads, context, batch sizes, KV cache types."""

    threads: Annotated[int, typer.Option("-t", "--threads", help="threads for generation (0 = all available)")] = 0
    threads_batch: Annotated[int, typer.Option(
        "-tb", "--threads-batch", help="threads for prompt processing (0 = same as -t)")] = 0
    ctx_size: Annotated[int, typer.Option(
        "-c", "--ctx-size",
        help="total KV context in tokens shared by all slots, taken on demand (0 = the model's)")] = 0
    batch_size: Annotated[int, typer.Option(
        "-b", "--batch-size", help="most tokens per forward step (all slots)")] = 2048
    ubatch_size: Annotated[int, typer.Option(
        "-ub", "--ubatch-size", help="most prompt tokens one slot adds per step")] = 512
    cache_type_k: Annotated[str, typer.Option(
        "-ctk", "--cache-type-k", help="KV cache type for K: f16, q8_0, q4_0")] = "f16"
    cache_type_v: Annotated[str, typer.Option(
        "-ctv", "--cache-type-v", help="KV cache type for V: f16, q8_0, q4_0")] = "f16"

    def engine_config(self, n_parallel: int = 1, **more) -> EngineConfig:
        """The EngineConfig of these options (`more`: further EngineConfig fields); a bad
        value is an LLMCoreError naming its flag."""
        from .engine import EngineConfig

        for name, v in (("cache-type-k", self.cache_type_k), ("cache-type-v", self.cache_type_v)):
            if v not in ("f16", "f32", "q8_0", "q4_0"):
                raise LLMCoreError(f"--{name} {v!r}: expected f16, f32, q8_0 or q4_0")
        if n_parallel < 1:
            raise LLMCoreError("-np must be >= 1")
        if self.ctx_size < 0:
            raise LLMCoreError("-c must be >= 0 (0 = the model's context length)")
        if self.ubatch_size < 1 or self.batch_size < 1:
            raise LLMCoreError("-b and -ub must be >= 1")
        return EngineConfig(
            n_ctx=self.ctx_size, n_parallel=n_parallel, n_batch=self.batch_size,
            n_ubatch=min(self.ubatch_size, self.batch_size), n_threads=self.threads,
            n_threads_batch=self.threads_batch or self.threads,
            cache_type_k=self.cache_type_k, cache_type_v=self.cache_type_v, **more,
        )


@dataclass(frozen=True)
class LlamaServerFlags:
    """llama-server flags that llmcore accepts so a llama-server command line runs as it is,
    but that mean nothing on this CPU engine (GPU offload, memory locking) or name what
    llmcore always does (metrics, continuous batching, jinja templates): each one given
    prints one line saying so (`notes`)."""

    gpu_layers: Annotated[Optional[str], typer.Option(
        "-ngl", "--gpu-layers", "--n-gpu-layers", help="llama-server's GPU offload: no effect (CPU engine)")] = None
    flash_attn: Annotated[Optional[str], typer.Option(
        "-fa", "--flash-attn", help="on|off|auto: no effect (attention is always one fused kernel here)")] = None
    split_mode: Annotated[Optional[str], typer.Option("-sm", "--split-mode", help="GPU split: no effect")] = None
    tensor_split: Annotated[Optional[str], typer.Option("-ts", "--tensor-split", help="GPU split: no effect")] = None
    main_gpu: Annotated[Optional[int], typer.Option("-mg", "--main-gpu", help="GPU choice: no effect")] = None
    device: Annotated[Optional[str], typer.Option("-dev", "--device", help="GPU devices: no effect")] = None
    no_kv_offload: Annotated[bool, typer.Option("-nkvo", "--no-kv-offload", help="no effect (no GPU)")] = False
    mlock: Annotated[bool, typer.Option("--mlock", help="no effect (the model file is memory-mapped)")] = False
    no_mmap: Annotated[bool, typer.Option("--no-mmap", help="no effect (the model file is always memory-mapped)")] = False
    metrics: Annotated[bool, typer.Option("--metrics", help="no effect (/metrics is always on)")] = False
    cont_batching: Annotated[bool, typer.Option(
        "-cb", "--cont-batching", help="no effect (batching is always continuous)")] = False
    jinja: Annotated[bool, typer.Option("--jinja", help="no effect (chat templates always run as jinja)")] = False
    no_webui: Annotated[bool, typer.Option("--no-webui", help="no effect (there is no web UI)")] = False
    no_warmup: Annotated[bool, typer.Option("--no-warmup", help="no effect (nothing is warmed up)")] = False

    def notes(self) -> list[str]:
        """One line per flag given: what it does here."""
        out = []
        gpu = [f"{flag} {v}" for flag, v in (("-ngl", self.gpu_layers), ("-sm", self.split_mode),
                                            ("-ts", self.tensor_split), ("-mg", self.main_gpu),
                                            ("-dev", self.device)) if v is not None]
        gpu += ["-nkvo"] if self.no_kv_offload else []
        out += [f"{g}: llmcore is a CPU engine, nothing is offloaded to a GPU" for g in gpu]
        if self.flash_attn is not None:
            out.append(f"-fa {self.flash_attn}: attention is always one fused kernel in llmcore")
        for given, flag, why in ((self.mlock, "--mlock", "the model file is memory-mapped, not locked"),
                                 (self.no_mmap, "--no-mmap", "the model file is always memory-mapped"),
                                 (self.metrics, "--metrics", "/metrics is always on"),
                                 (self.cont_batching, "-cb", "batching is always continuous"),
                                 (self.jinja, "--jinja", "chat templates always run as jinja"),
                                 (self.no_webui, "--no-webui", "llmcore has no web UI"),
                                 (self.no_warmup, "--no-warmup", "llmcore does no warm-up")):
            if given:
                out.append(f"{flag}: {why}")
        return out


@dataclass(frozen=True)
class ServerOptions(RuntimeOptions, LlamaServerFlags):
    """`serve` and `tui`: the runtime options plus address, slots, caches, request defaults,
    and the llama-server flags accepted for compatibility."""

    host: Annotated[str, typer.Option("--host", help="address to bind")] = "127.0.0.1"
    port: Annotated[int, typer.Option("--port", help="port to listen on")] = 8080
    parallel: Annotated[int, typer.Option(
        "-np", "--parallel", help="number of slots (concurrent requests)")] = 1
    cache_ram: Annotated[int, typer.Option(
        "-cram", "--cache-ram", help="prompt cache in RAM, MiB (-1 no limit, 0 off)")] = 8192
    cache_idle_slots: Annotated[bool, typer.Option(
        "--cache-idle-slots/--no-cache-idle-slots",
        help="save idle slots to the prompt cache when a new task starts")] = True
    ctx_checkpoints: Annotated[int, typer.Option(
        "-ctxcp", "--ctx-checkpoints",
        help="context checkpoints per slot (sliding-window/recurrent models; 0 off)")] = 32
    checkpoint_every: Annotated[int, typer.Option(
        "-cpent", "--checkpoint-every-n-tokens",
        help="checkpoint every N prompt tokens during prefill (-1 off)")] = 8192
    sps: Annotated[float, typer.Option(
        "-sps", "--slot-prompt-similarity",
        help="reuse a slot only when it holds more than this share of the prompt")] = 0.1
    swa_full: Annotated[bool, typer.Option(
        "--swa-full", help="full KV on sliding-window layers (trimmable; more memory)")] = False
    kv_unified: Annotated[bool, typer.Option(
        "-kvu/-no-kvu", "--kv-unified/--no-kv-unified",
        help="every slot may use the whole -c (else -c / -np each)")] = True
    cache_dir: Annotated[Optional[str], typer.Option(
        "--cache-dir", help="keep the prompt cache on disk in DIR too: evicted entries and all at a "
                            "clean stop, found again after a restart (default: off)")] = None
    cache_disk: Annotated[int, typer.Option(
        "--cache-disk", help="disk budget of --cache-dir, MiB (-1 no limit)")] = 32768
    slot_save_path: Annotated[Optional[str], typer.Option(
        "--slot-save-path", help="directory for POST /slots/{id}?action=save|restore files (default: off)")] = None
    alias: Annotated[Optional[str], typer.Option("-a", "--alias", help="model name shown by the API")] = None
    n_predict: Annotated[int, typer.Option(
        "-n", "--n-predict", help="default generation limit (-1 = until EOS/context end)")] = -1
    stream_interval: Annotated[float, typer.Option(
        "--stream-interval-ms", help="a stream's tokens after its first are sent at most this often, "
                                     "gathered (0: every step)")] = 10.0
    temp: Annotated[float, typer.Option("--temp", help="default temperature")] = 0.8
    top_k: Annotated[int, typer.Option("--top-k", help="default top-k (0 = off)")] = 40
    top_p: Annotated[float, typer.Option("--top-p", help="default top-p (1 = off)")] = 0.95
    min_p: Annotated[float, typer.Option("--min-p", help="default min-p (0 = off)")] = 0.05
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty", help="default repeat penalty (1 = off)")] = 1.0
    repeat_last_n: Annotated[int, typer.Option(
        "--repeat-last-n", help="tokens the repeat penalty looks at (0 off, -1 whole context)")] = 64
    presence_penalty: Annotated[float, typer.Option("--presence-penalty", help="default presence penalty")] = 0.0
    frequency_penalty: Annotated[float, typer.Option("--frequency-penalty", help="default frequency penalty")] = 0.0
    seed: Annotated[int, typer.Option("-s", "--seed", help="default sampling seed (-1 = random)")] = -1
    threads_http: Annotated[int, typer.Option(
        "--threads-http", help="threads for request work off the event loop (0 = default)")] = 0
    shutdown_timeout: Annotated[float, typer.Option(
        "--shutdown-timeout", help="at SIGTERM/Ctrl-C, seconds running requests may still take")] = 30.0
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")] = "info"
    cors: Annotated[Optional[list[str]], typer.Option(
        "--cors", help="let web pages from ORIGIN call the API (repeat, or comma-separate; * = any); "
                       "default: CORS off")] = None
    timeout: Annotated[float, typer.Option(
        "-to", "--timeout", help="seconds to read a request body, and to write each part of an answer")] = 600.0
    header_timeout: Annotated[float, typer.Option(
        "--header-timeout", help="seconds from a request's first byte to the end of its headers")] = 30.0
    idle_timeout: Annotated[float, typer.Option(
        "--idle-timeout", help="seconds a kept-alive connection may wait for its next request")] = 5.0
    max_conns_per_client: Annotated[int, typer.Option(
        "--max-connections-per-client", help="concurrent connections per client address (0 = no cap)")] = 256
    max_body_mib: Annotated[float, typer.Option(
        "--max-body-mib", help="largest request body in MiB, decoded (gzip counts expanded)")] = 16.0
    replicas: Annotated[int, typer.Option(
        "--replicas", help="run N engine replicas on Ray Serve behind this server, each with -t threads, "
                           "-np slots and its own caches (0 = one engine in this process)")] = 0
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", help="with --replicas: join this Ray cluster (e.g. auto, HOST:6379); "
                              "default: start a local Ray instance with the server")] = None
    routing: Annotated[str, typer.Option(
        "--routing", help="with --replicas: prefix (the replica holding the prompt's prefix) or "
                          "power_of_two (Ray Serve's default)")] = "prefix"
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", help="require this key (comma-separate several) as 'Authorization: Bearer KEY' "
                          "or 'x-api-key: KEY' on every route but /health")] = None
    api_key_file: Annotated[Optional[str], typer.Option(
        "--api-key-file", help="require one of the keys in this file (one a line)")] = None
    chat_template: Annotated[Optional[str], typer.Option(
        "--chat-template", help="serve the model's chat template of this name (or a built-in one: "
        "chatml, gemma) instead of its default")] = None
    chat_template_file: Annotated[Optional[str], typer.Option(
        "--chat-template-file", help="serve the Jinja chat template in this file")] = None
    reasoning_format: Annotated[str, typer.Option(
        "--reasoning-format", help="deepseek: a think block becomes reasoning_content; none: left in the content")] = "deepseek"
    reasoning_budget: Annotated[int, typer.Option(
        "--reasoning-budget", help="thinking tokens per request (-1 no limit, 0 thinking off)")] = -1
    spec_type: Annotated[str, typer.Option(
        "--spec-type", help="speculative decoding for every request: none, or ngram (prompt lookup: "
                            "drafts from n-grams of the prompt and output; llama-server's ngram-* names "
                            "mean the same here)")] = "none"
    draft_max: Annotated[int, typer.Option(
        "--draft-max", "--draft", "--draft-n", help="most tokens drafted per step (speculative decoding)")] = 16
    draft_min: Annotated[int, typer.Option(
        "--draft-min", "--draft-n-min", help="fewer drafted tokens than this: no draft")] = 0
    spec_ngram_size: Annotated[int, typer.Option(
        "--spec-ngram-size-n", help="longest n-gram of the sequence's end looked up for a draft")] = 4

    def speculative(self):
        """The server-wide drafting settings, or None (off)."""
        from .engine.speculative import SpecParams

        kind = self.spec_type.lower()
        if kind in ("none", "off", ""):
            return None
        if kind != "ngram" and not kind.startswith("ngram-"):
            raise LLMCoreError(f"--spec-type {self.spec_type!r}: expected none or ngram (no draft models yet)")
        try:
            return SpecParams(n_max=self.draft_max, n_min=self.draft_min, ngram_max=self.spec_ngram_size,
                              ngram_min=min(2, self.spec_ngram_size)).validate()
        except LLMCoreError as e:
            raise LLMCoreError(f"--draft-max/--draft-min/--spec-ngram-size-n: {e}") from None

    def engine_config(self) -> EngineConfig:
        from .sampling import SamplingParams

        if not self.stream_interval >= 0:
            raise LLMCoreError("--stream-interval-ms must be >= 0")
        return super().engine_config(
            n_parallel=self.parallel, cache_ram_mib=self.cache_ram, ctx_checkpoints=self.ctx_checkpoints,
            checkpoint_every_n_tokens=self.checkpoint_every, cache_idle_slots=self.cache_idle_slots,
            slot_prompt_similarity=self.sps, swa_full=self.swa_full, model_alias=self.alias,
            sampling=SamplingParams(temperature=self.temp, top_k=self.top_k, top_p=self.top_p,
                                    min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                                    repeat_last_n=self.repeat_last_n, presence_penalty=self.presence_penalty,
                                    frequency_penalty=self.frequency_penalty, seed=self.seed),
            n_predict=self.n_predict, chat_template_name=self.chat_template,
            chat_template_text=_read_text(self.chat_template_file, "--chat-template-file"),
            speculative=self.speculative(), kv_unified=self.kv_unified, cache_dir=self.cache_dir,
            cache_disk_mib=self.cache_disk, slot_save_path=self.slot_save_path,
            stream_interval_ms=self.stream_interval)

    def server_config(self) -> ServerConfig:
        from .server import ServerConfig

        if not 0 <= self.port <= 65535:
            raise LLMCoreError(f"--port {self.port}: expected 0..65535")
        for name, v in (("timeout", self.timeout), ("header-timeout", self.header_timeout),
                        ("idle-timeout", self.idle_timeout), ("max-body-mib", self.max_body_mib)):
            if not v > 0:
                raise LLMCoreError(f"--{name} {v:g}: expected a number of seconds > 0"
                                   if name != "max-body-mib" else f"--{name} {v:g}: expected > 0")
        if self.max_conns_per_client < 0:
            raise LLMCoreError("--max-connections-per-client must be >= 0 (0 = no cap)")
        if self.shutdown_timeout < 0:
            raise LLMCoreError(f"--shutdown-timeout {self.shutdown_timeout:g}: expected seconds >= 0")
        if self.repeat_penalty <= 0:
            raise LLMCoreError(f"--repeat-penalty {self.repeat_penalty:g}: expected > 0")
        for flag, d in (("--cache-dir", self.cache_dir), ("--slot-save-path", self.slot_save_path)):
            if d is not None and os.path.exists(d) and not os.path.isdir(d):
                raise LLMCoreError(f"{flag} {d}: not a directory")
        origins = tuple(o.strip().rstrip("/") for arg in (self.cors or ()) for o in arg.split(",") if o.strip())
        if self.reasoning_format not in ("deepseek", "none"):
            raise LLMCoreError(f"--reasoning-format {self.reasoning_format!r}: expected deepseek or none")
        if self.reasoning_budget < -1:
            raise LLMCoreError("--reasoning-budget must be >= -1 (-1 = no limit, 0 = thinking off)")
        return ServerConfig(host=self.host, port=self.port, cors_origins=origins, api_keys=self.api_keys(),
                            reasoning_format=self.reasoning_format, reasoning_budget=self.reasoning_budget,
                            body_timeout_s=self.timeout, header_timeout_s=self.header_timeout,
                            idle_timeout_s=self.idle_timeout, max_conns_per_client=self.max_conns_per_client,
                            max_body_bytes=int(self.max_body_mib * 1024 * 1024),
                            shutdown_timeout=self.shutdown_timeout,
                            **({"workers": self.threads_http} if self.threads_http > 0 else {}))

    def cluster_config(self, replica_logs: bool = True) -> ClusterConfig:
        """The replicas' setup (--replicas N >= 1): -t threads each (0: the CPUs split
        evenly between them); `replica_logs`: their log lines on this process's stderr."""
        from .cluster import ClusterConfig, Routing
        from .threads import available_cpus

        if self.replicas < 0:
            raise LLMCoreError("--replicas must be >= 0 (0 = one engine in this process)")
        if self.routing not in [str(r) for r in Routing]:
            raise LLMCoreError(f"--routing {self.routing!r}: expected prefix or power_of_two")
        return ClusterConfig(replicas=self.replicas, ray_address=self.ray_address, routing=self.routing,
                             threads_per_replica=self.threads or max(1, available_cpus() // self.replicas),
                             log_to_driver=replica_logs)

    def make_engine(self, path, cfg: EngineConfig, replica_logs: bool = True) -> EngineClient:
        """One engine in this process, or the replicas (--replicas); not started yet."""
        if self.replicas == 0:
            from .engine import Engine

            return Engine.from_path(path, cfg)  # loads in the background once started
        from .cluster import ReplicaPool
        from .cluster.pool import import_ray

        cluster = self.cluster_config(replica_logs)
        import_ray()  # not installed: one line now, before the server starts
        return ReplicaPool(path, cfg, cluster)

    def api_keys(self) -> tuple[str, ...]:
        """The keys of --api-key (comma-separated) and --api-key-file (one a line)."""
        keys = [k.strip() for k in (self.api_key or "").split(",") if k.strip()]
        if self.api_key_file:
            text = _read_text(self.api_key_file, "--api-key-file")
            found = [k.strip() for k in text.splitlines() if k.strip() and not k.lstrip().startswith("#")]
            if not found:
                raise LLMCoreError(f"--api-key-file {self.api_key_file}: no key in it")
            keys += found
        return tuple(dict.fromkeys(keys))


def _read_text(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise LLMCoreError(f"{flag} {path}: {getattr(e, 'strerror', None) or e}") from None


def with_options(options: type[RuntimeOptions]):
    """Give a command the fields of `options` as its options (after its own), and call it
    with their values gathered into one `opts` argument."""
    hints = typing.get_type_hints(options, include_extras=True)
    shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                annotation=hints[f.name]) for f in dataclasses.fields(options)]

    def decorate(command):
        own_hints = typing.get_type_hints(command)
        own = [p.replace(annotation=own_hints.get(name, p.annotation))
               for name, p in inspect.signature(command).parameters.items() if name != "opts"]

        @functools.wraps(command)
        def wrapper(**kwargs):
            opts = options(**{p.name: kwargs.pop(p.name) for p in shared})
            return command(opts=opts, **kwargs)

        wrapper.__signature__ = inspect.Signature(own + shared)
        wrapper.__annotations__ = {p.name: p.annotation for p in own + shared}
        return wrapper

    return decorate


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command()
@friendly
@with_options(ServerOptions)
def serve(opts: ServerOptions, model: Optional[str] = ModelOpt):
    """Run the HTTP server (OpenAI and llama-server compatible API)."""
    from . import threads as thr
    from .pull import resolve_model
    from .server import run_server

    _setup_logging(opts.log_level)
    server_cfg = opts.server_config()
    cfg = opts.engine_config()
    for note in opts.notes():
        typer.echo(f"llmcore: {note}", err=True)
    path = resolve_model(model)
    _check_model(path)
    sock = _listen(opts)  # the port is ours before the model loads
    thr.set_num_threads(opts.threads or None)
    engine = opts.make_engine(path, cfg)  # loads in the background: /health says 503 meanwhile
    where = f"{opts.replicas} replica(s) x " if opts.replicas else ""
    typer.echo(f"llmcore: loading {path.name}, {where}{opts.parallel} slot(s)", err=True)
    try:
        run_server(engine, server_cfg, sock=sock)
    finally:
        engine.stop()
    if engine.status == "error":
        raise LLMCoreError(f"cannot load {path}: {engine.load_error}")


def _listen(opts: ServerOptions):
    """Bind --host:--port now, so a taken port is one line before anything loads."""
    from .server import listen_socket

    try:
        return listen_socket(opts.host, opts.port)
    except OSError as e:  # address in use, no permission, unknown host
        why = e.strerror or str(e)
        hint = " (another server runs there? pick one with --port)" if e.errno == errno.EADDRINUSE else ""
        raise LLMCoreError(f"cannot listen on {opts.host}:{opts.port}: {why}{hint}") from None


def _check_model(path) -> None:
    """Fail in one line before the server starts when the file cannot be a model we run:
    not GGUF, truncated, unsupported architecture, no tokenizer."""
    from .errors import ModelLoadError
    from .gguf_file import GGUFFile
    from .models import get_model_class

    gf = GGUFFile(path)
    get_model_class(gf.arch)
    if "tokenizer.ggml.model" not in gf.meta:
        raise ModelLoadError(f"{path}: no tokenizer in this GGUF (tokenizer.ggml.model missing)")


@app.command()
@friendly
@with_options(ServerOptions)
def tui(
    opts: ServerOptions,
    model: Optional[str] = ModelOpt,
    url: Optional[str] = typer.Option(None, "--url", help="attach to a running server instead of starting one"),
    interval: float = typer.Option(1.0, "--interval", help="seconds between polls"),
    no_tui: bool = typer.Option(False, "--no-tui", help="no dashboard: print a snapshot line every interval"),
    once: bool = typer.Option(False, "--once", help=(
        "print one snapshot of a running server (--url, default --host:--port) and exit; never starts one")),
    json_out: bool = typer.Option(False, "--json", help="with --once/--no-tui: JSON lines instead of text"),
    mock: bool = typer.Option(False, "--mock", help="demo data, no server"),
):
    """Run the server with the live dashboard (or attach to one with --url)."""
    from .tui.run import main as tui_main

    if interval <= 0:
        raise LLMCoreError(f"--interval {interval:g}: expected seconds > 0")
    engine = server_cfg = sock = None
    if once and not url and not mock:
        url = f"http://{opts.host}:{opts.port}"  # --once only reads: the local server
    if not url and not mock:  # the same engine and server as `llmcore serve`
        from . import threads as thr
        from .pull import resolve_model

        # every start-up error is one line here, before any screen opens
        cfg, server_cfg = opts.engine_config(), opts.server_config()
        for note in opts.notes():
            typer.echo(f"llmcore: {note}", err=True)
        path = resolve_model(model)
        _check_model(path)
        sock = _listen(opts)
        thr.set_num_threads(opts.threads or None)
        engine = opts.make_engine(path, cfg, replica_logs=no_tui)  # not across the dashboard
    keys = server_cfg.api_keys if server_cfg is not None else opts.api_keys()
    try:
        rc = tui_main(url=url, engine=engine, server_cfg=server_cfg, sock=sock, interval=interval,
                      no_tui=no_tui, once_=once, fmt="json" if json_out else "text", mock=mock,
                      log_level=opts.log_level, api_key=keys[0] if keys else None)
    finally:
        if engine is not None:
            engine.stop()
    raise typer.Exit(rc)


@app.command()
@friendly
@with_options(RuntimeOptions)
def generate(
    opts: RuntimeOptions,
    prompt: str = typer.Option(..., "-p", "--prompt", help="prompt text"),
    model: Optional[str] = ModelOpt,
    n_predict: int = typer.Option(128, "-n", "--n-predict", help="tokens to generate (-1 = until EOS)"),
    temp: float = typer.Option(0.8, "--temp", help="temperature (0 = greedy)"),
    top_k: int = typer.Option(40, "--top-k", help="top-k (0 = off)"),
    top_p: float = typer.Option(0.95, "--top-p", help="top-p (1 = off)"),
    min_p: float = typer.Option(0.05, "--min-p", help="min-p (0 = off)"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", help="repeat penalty (1 = off)"),
    seed: int = typer.Option(-1, "-s", "--seed", help="RNG seed (-1 = random)"),
    chat: bool = typer.Option(False, "--chat", help="wrap the prompt as a user message with the model's chat template"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="keep generating past end-of-generation tokens"),
):
    """Generate text for one prompt, streaming it to the terminal, then print speeds."""
    from . import threads as thr
    from .engine import GenParams, load_engine
    from .pull import resolve_model
    from .sampling import SamplingParams

    path = resolve_model(model)
    cfg = opts.engine_config()
    _check_model(path)
    thr.set_num_threads(opts.threads or None)
    t0 = time.perf_counter()
    eng = load_engine(path, cfg)
    t_load = time.perf_counter() - t0
    try:
        tok = eng.tokenizer
        if chat:
            if eng.chat_template is None:
                raise LLMCoreError("this model has no chat template")
            text = eng.chat_template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
            ids = tok.encode(text, add_special=True, parse_special=True)
            if len(ids) > 1 and ids[0] == ids[1] == tok.bos_id:
                ids = ids[1:]
        else:
            ids = tok.encode(prompt, add_special=True, parse_special=True)
        sp = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                            repeat_penalty=repeat_penalty, seed=seed)
        task = eng.submit(ids, GenParams(n_predict=n_predict, ignore_eos=ignore_eos, sampling=sp), sync=True)
        final = None
        for ev in task:
            if hasattr(ev, "text"):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            else:
                final = ev
        sys.stdout.write("\n")
        sys.stdout.flush()
        t = final.timings.to_dict()
        typer.echo(
            f"load: {t_load:.2f} s | prompt: {t['prompt_n']} tokens, {t['prompt_per_second']:.1f} tok/s | "
            f"generation: {t['predicted_n']} tokens, {t['predicted_per_second']:.1f} tok/s "
            f"(stop: {final.stop_type})",
            err=True,
        )
    finally:
        eng.stop()


@app.command()
@friendly
def pull(
    name: str = typer.Argument(..., help="known model name (smollm2, gemma3-270m)"),
    force: bool = typer.Option(False, "--force", help="download again even if present"),
):
    """Download a known model into the local cache."""
    from .pull import pull as do_pull

    path = do_pull(name, force=force)
    typer.echo(str(path))


@app.command()
@friendly
def info(
    model: Optional[str] = typer.Argument(None, help="GGUF path or known model name (default smollm2)"),
    all_meta: bool = typer.Option(False, "--all", help="print every metadata key"),
):
    """Summarise a GGUF file: architecture, sizes, tokenizer, tensor types."""
    from .gguf_file import GGUFFile
    from .pull import resolve_model

    path = resolve_model(model)
    gf = GGUFFile(path)
    arch = gf.arch
    meta = gf.meta
    out = [
        ("file", str(path)),
        ("size", f"{path.stat().st_size / 2**20:.1f} MiB"),
        ("name", meta.get("general.name", "")),
        ("architecture", arch),
    ]
    for key in ("context_length", "embedding_length", "block_count", "feed_forward_length",
                "attention.head_count", "attention.head_count_kv", "attention.sliding_window",
                "expert_count", "expert_used_count", "rope.freq_base"):
        v = meta.get(f"{arch}.{key}")
        if v is not None:
            out.append((key, v))
    tokens = meta.get("tokenizer.ggml.tokens")
    out.append(("tokenizer", f"{meta.get('tokenizer.ggml.model', '?')}, "
                             f"{len(tokens) if tokens is not None else '?'} tokens"))
    out.append(("chat template", "yes" if meta.get("tokenizer.chat_template") else "no"))
    n_params = sum(int(__import__("math").prod(t.shape)) for t in gf.tensors.values())
    out.append(("parameters", f"{n_params / 1e6:.1f} M in {len(gf.tensors)} tensors"))
    counts = Counter(t.type_name for t in gf.tensors.values())
    nbytes = Counter()
    for t in gf.tensors.values():
        nbytes[t.type_name] += t.nbytes
    out.append(("tensor types", ", ".join(
        f"{k} x{v} ({nbytes[k] / 2**20:.1f} MiB)" for k, v in counts.most_common())))
    w = max(len(k) for k, _ in out)
    for k, v in out:
        typer.echo(f"{k:<{w}}  {v}")
    if all_meta:
        for k in sorted(meta):
            v = meta[k]
            if isinstance(v, (list, tuple)) and len(v) > 8:
                v = f"[{len(v)} items]"
            elif isinstance(v, str) and len(v) > 120:
                v = v[:117] + "..."
            typer.echo(f"  {k} = {v}")


bench_app = typer.Typer(help="Benchmarks against a server.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("load", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                             "help_option_names": []})
def bench_load(ctx: typer.Context):
    """Load benchmark or soak of any OpenAI-compatible server (evalscope perf's flags;
    bench/load.py, -h for its options)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "load.py"
    if not path.exists():
        raise LLMCoreError("llmcore bench load runs bench/load.py of a source checkout")
    spec = importlib.util.spec_from_file_location("llmcore_bench_load", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    raise typer.Exit(mod.main(list(ctx.args)))


def main() -> None:  # pragma: no cover - console entry alternative
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
