"""The engine: one thread owns the model and the slots; requests queue for a free slot.

Each step runs ONE `model.forward` over every active slot: a generating slot contributes
its last sampled token, a prefilling slot a chunk of its prompt (at most `n_ubatch`
tokens, all chunks together at most `n_batch`), so a long prompt never stalls the others'
decoding. Sampled tokens go back to the asyncio loop with `loop.call_soon_threadsafe` on
a per-request `asyncio.Queue` (or to a plain `queue.Queue` for synchronous callers).

The three cache layers (DESIGN.md):

1. Slot prefix reuse (`cache_prompt`): a slot keeps the state of the tokens it evaluated;
   a new request on it trims that state back to the longest common prefix and evaluates
   only the rest (always at least one token, for logits).
2. RAM prompt cache (`cache_ram_mib`; llmcore.cache.prompt_cache): states of idle or
   evicted slots, indexed by a token radix tree, LRU by bytes. A state is a snapshot that
   shares the KV blocks (reference counts), so saving and restoring copy no KV; only
   recurrent state is copied (small, fixed size).
3. Context checkpoints (`ctx_checkpoints`, `checkpoint_every_n_tokens`;
   llmcore.cache.checkpoints): for models whose state cannot be trimmed back (sliding
   window KV, recurrent state) prefill stops at planned positions (every N tokens, the
   start of the last user message `GenParams.checkpoint_at`, a few tokens before the end)
   to snapshot that state. On divergence the newest checkpoint at or before it is
   restored; without one the prompt is re-processed from 0 (`forced_reprefills`).
   Checkpoints travel with a state into the RAM cache.

Slot choice: `id_slot` if given; else the idle slot whose state can provide the longest
prefix (above `slot_prompt_similarity` of the prompt, and at least what the RAM cache
offers); else the least recently used idle slot, whose state is saved to the RAM cache
first and which then takes the best cached state. Requests beyond the slots wait.

Memory: `n_ctx` (-c) is the total number of KV tokens all slots may hold together
(llama-server's unified KV); each slot may use up to `n_ctx_slot` (= n_ctx unified, or
n_ctx / n_parallel). KV blocks are taken on demand, up to n_ctx tokens plus the RAM
cache's budget. When the pool is full during a step: evict RAM-cache entries (LRU), then
idle slots' states, then let prefilling requests wait; a lone request that still does not
fit fails with ContextFullError (HTTP 400), nothing aborts. A failure to save or restore
a cached state is a cache miss, a warning and a counter; the request is still served.

Model contract: `model.new_state()`, `model.forward([(state, int32 tokens), ...]) ->
float32 (n_segments, vocab)` (logits of each segment's last token), `model.n_vocab`,
`model.n_ctx_train`; a state has `tokens`, `n_tokens`, `can_trim(n)`, `trim(n) -> new
length` (keeps the first n) and `release()` (or `free()`).
"""
from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import logging
import queue as queue_mod
import threading
import time
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import metrics
from ..cache.checkpoints import (CheckpointList, needs_checkpoints, plan_positions,
                                restore_checkpoint, take_checkpoint, trim_floor)
from ..cache.prompt_cache import PromptCache
from ..errors import (ContextFullError, LLMCoreError, ModelLoadFailedError, ModelLoadingError,
                     RequestError, ShuttingDownError)
from ..sampling import Sample, Sampler, SamplingParams
from .output import held_suffix, make_stream_decoder

log = logging.getLogger("llmcore.engine")

# share of the RAM available at start-up that the KV pools (slots + prompt cache) may take
KV_RAM_FRACTION = 0.75


# ---------------------------------------------------------------------------------------
# configuration and request parameters


class EngineStatus(str, enum.Enum):
    """What the engine can do now; the values are the strings /health and /props show."""

    LOADING = "loading"
    READY = "ok"
    FAILED = "error"

    def __str__(self) -> str:
        return self.value


@dataclass
class EngineConfig:
    n_ctx: int = 0  # total context; 0 = the model's training context
    n_parallel: int = 1  # slots
    n_batch: int = 2048  # most tokens in one forward (all slots)
    n_ubatch: int = 512  # most prompt tokens one slot adds per forward
    kv_unified: bool = True  # every slot may use the whole n_ctx (memory on demand)
    n_threads: int = 0  # 0 = default (llmcore.threads)
    n_threads_batch: int = 0
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    cache_ram_mib: int = 8192  # prompt cache in RAM; -1 no limit (bounded by free RAM), 0 off
    cache_idle_slots: bool = True  # publish idle slots' states to the RAM cache on new tasks
    ctx_checkpoints: int = 32  # per slot; <= 0 off
    checkpoint_every_n_tokens: int = 8192  # during prefill; <= 0 off (other positions stay)
    slot_prompt_similarity: float = 0.1  # reuse a slot's prefix only above this share of the prompt
    swa_full: bool = False  # full KV on sliding-window layers (trimmable, no checkpoints needed)
    model_alias: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)  # server defaults
    n_predict: int = -1  # default generation limit (-1: until EOS / context end)

    def model_kwargs(self) -> dict:
        """Keyword arguments offered to `load_model` (only those it accepts are passed)."""
        if self.cache_type_v != self.cache_type_k:
            log.warning("separate K/V cache types are not supported yet; using %s for both",
                        self.cache_type_k)
        return dict(
            kv_type=self.cache_type_k,
            n_ctx=self.n_ctx, n_parallel=self.n_parallel, n_batch=self.n_batch,
            n_ubatch=self.n_ubatch, n_threads=self.n_threads,
            n_threads_batch=self.n_threads_batch, cache_type_k=self.cache_type_k,
            cache_type_v=self.cache_type_v, cache_ram_mib=self.cache_ram_mib,
            ctx_checkpoints=self.ctx_checkpoints,
            checkpoint_every_n_tokens=self.checkpoint_every_n_tokens, swa_full=self.swa_full,
        )


@dataclass
class GenParams:
    n_predict: int = -1  # -1: until EOS or the slot's context is full
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    cache_prompt: bool = True
    id_slot: int = -1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    checkpoint_at: int | None = None  # token position where the last user message starts


# ---------------------------------------------------------------------------------------
# events flowing back to the caller


@dataclass
class TokenEvent:
    tokens: list[int]  # newly generated tokens (may be emitted with no text: held back)
    text: str  # text safe to show (never a partial stop string)
    samples: list[Sample] = field(default_factory=list)


@dataclass
class Timings:
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cache_source: str = "none"  # where cache_n came from: slot | ram | checkpoint | none
    checkpoint_restores: int = 0  # context checkpoints restored for this request

    def to_dict(self) -> dict:
        pn, pm, gn, gm = self.prompt_n, self.prompt_ms, self.predicted_n, self.predicted_ms
        return {
            "cache_n": self.cache_n,
            "prompt_n": pn,
            "prompt_ms": pm,
            "prompt_per_token_ms": pm / pn if pn else 0.0,
            "prompt_per_second": 1e3 * pn / pm if pm > 0 else 0.0,
            "predicted_n": gn,
            "predicted_ms": gm,
            "predicted_per_token_ms": gm / gn if gn else 0.0,
            "predicted_per_second": 1e3 * gn / gm if gm > 0 else 0.0,
            "cache_source": self.cache_source,
            "checkpoint_restores": self.checkpoint_restores,
        }


@dataclass
class FinalEvent:
    stop_type: str  # eos | limit | word | cancel
    stopping_word: str
    n_prompt: int  # tokens in the prompt
    n_predicted: int
    timings: Timings
    slot_id: int
    truncated: bool = False

    @property
    def finish_reason(self) -> str:
        return "length" if self.stop_type == "limit" else "stop"


@dataclass
class ErrorEvent:
    error: BaseException


# ---------------------------------------------------------------------------------------
# a request, as seen by both sides


_task_ids = itertools.count(1)


class Task:
    """A submitted request. Iterate it (async or sync) for TokenEvents then one
    FinalEvent; an ErrorEvent's exception is raised instead. `cancel()` is thread-safe."""

    def __init__(self, engine: "Engine", prompt: list[int], params: GenParams,
                 loop: asyncio.AbstractEventLoop | None):
        self.id = next(_task_ids)
        self.engine = engine
        self.prompt = prompt
        self.params = params
        self.loop = loop
        self.cancelled = False
        self.done = False
        self.slot_id: int | None = None
        self.t_submit = time.perf_counter()
        self._getter: asyncio.Future | None = None
        if loop is not None:
            self._aq: asyncio.Queue = asyncio.Queue()
        else:
            self._q: queue_mod.Queue = queue_mod.Queue()

    # engine side
    def _put(self, ev) -> None:
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self._aq.put_nowait, ev)
            except RuntimeError:  # loop closed: nobody listens any more
                self.cancelled = True
        else:
            self._q.put(ev)

    # caller side
    def cancel(self) -> None:
        if not self.done and not self.cancelled:
            self.cancelled = True
            self.engine._wake()

    async def next_event(self, timeout: float | None = None):
        """Next event; raises asyncio.TimeoutError after `timeout` seconds without one.

        One getter future survives timeouts, so no event is ever lost to a timeout."""
        if self._getter is None:
            self._getter = asyncio.ensure_future(self._aq.get())
        done, _ = await asyncio.wait({self._getter}, timeout=timeout)
        if not done:
            raise asyncio.TimeoutError
        ev = self._getter.result()
        self._getter = None
        return self._check(ev)

    def close(self) -> None:
        """Caller is done with this task: cancel it if still running, drop the getter."""
        if self._getter is not None:
            self._getter.cancel()
            self._getter = None
        if not self.done:
            self.cancel()

    def _check(self, ev):
        if isinstance(ev, ErrorEvent):
            self.done = True
            raise ev.error
        if isinstance(ev, FinalEvent):
            self.done = True
        return ev

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        try:
            while True:
                ev = await self.next_event()
                yield ev
                if isinstance(ev, FinalEvent):
                    return
        finally:
            self.close()

    def __iter__(self):
        try:
            while True:
                ev = self._check(self._q.get())
                yield ev
                if isinstance(ev, FinalEvent):
                    return
        finally:
            if not self.done:
                self.cancel()

    async def collect(self) -> "Completion":
        c = Completion()
        async for ev in self:
            c.add(ev)
        return c

    def collect_sync(self) -> "Completion":
        c = Completion()
        for ev in self:
            c.add(ev)
        return c


@dataclass
class Completion:
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    final: FinalEvent | None = None

    def add(self, ev) -> None:
        if isinstance(ev, TokenEvent):
            self.text += ev.text
            self.tokens.extend(ev.tokens)
            self.samples.extend(ev.samples)
        elif isinstance(ev, FinalEvent):
            self.final = ev


# ---------------------------------------------------------------------------------------
# slots


def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


def _release_state(state) -> None:
    fn = getattr(state, "release", None) or getattr(state, "free", None)
    if fn is not None:
        fn()


class Slot:
    def __init__(self, id: int, n_ctx: int, max_checkpoints: int = 32):
        self.id = id
        self.n_ctx = n_ctx
        self.state = None  # model state (kept between requests for prefix reuse)
        self.checkpoints = CheckpointList(max_checkpoints)  # of self.state's token sequence
        self.published = False  # state already saved to the RAM cache as it is now
        self.task: Task | None = None
        self.phase = "idle"  # idle | prefill | decode
        self.t_last_used = 0.0
        self._reset_request()

    def _reset_request(self) -> None:
        self.pending = np.zeros(0, dtype=np.int32)  # prompt tokens still to evaluate
        self.i_pending = 0
        self.n_prompt = 0
        self.n_cached = 0
        self.generated: list[int] = []
        self.last_token = -1
        self.sampler: Sampler | None = None
        self.decoder = None
        self.text = ""
        self.n_sent = 0  # characters of self.text already emitted
        self.t_start = 0.0
        self.t_prompt_done = 0.0
        self.history: list[int] = []
        self.cache_source = "none"
        self.n_ckpt_restored = 0
        self.ckpt_plan: collections.deque = collections.deque()  # (position, kind)

    @property
    def n_tokens(self) -> int:
        return 0 if self.state is None else int(self.state.n_tokens)

    def cached_tokens(self) -> list[int]:
        return [] if self.state is None else self.state.tokens

    def stats(self) -> metrics.SlotStats:
        now = time.perf_counter()
        pps = gps = 0.0
        n_prefilled = self.i_pending if self.phase == "prefill" else len(self.pending)
        if self.task is not None:
            if self.phase == "prefill" and now > self.t_start:
                pps = n_prefilled / (now - self.t_start)
            elif self.t_prompt_done and now > self.t_prompt_done:
                pt = self.t_prompt_done - self.t_start
                pps = len(self.pending) / pt if pt > 0 else 0.0
                gps = len(self.generated) / (now - self.t_prompt_done)
        st = self.state
        return metrics.SlotStats(
            id=self.id, state=self.phase, n_ctx=self.n_ctx, n_tokens=self.n_tokens,
            task_id=self.task.id if self.task else None, n_prompt=self.n_prompt,
            n_cached=self.n_cached, n_prefilled=n_prefilled, n_decoded=len(self.generated),
            prompt_per_second=pps, predicted_per_second=gps, t_last_used=self.t_last_used,
            nbytes=int(getattr(st, "nbytes", 0) or 0) if st is not None else 0,
            cache_source=self.cache_source, n_checkpoints=len(self.checkpoints),
            checkpoint_bytes=self.checkpoints.nbytes,
        )


def stop_holdback(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that could still become a stop string."""
    return held_suffix(text, stops)


# ---------------------------------------------------------------------------------------
# the engine


class Engine:
    """Owns model, tokenizer and slots on one thread. Construct with a loaded model, or
    with `loader` (called on the engine thread; returns (model, tokenizer, chat_template,
    info dict)) so that the server can answer /health while the model loads."""

    def __init__(self, cfg: EngineConfig | None = None, model=None, tokenizer=None,
                 chat_template=None, loader: Callable[[], tuple] | None = None,
                 info: dict | None = None):
        self.cfg = cfg or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.info: dict = dict(info or {})
        self._loader = loader
        self.status = EngineStatus.LOADING
        self.load_error: str | None = None
        self.slots: list[Slot] = []
        self.n_ctx = 0
        self.n_ctx_slot = 0
        self.eog_ids: frozenset[int] = frozenset()
        self._cv = threading.Condition()
        self._inbox: collections.deque[Task] = collections.deque()
        self._waiting: collections.deque[Task] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._ready = threading.Event()
        self._threads_now = 0
        self._adaptive = None  # threads.AdaptiveThreads for decode steps, made on first use
        self.t_start = time.time()
        # counters (written by the engine thread only)
        self.c = dict(requests_total=0, requests_errors=0, requests_cancelled=0,
                      prompt_tokens_total=0, prompt_seconds_total=0.0,
                      tokens_predicted_total=0, tokens_predicted_seconds_total=0.0,
                      cache_tokens_total=0, n_decode_total=0, n_busy_slots_total=0,
                      n_tokens_max=0,
                      slot_hits=0, slot_misses=0, ram_hits=0, ram_misses=0,
                      cache_save_failures=0, cache_restore_failures=0,
                      checkpoints_created=0, checkpoints_restored=0, checkpoints_erased=0,
                      checkpoint_failures=0, forced_reprefills=0, idle_slot_evictions=0,
                      kv_full_waits=0, kv_full_failures=0)
        self.pcache: PromptCache | None = None
        self._scratch = None  # an empty state used to release snapshots
        self._needs_ckpt = False
        self._cache_numbers: dict = {}
        self.memory_plan: dict = {}
        # test hook: called with "save" | "restore" | "checkpoint" before each such operation
        self.fault_hook: Callable[[str], None] | None = None
        if model is not None:
            self._setup()

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def from_path(cls, path: str | Path, cfg: EngineConfig | None = None) -> "Engine":
        """Engine that loads the GGUF at `path` on its own thread (see `start`)."""
        cfg = cfg or EngineConfig()
        path = Path(path)

        def loader():
            from ..gguf_file import GGUFFile
            from ..models import load_model
            from ..tokenizer import Tokenizer

            gf = GGUFFile(path)
            kwargs = cfg.model_kwargs()
            try:
                sig = inspect.signature(load_model)
                if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
                    kwargs = {k: v for k, v in kwargs.items() if k in sig.parameters}
            except (TypeError, ValueError):
                pass
            model = load_model(gf, **kwargs)
            tok = Tokenizer.from_gguf(gf)
            try:
                from ..chat import ChatTemplate

                tmpl = ChatTemplate.from_gguf(gf, tok)
            except Exception as e:  # noqa: BLE001 - a model without a usable template still completes
                log.warning("no chat template: %s", e)
                tmpl = None
            meta = gf.meta
            info = {
                "path": str(path),
                "arch": getattr(gf, "arch", ""),
                "name": meta.get("general.name", path.stem),
                "size": path.stat().st_size,
                "n_embd": meta.get(f"{getattr(gf, 'arch', '')}.embedding_length"),
                "n_params": sum(int(np.prod(t.shape)) for t in gf.tensors.values())
                if hasattr(gf, "tensors") else None,
                "chat_template": meta.get("tokenizer.chat_template"),
            }
            return model, tok, tmpl, info

        eng = cls(cfg, loader=loader, info={"path": str(path), "name": path.stem})
        return eng

    def _setup(self) -> None:
        m = self.model
        n_train = int(getattr(m, "n_ctx_train", 0) or 0)
        self.n_ctx = self.cfg.n_ctx if self.cfg.n_ctx > 0 else (n_train or 4096)
        npar = max(1, self.cfg.n_parallel)
        self.n_ctx_slot = self.n_ctx if self.cfg.kv_unified else max(1, self.n_ctx // npar)
        self.slots = [Slot(i, self.n_ctx_slot, self.cfg.ctx_checkpoints) for i in range(npar)]
        self._setup_caches()
        tok = self.tokenizer
        eog = set(getattr(tok, "eog_ids", ()) or ())
        if getattr(tok, "eos_id", None) is not None and tok.eos_id >= 0:
            eog.add(tok.eos_id)
        self.eog_ids = frozenset(int(t) for t in eog)
        self.info.setdefault("n_vocab", int(getattr(m, "n_vocab", 0) or 0))
        self.info.setdefault("n_ctx_train", n_train)
        self.status = EngineStatus.READY
        self._ready.set()

    def _setup_caches(self) -> None:
        """Pool limits (KV on demand up to n_ctx tokens + the cache budget), the RAM prompt
        cache, and the start-up memory report."""
        m, cfg = self.model, self.cfg
        probe = m.new_state()
        snap_ok = all(hasattr(probe, a) for a in ("snapshot", "restore", "release_snapshot"))
        self._needs_ckpt = needs_checkpoints(probe)
        self._scratch = probe if snap_ok else None
        avail, total = _host_memory()
        if cfg.cache_ram_mib < 0:
            cache_budget = avail // 2 if avail else None  # "no limit", bounded by free RAM
        else:
            cache_budget = cfg.cache_ram_mib << 20
        if snap_ok and cfg.cache_ram_mib != 0:
            self.pcache = PromptCache(cache_budget, on_release=self._release_entry)
        pools = dict(getattr(m, "pools", {}) or {})
        npar = len(self.slots)
        bpb_total = sum(p.bytes_per_block for p in pools.values()) or 1
        extra = (cache_budget or 0) // bpb_total if self.pcache is not None else 0
        kv_max = kv_live = 0
        for p in pools.values():
            if p.max_blocks is None:
                p.max_blocks = p.blocks_for(self.n_ctx) + 2 * npar + extra
            kv_max += p.max_blocks * p.bytes_per_block
            kv_live += min(p.max_blocks, p.blocks_for(self.n_ctx) + 2 * npar) * p.bytes_per_block
        # -c is a ceiling, not a reservation; but a ceiling beyond the machine's RAM would be
        # a promise the process cannot keep: cap the pools at most of what is available now
        # (the model is already loaded), so a full pool means "wait or refuse", never OOM.
        ram_cap = int(avail * KV_RAM_FRACTION) if avail else 0
        capped = bool(ram_cap and kv_max > ram_cap)
        if capped:
            scale = ram_cap / kv_max
            kv_max = kv_live = 0
            for p in pools.values():
                p.max_blocks = max(2 * npar, int(p.max_blocks * scale))
                kv_max += p.max_blocks * p.bytes_per_block
                kv_live += min(p.max_blocks, p.blocks_for(self.n_ctx) + 2 * npar) * p.bytes_per_block
        # what one checkpoint of this model costs at most
        ck_bytes = 0
        for c in getattr(probe, "caches", {}).values():
            if hasattr(c, "state_bytes"):
                ck_bytes += int(c.state_bytes)
            elif hasattr(c, "window") and hasattr(c, "pool"):
                ck_bytes += c.pool.blocks_for(c.window + c.pool.block_size) * c.pool.bytes_per_block
        n_ck = max(0, cfg.ctx_checkpoints) if self._needs_ckpt else 0
        self.memory_plan = dict(
            kv_bytes_per_token=sum(p.bytes_per_token for p in pools.values()),
            kv_max_bytes=kv_max, kv_slots_max_bytes=kv_live, cache_ram_max_bytes=cache_budget if self.pcache else 0,
            checkpoint_bytes=ck_bytes, checkpoints_max_bytes=n_ck * ck_bytes * npar,
            host_total_bytes=total, host_available_bytes=avail)
        mib = lambda b: "unbounded" if b is None else f"{b / 2**20:.0f} MiB"
        log.info("memory: KV for the slots up to %s (%d tokens x %d B/token over %d slot(s), taken "
                 "on demand); prompt cache %s (its KV blocks live in the same pools, pool limit "
                 "%s); checkpoints %s (%d per slot x %s); host RAM %s total, %s available",
                 mib(kv_live), self.n_ctx, self.memory_plan["kv_bytes_per_token"], npar,
                 mib(cache_budget) if self.pcache else "off", mib(kv_max),
                 mib(n_ck * ck_bytes * npar) if n_ck else "not needed" if not self._needs_ckpt else "off",
                 n_ck, mib(ck_bytes), mib(total), mib(avail))
        if capped:
            log.warning("memory: -c %d and the prompt cache would need more than %.0f%% of the %s "
                        "available; KV pools capped at %s (%d tokens): requests beyond that wait "
                        "or are refused with the numbers", self.n_ctx, KV_RAM_FRACTION * 100,
                        mib(avail), mib(kv_max), kv_max // max(1, self.memory_plan["kv_bytes_per_token"]))
        self.memory_plan["kv_capped_by_ram"] = capped
        if avail and kv_max + (n_ck * ck_bytes * npar) > avail:
            log.warning("KV + checkpoints may use up to %s, more than the %s available: requests "
                        "will wait or be refused when memory runs out", mib(kv_max + n_ck * ck_bytes * npar),
                        mib(avail))
        self._refresh_cache_numbers()

    @property
    def model_name(self) -> str:
        return self.cfg.model_alias or self.info.get("path") or self.info.get("name") or "model"

    @property
    def ready(self) -> bool:
        return self.status is EngineStatus.READY

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="llmcore-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.ready

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # ---- submission (any thread) -----------------------------------------------------
    @property
    def needs_checkpoints(self) -> bool:
        """Whether the model has state that trimming cannot rebuild (sliding window,
        recurrent): then prompts get context checkpoints."""
        return self._needs_ckpt

    def require_ready(self) -> None:
        """Raise ModelLoadingError / ModelLoadFailedError unless the engine serves."""
        if self.status is EngineStatus.LOADING:
            raise ModelLoadingError()
        if self.status is not EngineStatus.READY:
            raise ModelLoadFailedError(f"model failed to load: {self.load_error}")

    def check_prompt(self, prompt: list[int]) -> None:
        self.require_ready()
        if len(prompt) == 0:
            raise RequestError("the prompt is empty")
        if len(prompt) >= self.n_ctx_slot:
            err = ContextFullError(
                f"the request exceeds the available context size, try increasing it "
                f"({len(prompt)} prompt tokens, n_ctx {self.n_ctx_slot}). This model's maximum "
                f"context length is {self.n_ctx_slot} tokens. However, your messages resulted "
                f"in {len(prompt)} tokens.")
            err.n_prompt_tokens, err.n_ctx = len(prompt), self.n_ctx_slot
            raise err
        nv = int(self.info.get("n_vocab") or 0)
        if nv and (min(prompt) < 0 or max(prompt) >= nv):
            raise RequestError(f"prompt contains an invalid token id (vocabulary size {nv})")

    def submit(self, prompt, params: GenParams | None = None,
               loop: asyncio.AbstractEventLoop | None = None, sync: bool = False) -> Task:
        """Queue a request. Validates first (raises RequestError/ContextFullError before any
        work). From a coroutine the task delivers to the running loop; `sync=True` (or no
        running loop) gives a task to iterate from a plain thread."""
        prompt = [int(t) for t in prompt]
        params = params or GenParams()
        self.check_prompt(prompt)
        if params.id_slot is not None and params.id_slot >= len(self.slots):
            raise RequestError(f"id_slot {params.id_slot} out of range (0..{len(self.slots) - 1})")
        params.sampling.validate()
        for s in params.stop:
            if not isinstance(s, str):
                raise RequestError("stop must be a string or a list of strings")
        if loop is None and not sync:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        task = Task(self, prompt, params, loop)
        with self._cv:
            self._inbox.append(task)
            self._cv.notify_all()
        return task

    # ---- stats (any thread) ----------------------------------------------------------
    def stats(self) -> metrics.EngineStats:
        slots = tuple(s.stats() for s in list(self.slots))
        c = dict(self.c)
        busy = sum(1 for s in slots if s.state != "idle")
        waiting = len(self._waiting) + len(self._inbox)
        return metrics.EngineStats(
            status=self.status, model=self.model_name, n_ctx=self.n_ctx,
            n_ctx_slot=self.n_ctx_slot, n_slots=len(slots),
            requests_processing=busy, requests_deferred=waiting,
            uptime_s=time.time() - self.t_start, slots=slots,
            model_stats=self._cache_stats(), **self._cache_numbers, **c,
        )

    def _refresh_cache_numbers(self) -> None:
        """Engine thread: numbers of the cache layers for stats() (read from any thread)."""
        pc = self.pcache
        pools = dict(getattr(self.model, "pools", {}) or {})
        ck_n = sum(len(s.checkpoints) for s in self.slots)
        ck_b = sum(s.checkpoints.nbytes for s in self.slots)
        self._cache_numbers = dict(
            cache_ram_bytes=pc.nbytes if pc else 0,
            cache_ram_limit_bytes=(-1 if pc.limit_bytes is None else pc.limit_bytes) if pc else 0,
            cache_ram_entries=pc.n_entries if pc else 0,
            cache_ram_tokens=pc.n_tokens if pc else 0,
            cache_ram_evictions=pc.stats["evictions"] if pc else 0,
            cache_ram_inserts=pc.stats["inserts"] if pc else 0,
            checkpoints_count=ck_n, checkpoints_bytes=ck_b,
            kv_used_bytes=sum(p.used_bytes for p in pools.values()),
            kv_limit_bytes=sum((p.max_blocks or 0) * p.bytes_per_block for p in pools.values()),
        )

    def _cache_stats(self) -> dict:
        fn = getattr(self.model, "cache_stats", None)
        try:
            return dict(fn()) if callable(fn) else {}
        except Exception:  # noqa: BLE001 - stats must never break /metrics
            return {}

    # ---- engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        if self.model is None and self._loader is not None:
            try:
                model, tok, tmpl, info = self._loader()
                self.model, self.tokenizer, self.chat_template = model, tok, tmpl
                self.info.update({k: v for k, v in info.items() if v is not None})
                self._setup()
                log.info("model loaded: %s (n_ctx %d, %d slots)", self.model_name, self.n_ctx,
                         len(self.slots))
            except Exception as e:  # noqa: BLE001 - report, don't die silently
                if isinstance(e, LLMCoreError):  # the user's file: one line, no traceback
                    log.error("model load failed: %s", e)
                else:
                    log.exception("model load failed")
                self.status = EngineStatus.FAILED
                self.load_error = str(e)
                self._ready.set()
                return
        while True:
            with self._cv:
                if self._stop:
                    break
                while self._inbox:
                    self._waiting.append(self._inbox.popleft())
                if not self._waiting and not any(s.task for s in self.slots):
                    self._cv.wait(0.5)
                    continue
            try:
                self._schedule()
                active = [s for s in self.slots if s.task is not None]
                if active:
                    self._step(active)
            except Exception as e:  # noqa: BLE001 - never let the engine thread die
                log.exception("engine step failed")
                for s in self.slots:
                    if s.task is not None:
                        self._fail(s, e, reset_state=True)
        # shutting down: tell everyone
        err = ShuttingDownError()
        for s in self.slots:
            if s.task is not None:
                self._fail(s, err, reset_state=False)
        for t in list(self._waiting) + list(self._inbox):
            t._put(ErrorEvent(err))
        self._waiting.clear()
        self._inbox.clear()

    def _schedule(self) -> None:
        # cancellations
        for s in self.slots:
            if s.task is not None and s.task.cancelled:
                self._finish(s, "cancel")
        if any(t.cancelled for t in self._waiting):
            for t in [t for t in self._waiting if t.cancelled]:
                t.done = True
                self.c["requests_cancelled"] += 1
            self._waiting = collections.deque(t for t in self._waiting if not t.cancelled)
        # admissions, FIFO; a task pinned to a busy slot waits without blocking others
        if not self._waiting:
            return
        still = collections.deque()
        for task in self._waiting:
            slot = self._pick_slot(task)
            if slot is None or not self._admissible(task):
                still.append(task)
                continue
            try:
                self._start(slot, task)
            except Exception as e:  # noqa: BLE001
                log.exception("starting a task failed")
                self._fail(slot, e, reset_state=True)
        self._waiting = still

    # ---- cache layers (engine thread) -----------------------------------------------
    def _fault(self, what: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(what)

    def _usable_in_slot(self, slot: Slot, prompt: list[int]) -> tuple[int, str]:
        """Prompt tokens the slot's own state (or one of its checkpoints) can provide."""
        st = slot.state
        if st is None or st.n_tokens == 0:
            return 0, "none"
        n = min(common_prefix(st.tokens, prompt), len(prompt) - 1)
        if n <= 0:
            return 0, "none"
        if n == st.n_tokens or n >= trim_floor(st):
            return n, "slot"
        ck = slot.checkpoints.best_at_or_before(n)
        if ck is not None and ck.n_tokens > 0:
            return ck.n_tokens, "checkpoint"
        return 0, "none"

    def _ram_best(self, prompt: list[int]):
        if self.pcache is None or len(prompt) < 2:
            return None, 0
        return self.pcache.best(prompt[:-1])

    def _pick_slot(self, task: Task) -> Slot | None:
        idle = [s for s in self.slots if s.task is None]
        if not idle:
            return None
        want = task.params.id_slot
        if want is not None and want >= 0:
            s = self.slots[want]
            return s if s.task is None else None
        if task.params.cache_prompt:
            best, best_n = None, 0
            for s in idle:
                n, _ = self._usable_in_slot(s, task.prompt)
                if n > best_n:
                    best, best_n = s, n
            _, ram_n = self._ram_best(task.prompt)
            if best is not None and best_n > self.cfg.slot_prompt_similarity * len(task.prompt) \
                    and best_n >= ram_n:
                return best
        # least recently used (an empty slot first): its state goes to the RAM cache
        return min(idle, key=lambda s: (s.n_tokens > 0, s.t_last_used))

    def _start(self, slot: Slot, task: Task) -> None:
        slot._reset_request()
        slot.task = task
        slot.published = False
        task.slot_id = slot.id
        prompt = task.prompt
        slot.t_start = time.perf_counter()
        if slot.state is None:
            slot.state = self.model.new_state()
            slot.checkpoints.clear()
        n_keep = self._reuse_prefix(slot, prompt, task.params.cache_prompt)
        slot.n_prompt = len(prompt)
        slot.n_cached = n_keep
        slot.pending = np.asarray(prompt[n_keep:], dtype=np.int32)
        slot.i_pending = 0
        slot.history = list(prompt)
        slot.sampler = Sampler(task.params.sampling, int(self.info.get("n_vocab") or 0) or None)
        slot.decoder = make_stream_decoder(self.tokenizer)
        slot.phase = "prefill"
        cfg = self.cfg
        if self._needs_ckpt and cfg.ctx_checkpoints > 0:
            at = task.params.checkpoint_at
            slot.ckpt_plan = collections.deque(plan_positions(
                n_keep, len(prompt), cfg.checkpoint_every_n_tokens, at, cfg.n_ubatch))
        if self.pcache is not None and cfg.cache_idle_slots:
            for s in self.slots:
                if s.task is None and not s.published and s.n_tokens > 0:
                    self._save_slot(s)
        self._refresh_cache_numbers()

    def _reuse_prefix(self, slot: Slot, prompt: list[int], cache_prompt: bool) -> int:
        """Bring the slot's state to the longest prefix of `prompt` that the slot, the RAM
        cache or a checkpoint can provide; returns the tokens kept (< len(prompt): at least
        one token is evaluated for its logits). Sets slot.cache_source / n_ckpt_restored."""
        st = slot.state
        limit = len(prompt) - 1
        if not cache_prompt:
            if st.n_tokens:
                self._save_slot(slot)
            self._bring_to(slot, 0)
            return 0
        n_slot, how = self._usable_in_slot(slot, prompt)
        lcp_slot = min(common_prefix(st.tokens, prompt), limit) if st.n_tokens else 0
        entry, n_ram = self._ram_best(prompt)
        if self.pcache is not None and entry is None:
            self.c["ram_misses"] += 1
        if entry is not None and n_ram > n_slot:
            self._save_slot(slot)  # the slot's own content is about to be replaced
            got = self._restore_entry(slot, entry, n_ram)
            if got > 0:
                self.c["ram_hits"] += 1
                slot.cache_source = "ram"
                return got
            n_slot, how = 0, "none"  # the restore failed and cleared the slot: cold
        elif st.n_tokens and n_slot < 0.5 * st.n_tokens:
            self._save_slot(slot)  # it loses more than half: keep the whole in RAM
        got, used_ck = self._bring_to(slot, n_slot)
        if got > 0:
            self.c["slot_hits"] += 1
            slot.cache_source = "checkpoint" if used_ck else "slot"
        else:
            self.c["slot_misses"] += 1
            if max(lcp_slot, n_ram) > 0 and self._needs_ckpt:
                self.c["forced_reprefills"] += 1
                log.info("slot %d: forcing full prompt re-processing (%d tokens in common, no "
                         "checkpoint at or before them)", slot.id, max(lcp_slot, n_ram))
        return got

    def _bring_to(self, slot: Slot, n: int) -> tuple[int, bool]:
        """Cut the slot's state back to its first n tokens, restoring a checkpoint where
        trimming cannot; clears it when neither works. Returns (tokens kept, checkpoint used)."""
        st = slot.state
        used = trying_ck = False
        n = max(0, min(n, st.n_tokens))
        try:
            if 0 < n < st.n_tokens:
                if n >= trim_floor(st) and st.can_trim(n):
                    if st.trim(n) != n:
                        raise RuntimeError(f"trim to {n} failed")
                else:
                    ck = slot.checkpoints.best_at_or_before(n)
                    if ck is None or ck.n_tokens == 0:
                        n = 0
                    else:
                        trying_ck = True
                        self._fault("restore")
                        n = restore_checkpoint(st, ck)
                        used = True
                        self.c["checkpoints_restored"] += 1
                        slot.n_ckpt_restored += 1
        except Exception as e:  # noqa: BLE001 - a failed restore is a miss, never a crash
            log.warning("slot %d: restoring the cached state failed (%s); re-processing the prompt",
                        slot.id, e)
            self.c["checkpoint_failures" if trying_ck else "cache_restore_failures"] += 1
            n, used = 0, False
        if n == 0 and st.n_tokens:
            self._clear_state(slot)
        self.c["checkpoints_erased"] += slot.checkpoints.erase_after(n)
        return n, used

    def _clear_state(self, slot: Slot) -> None:
        st = slot.state
        try:
            _release_state(st)
        except Exception:  # noqa: BLE001
            log.exception("releasing slot %d state failed", slot.id)
        if st is None or st.n_tokens:
            slot.state = self.model.new_state()
        self.c["checkpoints_erased"] += slot.checkpoints.clear()

    def _footprint(self, snap, cks) -> tuple[int, dict, dict]:
        """Bytes a cached state owns outright, and the KV blocks it references, by pool."""
        own, blocks, bb = 0, {}, {}

        def add(x):
            nonlocal own
            pool = getattr(x, "pool", None)
            ids = getattr(x, "blocks", None)
            if pool is not None and ids is not None:
                key = pool.name
                blocks.setdefault(key, []).extend(np.asarray(ids).tolist())
                bb[key] = pool.bytes_per_block
            else:
                own += int(getattr(x, "nbytes", 0) or 0)

        for x in getattr(snap, "caches", {}).values():
            add(x)
        for ck in cks:
            for x in ck.snap.values():
                add(x)
        return own, blocks, bb

    def _save_slot(self, slot: Slot) -> None:
        """Publish the slot's state (with its checkpoints) to the RAM cache. Blocks are
        shared, not copied. Any failure is a warning and a counter."""
        st = slot.state
        if self.pcache is None or st is None or st.n_tokens == 0 or slot.published:
            return
        snap = cks = None
        try:
            self._fault("save")
            snap = st.snapshot()
            cks = slot.checkpoints.share()
            own, blocks, bb = self._footprint(snap, cks)
            entry = self.pcache.insert(st.tokens, snap, checkpoints=cks, trim_floor=trim_floor(st),
                                       own_bytes=own, blocks=blocks, block_bytes=bb,
                                       meta={"slot": slot.id})
            snap = cks = None  # the cache owns (or already released) them now
            slot.published = True
            if entry is not None:
                log.debug("slot %d: saved %d tokens to the prompt cache (%d entries, %.1f MiB)",
                          slot.id, entry.n_tokens, self.pcache.n_entries, self.pcache.nbytes / 2**20)
        except Exception as e:  # noqa: BLE001 - never let a cache failure hurt a request
            self.c["cache_save_failures"] += 1
            log.warning("slot %d: saving the state to the prompt cache failed: %s", slot.id, e)
            try:
                if snap is not None:
                    st.release_snapshot(snap)
                if cks is not None:
                    cks.clear()
            except Exception:  # noqa: BLE001
                log.exception("cleanup after a failed save")

    def _restore_entry(self, slot: Slot, entry, n: int) -> int:
        """Make the slot hold `entry`'s state cut back to n tokens; 0 on failure (the slot is
        then empty, the entry stays cached)."""
        st = slot.state
        try:
            self._fault("restore")
            self.c["checkpoints_erased"] += slot.checkpoints.clear()
            st.restore(entry.state)  # shares the blocks (copy-on-write)
            slot.checkpoints = entry.checkpoints.share() if entry.checkpoints is not None \
                else CheckpointList(self.cfg.ctx_checkpoints)
            slot.checkpoints.max_n = self.cfg.ctx_checkpoints
            self.pcache.touch(entry)
        except Exception as e:  # noqa: BLE001
            self.c["cache_restore_failures"] += 1
            log.warning("slot %d: restoring a cached state failed: %s", slot.id, e)
            self._clear_state(slot)
            return 0
        got, _ = self._bring_to(slot, n)
        return got

    def _release_entry(self, entry) -> None:
        """PromptCache callback: drop the references an evicted entry holds."""
        try:
            if self._scratch is not None and entry.state is not None:
                self._scratch.release_snapshot(entry.state)
        finally:
            if entry.checkpoints is not None:
                entry.checkpoints.clear()

    def _release_partial(self, snap: dict) -> None:
        """Checkpoint callback: give back a partial snapshot's references."""
        caches = getattr(self._scratch, "caches", {})
        for k, x in snap.items():
            c = caches.get(k)
            if c is not None:
                c.release_snapshot(x)

    def _take_checkpoint(self, s: Slot, kind: str) -> None:
        try:
            self._fault("checkpoint")
            ck = take_checkpoint(s.state, kind, release=self._release_partial)
        except Exception as e:  # noqa: BLE001
            self.c["checkpoint_failures"] += 1
            log.warning("slot %d: creating a context checkpoint failed: %s", s.id, e)
            return
        if ck is None:
            return
        self.c["checkpoints_created"] += 1
        self.c["checkpoints_erased"] += s.checkpoints.add(ck)
        log.debug("slot %d: context checkpoint %d of %d at %d tokens (%s, %d B)", s.id,
                  len(s.checkpoints), s.checkpoints.max_n, ck.n_tokens, kind, ck.nbytes)

    # ---- memory pressure -------------------------------------------------------------
    def _blocks_short(self, batch) -> dict:
        """Pools that lack blocks for `batch`: pool -> blocks missing."""
        need: dict = {}
        pools = {}
        for st, toks in batch:
            for c in getattr(st, "caches", {}).values():
                fn = getattr(c, "blocks_needed", None)
                pool = getattr(c, "pool", None)
                if fn is None or pool is None:
                    continue
                need[id(pool)] = need.get(id(pool), 0) + max(0, int(fn(len(toks))))
                pools[id(pool)] = pool
        return {pools[k]: n - pools[k].n_free for k, n in need.items() if n > pools[k].n_free}

    def _make_room(self, batch, active: list[Slot]) -> bool:
        """Free KV blocks for `batch`: RAM-cache entries first (LRU), then idle slots'
        states. Returns True when something was freed."""
        freed = False
        short = self._blocks_short(batch)
        if not short and batch:
            short = {None: 1}  # the model said full without per-cache numbers: free one thing
        while short:
            if self.pcache is not None and self.pcache.n_entries:
                self.pcache.evict_lru()
                freed = True
            else:
                idle = [s for s in self.slots if s.task is None and s.n_tokens > 0]
                if not idle:
                    break
                victim = min(idle, key=lambda s: s.t_last_used)
                log.info("KV pool full: dropping idle slot %d's state (%d tokens)", victim.id,
                         victim.n_tokens)
                self._clear_state(victim)
                victim.published = False
                self.c["idle_slot_evictions"] += 1
                freed = True
            short = self._blocks_short(batch)
            if None in short:
                break
        return freed

    def _step(self, active: list[Slot]) -> None:
        cfg = self.cfg
        batch, owners = [], []
        budget = max(1, cfg.n_batch)
        for s in active:
            if s.phase == "decode":
                batch.append((s.state, np.array([s.last_token], dtype=np.int32)))
                owners.append((s, 1))
                budget -= 1
        for s in sorted((s for s in active if s.phase == "prefill"), key=lambda s: s.task.t_submit):
            if budget <= 0 and batch:
                break
            left = len(s.pending) - s.i_pending
            n = max(1, min(left, cfg.n_ubatch, budget))
            if s.ckpt_plan:  # stop the chunk at the next checkpoint position
                pos = s.n_cached + s.i_pending
                while s.ckpt_plan and s.ckpt_plan[0][0] <= pos:
                    s.ckpt_plan.popleft()
                if s.ckpt_plan:
                    n = max(1, min(n, s.ckpt_plan[0][0] - pos))
            batch.append((s.state, s.pending[s.i_pending:s.i_pending + n]))
            owners.append((s, n))
            budget -= n
        if not batch:
            return
        decode_only = all(s.phase == "decode" for s, _ in owners)
        n_threads = self._set_threads(prefill=not decode_only, n_tokens=len(owners))
        t0 = time.perf_counter()
        logits = self._forward(batch, owners, active)
        if logits is None:
            return
        if decode_only and self._adaptive is not None:
            self._adaptive.record(len(owners), n_threads, time.perf_counter() - t0)
        self.c["n_decode_total"] += 1
        self.c["n_busy_slots_total"] += len(owners)
        t1 = time.perf_counter()
        for i, (s, n) in enumerate(owners):
            if s.task is None:
                continue
            try:
                self.c["n_tokens_max"] = max(self.c["n_tokens_max"], s.n_tokens)
                if s.phase == "prefill":
                    s.i_pending += n
                    if s.ckpt_plan and s.ckpt_plan[0][0] == s.n_cached + s.i_pending:
                        self._take_checkpoint(s, s.ckpt_plan.popleft()[1])
                    if s.i_pending < len(s.pending):
                        continue
                    s.t_prompt_done = t1
                    s.phase = "decode"
                    if s.task.params.n_predict == 0:
                        self._finish(s, "limit")
                        continue
                self._sample(s, logits[i])
            except Exception as e:  # noqa: BLE001 - one bad request must not stop the others
                log.exception("post-processing failed on slot %d", s.id)
                self._fail(s, e, reset_state=False)
        self._refresh_cache_numbers()

    def _forward(self, batch: list, owners: list, active: list[Slot]):
        """model.forward with KV-pressure handling: on a full pool free cached states, then
        let prefilling slots wait (dropped from this step), then fail the youngest request
        with ContextFullError. Shrinks `batch`/`owners` in place; None: nothing ran."""
        while batch:
            try:
                logits = self.model.forward(batch)
                return logits
            except ContextFullError as e:
                if self._make_room(batch, active):
                    continue
                pre = [i for i, (s, _) in enumerate(owners) if s.phase == "prefill"]
                if pre and len(owners) > 1:
                    # the youngest prefilling request gives its memory back and waits again
                    i = max(pre, key=lambda i: owners[i][0].task.t_submit)
                    s, _ = owners[i]
                    del batch[i]
                    del owners[i]
                    self._preempt(s)
                    continue
                # one request (or only decodes) that cannot fit: fail the youngest
                victim_i = max(range(len(owners)), key=lambda i: owners[i][0].task.t_submit)
                s, _ = owners[victim_i]
                self.c["kv_full_failures"] += 1
                err = ContextFullError(
                    f"not enough KV memory for this request ({s.n_tokens} tokens held, "
                    f"{len(batch[victim_i][1])} more needed; KV pool limit "
                    f"{self._cache_numbers.get('kv_limit_bytes', 0) // 2**20} MiB, n_ctx {self.n_ctx}): {e}")
                log.warning("slot %d: %s", s.id, err)
                del batch[victim_i]
                del owners[victim_i]
                self._fail(s, err, reset_state=True)
            except Exception as e:  # noqa: BLE001 - fail these requests, keep serving
                log.exception("forward failed for %d segment(s)", len(batch))
                for s, _ in owners:
                    self._fail(s, e, reset_state=True)
                return None
        return None

    def _preempt(self, s: Slot) -> None:
        """Put a prefilling request back at the head of the queue, releasing its state (it
        has emitted nothing yet); it restarts when memory allows."""
        task = s.task
        self.c["kv_full_waits"] += 1
        log.info("KV pool full: slot %d's request (task %d) waits for memory", s.id, task.id)
        self._clear_state(s)
        self._release_slot(s)
        task.slot_id = None
        self._waiting.appendleft(task)

    def _admissible(self, task: Task) -> bool:
        """Whether the task's prompt can get KV blocks now (free, or held by the RAM cache
        or idle slots); always true when no other request runs (then it fits or fails)."""
        active = [s for s in self.slots if s.task is not None]
        pools = dict(getattr(self.model, "pools", {}) or {})
        if not active or not pools:
            return True
        for pool in pools.values():
            held = 0
            window = 0
            for s in active:
                for c in getattr(s.state, "caches", {}).values():
                    if getattr(c, "pool", None) is pool:
                        held += int(getattr(c, "n_blocks", 0))
                        window = max(window, int(getattr(c, "window", 0) or 0))
            n = len(task.prompt) + 1
            if window:
                n = min(n, window + self.cfg.n_ubatch + pool.block_size)
            if pool.blocks_for(n) > pool.n_free + pool.n_used - held:
                return False
        return True

    def _set_threads(self, prefill: bool, n_tokens: int) -> int:
        """-tb for steps that carry prompt tokens; for decode-only steps up to -t threads,
        as many as measure fastest now (threads.AdaptiveThreads). Returns the count set."""
        from ..threads import AdaptiveThreads, resolve, set_num_threads

        if prefill:
            n = resolve(self.cfg.n_threads_batch or self.cfg.n_threads)
        else:
            if self._adaptive is None:
                self._adaptive = AdaptiveThreads(resolve(self.cfg.n_threads))
            n = self._adaptive.choose(n_tokens)
        if n != self._threads_now:
            set_num_threads(n)
            self._threads_now = n
        return n

    def _sample(self, s: Slot, row: np.ndarray) -> None:
        task = s.task
        p = task.params
        sample = s.sampler.sample(row, s.history)
        tok = sample.token
        s.generated.append(tok)
        s.history.append(tok)
        if tok in self.eog_ids and not p.ignore_eos:
            self._finish(s, "eos")
            return
        piece = s.decoder.feed(tok)
        s.text += piece
        if p.stop:
            # search only where a new match can be: from max_stop-1 characters before new text
            longest = max(len(x) for x in p.stop)
            start = max(0, len(s.text) - len(piece) - longest + 1)
            hit_pos, hit = None, ""
            for word in p.stop:
                if not word:
                    continue
                j = s.text.find(word, start)
                if j >= 0 and (hit_pos is None or j < hit_pos):
                    hit_pos, hit = j, word
            if hit_pos is not None:
                self._emit(s, [tok], s.text[s.n_sent:hit_pos], [sample])
                s.text = s.text[:hit_pos]
                s.n_sent = len(s.text)
                self._finish(s, "word", hit)
                return
            hold = stop_holdback(s.text, p.stop)
        else:
            hold = 0
        upto = len(s.text) - hold
        self._emit(s, [tok], s.text[s.n_sent:upto], [sample])
        s.n_sent = max(s.n_sent, upto)
        n_gen = len(s.generated)
        if (p.n_predict > 0 and n_gen >= p.n_predict) or \
                s.n_prompt + n_gen >= s.n_ctx:
            self._finish(s, "limit")
            return
        s.last_token = tok

    def _emit(self, s: Slot, tokens, text: str, samples) -> None:
        want_probs = s.task.params.sampling.n_probs > 0
        s.task._put(TokenEvent(list(tokens), text, list(samples) if want_probs else []))

    def _finish(self, s: Slot, stop_type: str, word: str = "") -> None:
        task = s.task
        now = time.perf_counter()
        if stop_type != "cancel" and stop_type != "word":
            # flush text held back for stop strings and incomplete UTF-8
            rest = s.text[s.n_sent:] + (s.decoder.flush() if s.decoder else "")
            if rest:
                s.task._put(TokenEvent([], rest, []))
        t_prompt_done = s.t_prompt_done or now
        tm = Timings(
            cache_n=s.n_cached,
            prompt_n=min(s.i_pending, len(s.pending)),
            prompt_ms=1e3 * (t_prompt_done - s.t_start),
            predicted_n=len(s.generated),
            predicted_ms=1e3 * (now - t_prompt_done) if s.t_prompt_done else 0.0,
            cache_source=s.cache_source if s.n_cached else "none",
            checkpoint_restores=s.n_ckpt_restored,
        )
        c = self.c
        c["requests_total"] += 1
        c["prompt_tokens_total"] += tm.prompt_n
        c["prompt_seconds_total"] += tm.prompt_ms / 1e3
        c["tokens_predicted_total"] += tm.predicted_n
        c["tokens_predicted_seconds_total"] += tm.predicted_ms / 1e3
        c["cache_tokens_total"] += tm.cache_n
        final = None
        if stop_type == "cancel":
            c["requests_cancelled"] += 1
            task.done = True
        else:
            final = FinalEvent(stop_type, word, s.n_prompt, len(s.generated), tm, s.id, truncated=False)
        td = tm.to_dict()
        log.info("slot %d task %d %s: prompt %d tok (%d cached from %s) %.1f tok/s, generated %d "
                 "tok %.1f tok/s", s.id, task.id, stop_type, s.n_prompt, s.n_cached,
                 tm.cache_source, td["prompt_per_second"], len(s.generated),
                 td["predicted_per_second"])
        # the slot is idle before the client hears "done": /slots and /metrics read right
        # after a response must not show it still processing
        self._release_slot(s)
        if final is not None:
            task._put(final)

    def _fail(self, s: Slot, err: BaseException, reset_state: bool) -> None:
        task = s.task
        self.c["requests_errors"] += 1
        if task is not None:
            task._put(ErrorEvent(err))
        if reset_state and s.state is not None:
            # its content may be half-updated: start the next request from scratch
            try:
                _release_state(s.state)
            except Exception:  # noqa: BLE001
                log.exception("releasing slot %d state failed", s.id)
            s.state = None
            self.c["checkpoints_erased"] += s.checkpoints.clear()
        self._release_slot(s)

    def _release_slot(self, s: Slot) -> None:
        s.ckpt_plan.clear()
        s.published = False
        s.task = None
        s.phase = "idle"
        s.t_last_used = time.time()
        s.sampler = None
        s.decoder = None

    # ---- synchronous helper ----------------------------------------------------------
    def generate_sync(self, prompt, params: GenParams | None = None) -> Completion:
        return self.submit(prompt, params, sync=True).collect_sync()


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host RAM; (0, 0) when unknown."""
    try:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                info[k] = int(v.split()[0]) * 1024
        return info.get("MemAvailable", info.get("MemFree", 0)), info.get("MemTotal", 0)
    except (OSError, ValueError):
        import os

        try:
            page = os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        except (ValueError, OSError, AttributeError):
            return 0, 0


def load_engine(path: str | Path, cfg: EngineConfig | None = None, wait: bool = True) -> Engine:
    """Engine for the GGUF at `path`, started; waits for the load unless wait=False."""
    eng = Engine.from_path(path, cfg)
    eng.start()
    if wait and not eng.wait_ready():
        eng.stop()
        raise LLMCoreError(f"cannot load {path}: {eng.load_error}")
    return eng


__all__ = [
    "Engine", "EngineConfig", "EngineStatus", "GenParams", "Task", "TokenEvent", "FinalEvent", "ErrorEvent",
    "Timings", "Completion", "common_prefix", "load_engine",
]
