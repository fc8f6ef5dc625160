"""The engine thread: it owns the model, the slots and the caches, takes requests from its
inbox and runs one batched step after another.

A step: admit waiting requests (``scheduler.admit`` with the prefix policy choosing slots
and cached states, memory admitting), plan the step (``scheduler.plan``), run ONE
``model.forward`` over it (KV pressure handled by ``memory``), then advance every slot:
prefill progress and checkpoints, or sample a token and stream its text (``output``).
Sampled tokens go back to their callers through each request's ``Task``.

The model is loaded on this thread when the engine is built with a ``loader``, so the
server answers /health (503 "Loading model") meanwhile. Nothing a request does can stop
the thread: a failing step fails its requests and the engine keeps serving.
"""
from __future__ import annotations

import asyncio
import collections
import enum
import logging
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .. import metrics
from ..cache.checkpoints import CheckpointBudget, plan_positions
from ..cache.disk import MAX_PENDING_BYTES, DiskCache
from ..cache.disk_io import IOWorker
from ..cache.prompt_cache import PromptCache
from ..cache.state_file import Fingerprint, model_fingerprint
from ..errors import (ContextFullError, EngineFailure, LLMCoreError, ModelLoadFailedError,
                      ModelLoadingError, RequestError, ShuttingDownError)
from ..sampling import Sample, Sampler
from . import memory
from .config import EngineConfig, GenParams, check_params, check_prompt
from .disk_tier import DiskTier
from .events import CacheSource, Completion, ErrorEvent, FinalEvent, StopReason, Timings, TokenEvent
from .output import StreamOutput
from .prefix import PrefixPolicy
from .protocols import LanguageModel, TextTokenizer
from .scheduler import Scheduler, StepPlan
from .speculative import NgramDrafter
from .slot import Generation, Phase, Pooling, Slot
from .slot_files import SlotCommand, SlotFiles
from .stats import EngineCounters
from .task import EventOutbox, Task

log = logging.getLogger("llmcore.engine")

NUMBERS_EVERY_S = 0.1  # decode steps refresh stats()'s cache numbers at most this often
TRIM_EVERY_S = 2.0  # going idle gives the heap's free pages back at most this often


class GrammarStuckError(EngineFailure):
    """A constrained generation cannot go on (no token fits its grammar)."""


class EngineStatus(str, enum.Enum):
    """What the engine can do now; the values are the strings /health and /props show."""

    LOADING = "loading"
    READY = "ok"
    FAILED = "error"

    def __str__(self) -> str:
        return self.value


Loader = Callable[[], tuple]  # () -> (model, tokenizer, chat_template, info): llmcore.loader.LoadedModel


class Engine:
    """Owns model, tokenizer and slots on one thread. Construct with a loaded model and
    tokenizer, or with `loader` (called on the engine thread) so that the server can
    answer /health while the model loads."""

    def __init__(self, cfg: EngineConfig | None = None, model: LanguageModel | None = None,
                 tokenizer: TextTokenizer | None = None, chat_template=None,
                 loader: Loader | None = None, info: dict | None = None):
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
        self.c = EngineCounters()
        self.pcache: PromptCache | None = None
        self.prefix: PrefixPolicy | None = None
        self.io: IOWorker | None = None  # the disk I/O thread (disk tier, slot files)
        self.disk: DiskCache | None = None  # the prompt cache's disk tier
        self.disk_tier: DiskTier | None = None
        self.slot_files: SlotFiles | None = None
        self._commands: collections.deque[SlotCommand] = collections.deque()
        # a step's events, one event-loop wake-up for all (at most one per stream_interval_ms)
        self._outbox = EventOutbox(hold_s=max(0.0, self.cfg.stream_interval_ms) / 1e3)
        self._fp: Fingerprint | None = None
        self._fp_lock = threading.Lock()
        self.ck_budget = CheckpointBudget(None)
        self.scheduler = Scheduler(self.cfg.n_batch, self.cfg.n_ubatch)
        self.plan = memory.MemoryPlan()  # what the engine may take (set up with the model)
        self._needs_ckpt = False
        self._probe = None  # an empty state: what one sequence of this model holds
        self._cv = threading.Condition()
        self._inbox: collections.deque[Task] = collections.deque()
        self._waiting: collections.deque[Task] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._closed = False  # close_intake(): new requests are refused (a shutdown drains)
        self._ready = threading.Event()
        self._threads_now = 0
        self._heap_dirty = False  # steps ran since the last trim_heap
        self._t_numbers = 0.0  # when _refresh_cache_numbers last ran (time.monotonic)
        self._t_trim = 0.0
        self._adaptive = None  # threads.AdaptiveThreads for decode steps, made on first use
        self._cache_numbers: dict = {}
        self._masks = None  # constrain.MaskBatch, made when the first constrained request runs
        self._fault_hook: Callable[[str], None] | None = None
        self.t_start = time.time()
        if model is not None:
            self._setup()

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def from_path(cls, path: str | Path, cfg: EngineConfig | None = None) -> "Engine":
        """Engine that loads the GGUF at `path` on its own thread (see `start`)."""
        from ..loader import load_gguf

        cfg = cfg or EngineConfig()
        path = Path(path)
        return cls(cfg, loader=lambda: load_gguf(path, **cfg.template_options(), **cfg.model_options()),
                   info={"path": str(path), "name": path.stem})

    def _setup(self) -> None:
        m, cfg = self.model, self.cfg
        n_train = m.n_ctx_train
        self.n_ctx = cfg.n_ctx if cfg.n_ctx > 0 else (n_train or 4096)
        npar = max(1, cfg.n_parallel)
        self.n_ctx_slot = self.n_ctx if cfg.kv_unified else max(1, self.n_ctx // npar)
        self.slots = [Slot(i, self.n_ctx_slot, cfg.ctx_checkpoints) for i in range(npar)]
        self._probe = m.new_state()
        self._needs_ckpt = self._probe.needs_checkpoints
        host = memory.host_memory()
        budget = memory.cache_budget_bytes(cfg.cache_ram_mib, host[0])
        self.pcache = None
        if cfg.cache_ram_mib != 0:
            self.pcache = PromptCache(budget, on_release=lambda e: self.prefix.release_entry(e))
        n_ck = cfg.ctx_checkpoints
        self.plan = memory.plan_memory(
            m.pools, self._probe, n_ctx=self.n_ctx, n_slots=npar, cache_budget=budget,
            cache_on=self.pcache is not None, n_checkpoints=n_ck, host=host,
            checkpoint_budget_mib=cfg.checkpoint_budget_mib)
        self.ck_budget = CheckpointBudget(self.plan.checkpoints_max_bytes if self._needs_ckpt else None)
        self.prefix = PrefixPolicy(m.new_state, self.pcache, self.c, max_checkpoints=cfg.ctx_checkpoints,
                                   slot_prompt_similarity=cfg.slot_prompt_similarity,
                                   needs_checkpoints=self._needs_ckpt, checkpoint_budget=self.ck_budget)
        self.prefix.fault_hook = self._fault_hook
        self._setup_disk(budget)
        memory.log_plan(self.plan, n_ctx=self.n_ctx, n_slots=npar,
                        cache_on=self.pcache is not None, needs_checkpoints=self._needs_ckpt,
                        n_checkpoints=n_ck)
        self.eog_ids = frozenset(int(t) for t in self.tokenizer.eog_ids)
        self.info.setdefault("n_vocab", m.n_vocab)
        self.info.setdefault("n_ctx_train", n_train)
        self._refresh_cache_numbers()
        self.status = EngineStatus.READY
        self._ready.set()

    def _setup_disk(self, ram_budget: int | None) -> None:
        """The I/O thread, the disk tier (``cache_dir``) and the slot files."""
        cfg = self.cfg
        if cfg.cache_dir or cfg.slot_save_path:
            self.io = IOWorker(wake=self._wake)
        if cfg.cache_dir:
            if self.pcache is None:
                log.warning("--cache-dir needs the RAM prompt cache (--cache-ram 0 turns it off): "
                            "no disk tier")
            else:
                limit = None if cfg.cache_disk_mib < 0 else cfg.cache_disk_mib << 20
                # copies queued for the writer are RAM the cache budget no longer counts: at
                # most as much as the budget itself (8 MiB at least) waits; past that an
                # evicted entry is not written (a cache: it is only lost)
                pending = MAX_PENDING_BYTES if ram_budget is None else min(MAX_PENDING_BYTES, max(8 << 20, ram_budget))
                self.disk = DiskCache(cfg.cache_dir, limit, self.io, fingerprint=self.fingerprint,
                                      max_pending_bytes=pending)
                kv_limit = memory.kv_limit_bytes(self.model.pools.values())
                self.disk_tier = DiskTier(self.disk, self.prefix, self.c, cfg.cache_disk_wait_s,
                                          held_limit_bytes=kv_limit // 4 if kv_limit else None)
                self.pcache.on_evict = self.disk_tier.on_evict
                self.disk.start()
        self.slot_files = SlotFiles(cfg.slot_save_path, self.io, self.prefix, self.fingerprint,
                                    self.n_ctx_slot, requeue=self._queue_command)

    def fingerprint(self) -> Fingerprint:
        """The model's state-file fingerprint (computed once; reads the model file, so it
        runs on the I/O thread)."""
        with self._fp_lock:
            if self._fp is None:
                self._fp = model_fingerprint(self.model, self._probe)
            return self._fp

    # ---- test hook -------------------------------------------------------------------
    @property
    def fault_hook(self) -> Callable[[str], None] | None:
        """Called with "save" | "restore" | "checkpoint" before each such cache operation
        (tests inject failures with it)."""
        return self._fault_hook

    @fault_hook.setter
    def fault_hook(self, fn: Callable[[str], None] | None) -> None:
        self._fault_hook = fn
        if self.prefix is not None:
            self.prefix.fault_hook = fn

    # ---- facts -----------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The model's id on every route: the alias (-a), else the file name (never a path)."""
        if self.cfg.model_alias:
            return self.cfg.model_alias
        path = self.info.get("path")
        return Path(path).name if path else (self.info.get("name") or "model")

    @property
    def default_n_predict(self) -> int:
        """What a request that sets no limit may generate: -n, else a slot's share of the
        context (n_ctx / slots), so one client that sends no max_tokens cannot take it all."""
        if self.cfg.n_predict > 0:
            return self.cfg.n_predict
        return max(1, self.n_ctx // max(1, len(self.slots) or self.cfg.n_parallel))

    @property
    def memory_plan(self) -> dict:
        """The memory plan as plain numbers (/props "memory")."""
        return self.plan.as_dict()

    @property
    def ready(self) -> bool:
        return self.status is EngineStatus.READY

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

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="llmcore-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop cleanly: running and queued requests end with ShuttingDownError, then the
        disk tier is written (up to ``cache_disk_flush_s`` more) and the I/O thread ends."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            extra = self.cfg.cache_disk_flush_s if self.cfg.cache_dir else 0.0
            self._thread.join(timeout + extra)
            self._thread = None
        if self._masks is not None:
            self._masks.close()
            self._masks = None

    shutdown = stop

    def close_intake(self) -> None:
        """Refuse new requests from now on (ShuttingDownError); the ones submitted run on."""
        self._closed = True

    @property
    def n_active(self) -> int:
        """Requests running or waiting (any thread; a snapshot)."""
        return sum(1 for s in list(self.slots) if s.busy) + len(self._waiting) + len(self._inbox)

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.ready

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # ---- submission (any thread) -----------------------------------------------------
    def check_prompt(self, prompt: list[int]) -> None:
        self.require_ready()
        check_prompt(prompt, self.n_ctx_slot, self.model.n_vocab)

    def submit(self, prompt, params: GenParams | None = None,
               loop: asyncio.AbstractEventLoop | None = None, sync: bool = False) -> Task:
        """Queue a request. Validates first (raises RequestError/ContextFullError before any
        work). From a coroutine the task delivers to the running loop; `sync=True` (or no
        running loop) gives a task to iterate from a plain thread."""
        if self._closed:
            raise ShuttingDownError()
        prompt = [int(t) for t in prompt]
        params = params or GenParams()
        self.check_prompt(prompt)
        if params.id_slot is not None and params.id_slot >= len(self.slots):
            raise RequestError(f"id_slot {params.id_slot} out of range (0..{len(self.slots) - 1})")
        check_params(params)
        if loop is None and not sync:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        task = Task(prompt, params, loop, self._wake, self._outbox)
        with self._cv:
            self._inbox.append(task)
            self._cv.notify_all()
        return task

    def generate_sync(self, prompt, params: GenParams | None = None) -> Completion:
        return self.submit(prompt, params, sync=True).collect_sync()

    # ---- slot files (any thread) -----------------------------------------------------
    def slot_action(self, action: str, slot_id: int, filename: str | None = None):
        """Queue a slot save / restore / erase (llmcore.engine.slot_files); returns a
        concurrent.futures.Future of llama-server's result object. Raises at once what can
        never run (RequestError, NotSupportedError, SlotFileError)."""
        self.require_ready()
        cmd = SlotCommand(action, int(slot_id), filename)
        self.slot_files.check(cmd, len(self.slots))
        self._queue_command(cmd)
        return cmd.future

    def save_slot(self, slot_id: int, filename: str):
        return self.slot_action("save", slot_id, filename)

    def restore_slot(self, slot_id: int, filename: str):
        return self.slot_action("restore", slot_id, filename)

    def erase_slot(self, slot_id: int):
        return self.slot_action("erase", slot_id)

    def sync_disk(self, timeout: float | None = 30.0) -> bool:
        """Wait until every disk job queued so far has finished and its outcome is in
        ``stats()`` (any thread; tests and benchmarks). True at once without disk I/O."""
        if self.io is None:
            return True
        ev = threading.Event()

        def done(_out, _err) -> None:
            self._refresh_cache_numbers()
            ev.set()

        self.io.submit(lambda: None, done)
        self._wake()
        return ev.wait(timeout)

    def _queue_command(self, cmd: SlotCommand) -> None:
        with self._cv:
            self._commands.append(cmd)
            self._cv.notify_all()

    # ---- stats (any thread) ----------------------------------------------------------
    def stats(self) -> metrics.EngineStats:
        slots = tuple(s.stats() for s in list(self.slots))
        busy = sum(1 for s in slots if s.state != "idle")
        waiting = len(self._waiting) + len(self._inbox)
        return metrics.EngineStats(
            status=str(self.status), model=self.model_name, n_ctx=self.n_ctx,
            n_ctx_slot=self.n_ctx_slot, n_slots=len(slots),
            requests_processing=busy, requests_deferred=waiting,
            uptime_s=time.time() - self.t_start, slots=slots,
            model_stats=self._model_stats(), **self._cache_numbers, **self.c.as_dict(),
        )

    def _model_stats(self) -> dict:
        if self.model is None:
            return {}
        try:
            return dict(self.model.stats())
        except Exception:  # noqa: BLE001 - stats must never break /metrics
            log.exception("model stats failed")
            return {}

    def _refresh_cache_numbers(self) -> None:
        """Engine thread: numbers of the cache layers for stats() (read from any thread)."""
        self._t_numbers = time.monotonic()
        pc = self.pcache
        pools = self.model.pools.values()
        self._cache_numbers = dict(
            cache_ram_bytes=pc.nbytes if pc else 0,
            cache_ram_limit_bytes=(-1 if pc.limit_bytes is None else pc.limit_bytes) if pc else 0,
            cache_ram_entries=pc.n_entries if pc else 0,
            cache_ram_tokens=pc.n_tokens if pc else 0,
            cache_ram_evictions=pc.stats["evictions"] if pc else 0,
            cache_ram_inserts=pc.stats["inserts"] if pc else 0,
            checkpoints_count=sum(len(s.checkpoints) for s in self.slots),
            checkpoints_bytes=sum(s.checkpoints.nbytes for s in self.slots),
            checkpoints_live=self.ck_budget.count, checkpoints_live_bytes=self.ck_budget.used,
            checkpoints_budget_bytes=-1 if self.ck_budget.limit_bytes is None else self.ck_budget.limit_bytes,
            kv_used_bytes=sum(p.used_bytes for p in pools),
            kv_allocated_bytes=sum(p.nbytes for p in pools),
            kv_limit_bytes=memory.kv_limit_bytes(pools),
            **(self.disk.numbers() if self.disk is not None else {}),
        )

    # ---- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        if self.model is None and self._loader is not None and not self._load():
            return
        while True:
            if self.io is not None and self.io.poll():  # finished disk jobs: index, states read back
                self._refresh_cache_numbers()
            with self._cv:
                if self._stop:
                    break
                while self._inbox:
                    self._waiting.append(self._inbox.popleft())
                idle = not self._waiting and not self._commands and not any(s.busy for s in self.slots)
                too_soon = TRIM_EVERY_S - (time.monotonic() - self._t_trim)
                if idle and (not self._heap_dirty or too_soon > 0):
                    self._outbox.flush()
                    self._cv.wait(0.5 if not self._heap_dirty else too_soon)
                    continue
            if idle:  # went idle: what the steps freed goes back to the OS (at most every few s)
                self._heap_dirty = False
                self._t_trim = time.monotonic()
                memory.trim_heap()
                continue
            try:
                self._admit()  # requests queued before a command start first (their slot is then busy)
                self._run_commands()
                self._draft()
                plan = self.scheduler.plan(self.slots)
                if plan.items:
                    self._heap_dirty = True
                    self._step(plan)
                else:  # requests wait for the disk or commands for a file: sleep until woken
                    self._outbox.flush()
                    with self._cv:
                        if not self._inbox and not self._stop:
                            self._cv.wait(0.05)
            except Exception as e:  # noqa: BLE001 - never let the engine thread die
                log.exception("engine step failed")
                for s in self.slots:
                    if s.busy:
                        self._fail(s, e, drop_state=True)
        self._outbox.flush()
        err = ShuttingDownError()
        for s in self.slots:
            if s.busy:
                self._fail(s, err, drop_state=False)
        for t in list(self._waiting) + list(self._inbox):
            t.put(ErrorEvent(err))
        self._waiting.clear()
        self._inbox.clear()
        self._close_disk(err)

    def _close_disk(self, err: BaseException) -> None:
        """At the end of the engine thread: write the disk tier, finish the file jobs."""
        try:
            if self.disk_tier is not None:
                self.disk_tier.save_all(self.slots, self.cfg.cache_disk_flush_s)
        except Exception:  # noqa: BLE001 - a stop must complete
            log.exception("writing the disk cache at stop failed")
        if self.io is not None:
            self.io.drain(self.cfg.cache_disk_flush_s)
            self.io.close()
        with self._cv:
            cmds, self._commands = list(self._commands), collections.deque()
        for cmd in cmds:
            if not cmd.future.done():
                cmd.future.set_exception(err)
        if self.model is not None:
            self._refresh_cache_numbers()

    def _run_commands(self) -> None:
        """Slot commands whose slot is idle (the others wait for it)."""
        if not self._commands:
            return
        with self._cv:
            ready = [c for c in self._commands if not self.slots[c.slot_id].busy]
            for c in ready:
                self._commands.remove(c)
        for c in ready:
            self.slot_files.run(c, self.slots[c.slot_id])
        if ready:
            self._refresh_cache_numbers()

    def _load(self) -> bool:
        try:
            model, tok, tmpl, info = self._loader()
            self.model, self.tokenizer, self.chat_template = model, tok, tmpl
            self.info.update({k: v for k, v in info.items() if v is not None})
            self._setup()
            log.info("model loaded: %s (n_ctx %d, %d slots)", self.model_name, self.n_ctx,
                     len(self.slots))
            return True
        except Exception as e:  # noqa: BLE001 - report, don't die silently
            if isinstance(e, LLMCoreError):  # the user's file: one line, no traceback
                log.error("model load failed: %s", e)
            else:
                log.exception("model load failed")
            self.status = EngineStatus.FAILED
            self.load_error = str(e)
            self._ready.set()
            return False

    # ---- admission -------------------------------------------------------------------
    def _admit(self) -> None:
        for s in self.slots:
            if s.busy and s.task.cancelled:
                self._finish(s, StopReason.CANCEL)
        if any(t.cancelled for t in self._waiting):
            for t in [t for t in self._waiting if t.cancelled]:
                t.done = True
                self.c.requests_cancelled += 1
            self._waiting = collections.deque(t for t in self._waiting if not t.cancelled)
        if not self._waiting:
            return
        self._waiting = self.scheduler.admit(self._waiting, pick=self._pick, fits=self._fits,
                                             start=self._start_safely)

    def _pick(self, task: Task) -> Slot | None:
        if self.disk_tier is not None and self.disk_tier.must_wait(task, self.slots):
            return None  # its state is being read from disk
        return self.prefix.pick_slot(self.slots, task.prompt, task.params.id_slot, task.params.cache_prompt)

    def _fits(self, task: Task) -> bool:
        active = [s.state for s in self.slots if s.busy]
        return memory.admissible(len(task.prompt), active, self._probe, self.model.pools,
                                 self.cfg.n_ubatch)

    def _start_safely(self, task: Task, slot: Slot) -> None:
        try:
            self._start(task, slot)
        except Exception as e:  # noqa: BLE001 - this request fails, the others go on
            log.exception("starting a task failed")
            if slot.gen is not None:
                self._fail(slot, e, drop_state=True)
                return
            self.c.requests_errors += 1
            task.put(ErrorEvent(e))
            self.prefix.drop(slot)
            slot.t_last_used = time.time()

    def _new_generation(self, task: Task, state, n_keep: int) -> Generation:
        p = task.params
        dec = self.tokenizer.stream_decoder()
        if p.constraint is not None:
            p.constraint.reset()  # a request that waited for memory starts over
        if p.reasoning_budget is not None:
            p.reasoning_budget.reset()
        return Generation(
            task=task, pending=np.asarray(task.prompt[n_keep:], dtype=np.int32),
            n_prompt=len(task.prompt), n_cached=n_keep,
            sampler=Sampler(p.sampling, self.model.n_vocab), output=StreamOutput(dec, p.stop),
            history=list(task.prompt), constraint=p.constraint,
            pooled=Pooling(p.embedding) if p.embedding else None)

    def _start(self, task: Task, slot: Slot) -> None:
        t0 = time.perf_counter()
        task.slot_id = slot.id
        slot.published = False
        n_keep, source, n_ck = self.prefix.prepare(slot, task.prompt, task.params.cache_prompt)
        g = self._new_generation(task, slot.state, n_keep)
        g.t_start = t0
        g.cache_source, g.n_ckpt_restored = source, n_ck
        cfg = self.cfg
        if self._needs_ckpt and cfg.checkpoints_on:
            g.ckpt_plan = collections.deque(plan_positions(
                n_keep, len(task.prompt), cfg.checkpoint_every_n_tokens, task.params.checkpoint_at,
                cfg.n_ubatch))
        g.drafter = self._drafter_for(task.params, g)
        slot.gen = g
        if cfg.cache_idle_slots:
            self.prefix.publish_idle(self.slots)
        self._refresh_cache_numbers()

    # ---- speculative decoding (engine/speculative.py) -------------------------------------
    def _drafter_for(self, p: GenParams, g: Generation) -> NgramDrafter | None:
        """A prompt-lookup drafter when the request (or the server) asks for one and its
        state can be cut back after a rejected draft: not for recurrent state (it cannot be
        trimmed), constrained output (masks are per position) or embeddings."""
        sp = self.cfg.speculative if p.speculative is None else p.speculative
        if not sp or g.constraint is not None or g.pooled is not None or self._probe.fixed_state_nbytes:
            return None
        return NgramDrafter(sp)

    def _draft(self) -> None:
        """Drafts for this step's generating slots (never past the request's limits)."""
        for s in self.slots:
            g = s.gen
            if g is None or g.drafter is None or g.phase is not Phase.DECODE:
                continue
            p = g.task.params
            room = s.n_ctx - g.n_prompt - len(g.generated) - 1
            if p.n_predict > 0:
                room = min(room, p.n_predict - len(g.generated) - 1)
            g.draft = g.drafter.draft(g.history, max(0, room)) if room > 0 else []

    def _verify(self, s: Slot, rows: np.ndarray, n_draft: int, n_before: int, mask,
                argmax: np.ndarray | None = None) -> None:
        """Sample each verified position in turn, as plain decoding would; keep the drafts up
        to the first that differs from the token sampled there, then cut the state back to
        the kept ones (the last sampled token is evaluated next step, as always)."""
        g = s.gen
        draft, g.draft = g.draft, []
        accepted = 0
        g.n_drafted += n_draft  # counted first: the request may end inside the loop
        self.c.spec_draft_tokens += n_draft
        for i in range(n_draft + 1):
            self._sample(s, rows[i], mask if i == 0 else None, int(argmax[i]) if argmax is not None else None)
            if s.gen is not g or i == n_draft or g.generated[-1] != draft[i]:
                break
            accepted += 1
            g.n_draft_accepted += 1
            self.c.spec_accepted_tokens += 1
        g.drafter.record(accepted, n_draft)
        keep = n_before + 1 + accepted  # the last sampled token, then the kept drafts
        st = s.state
        if st is not None and st.n_tokens > keep and st.trim(keep) != keep:
            raise EngineFailure(f"slot {s.id}: cannot cut the state back after a rejected draft")

    # ---- one step --------------------------------------------------------------------
    def _step(self, plan: StepPlan) -> None:
        if not plan.decode_only:  # a prompt chunk can take long: held tokens go out first
            self._outbox.flush()
        n_threads = self._set_threads(prefill=not plan.decode_only, n_tokens=len(plan))
        masks = self._start_masks(plan)  # computed on a helper thread while the model runs
        try:
            with self._outbox:
                self._run_step(plan, n_threads, masks)
        finally:
            for pending, _ in (masks or {}).values():
                pending.settle()  # no matcher is still in use when the next step starts

    def _run_step(self, plan: StepPlan, n_threads: int, masks: dict | None) -> None:
        # embedding requests want every token's hidden state, the others logits: the
        # embeddings of the step go through a second forward, batched together
        emb = StepPlan([it for it in plan.items if it.slot.gen.pooled is not None])
        if emb.items:
            plan = StepPlan([it for it in plan.items if it.slot.gen.pooled is None])
        t0 = time.perf_counter()
        greedy = any(it.slot.gen is not None and it.slot.gen.sampler.takes_argmax for it in plan.items)
        n_busy = sum(s.busy for s in self.slots)
        logits = self._forward(plan, greedy=greedy) if plan.items else None
        hidden = self._forward(emb, output="hidden") if emb.items else None
        if logits is None and hidden is None:
            return
        if plan.items and plan.decode_only and not emb.items and self._adaptive is not None:
            self._adaptive.record(len(plan), n_threads, time.perf_counter() - t0)
        self.c.n_decode_total += 1
        self.c.n_busy_slots_total += len(plan) + len(emb)
        t1 = time.perf_counter()
        if hidden is not None:
            self._pool_embeddings(emb, hidden, t1)
        if logits is None:
            self._refresh_cache_numbers()
            return
        row = 0
        for i, it in enumerate(plan.items):
            s, g = it.slot, it.slot.gen
            r0, row = row, row + (it.n_logits if plan.n_logits is not None else 1)
            if g is None:
                continue
            try:
                self.c.n_tokens_max = max(self.c.n_tokens_max, s.n_tokens)
                am = plan.argmax[r0:row] if plan.argmax is not None else None
                if it.n_draft:
                    self._verify(s, logits[r0:row], it.n_draft, s.n_tokens - it.n,
                                 masks.get(s.id) if masks else None, am)
                    continue
                if g.phase is Phase.PREFILL:
                    g.i_pending += it.n
                    if g.ckpt_plan and g.ckpt_plan[0][0] == g.position:
                        self.prefix.take_checkpoint(s, g.ckpt_plan.popleft()[1], self.slots)
                    if g.prefill_left > 0:
                        continue
                    g.t_prompt_done = t1
                    g.phase = Phase.DECODE
                    if g.task.params.n_predict == 0:
                        self._finish(s, StopReason.LIMIT)
                        continue
                self._sample(s, logits[r0], masks.get(s.id) if masks else None,
                             int(am[0]) if am is not None else None)
            except Exception as e:  # noqa: BLE001 - one bad request must not stop the others
                log.exception("post-processing failed on slot %d", s.id)
                self._fail(s, e, drop_state=False)
        # decode steps move only the KV bytes: their numbers go out at most every
        # NUMBERS_EVERY_S (summing the caches' entries each step was ~2% of a one-stream step);
        # a prompt chunk, a request's end or a failure refresh them at once
        if (not plan.decode_only or sum(s.busy for s in self.slots) != n_busy
                or time.monotonic() - self._t_numbers >= NUMBERS_EVERY_S):
            self._refresh_cache_numbers()

    def _pool_embeddings(self, emb: StepPlan, hidden: np.ndarray, t1: float) -> None:
        """Pool each embedding request's rows of the step; a request whose prompt is all
        in ends with its vector."""
        off = 0
        for it in emb.items:
            s, g = it.slot, it.slot.gen
            rows, off = hidden[off:off + it.n], off + it.n
            if g is None:
                continue
            try:
                g.pooled.add(rows)
                g.i_pending += it.n
                if g.ckpt_plan and g.ckpt_plan[0][0] == g.position:
                    self.prefix.take_checkpoint(s, g.ckpt_plan.popleft()[1], self.slots)
                if g.prefill_left == 0:
                    g.t_prompt_done = t1
                    self._finish(s, StopReason.EOS, embedding=g.pooled.vector())
            except Exception as e:  # noqa: BLE001 - one bad request must not stop the others
                log.exception("pooling failed on slot %d", s.id)
                self._fail(s, e, drop_state=False)

    def _start_masks(self, plan: StepPlan) -> dict | None:
        """Start the token masks of the constrained slots that sample after this step
        (slot id -> (PendingMasks, row)); None when there are none."""
        sampling = [it.slot for it in plan.items
                    if it.slot.gen is not None and it.slot.gen.constraint is not None
                    and (it.decode or it.slot.gen.prefill_left == it.n)]
        if not sampling:
            return None
        if self._masks is None:
            from ..constrain import MaskBatch

            self._masks = MaskBatch()
        pending = self._masks.start([s.gen.constraint for s in sampling])
        return {s.id: (pending, i) for i, s in enumerate(sampling)}

    def _forward(self, plan: StepPlan, output: str = "logits", greedy: bool = False):
        """model.forward with KV-pressure handling: on a full pool free cached states, then
        let prefilling slots wait (dropped from this step), then fail the youngest request
        with ContextFullError. Shrinks the plan in place; None: nothing ran. `output`:
        "logits", or "hidden" (every token's hidden state, for embeddings). `greedy`: also
        each logits row's argmax, into plan.argmax (found by the decode step's head)."""
        while plan.items:
            try:
                if output != "logits":
                    return self.model.forward(plan.batch, output=output)
                n_logits = plan.n_logits
                plan.argmax = None
                kw = {} if n_logits is None else {"n_logits": n_logits}
                if greedy:
                    kw["argmax"] = np.empty(len(plan) if n_logits is None else sum(n_logits), dtype=np.int64)
                logits = self.model.forward(plan.batch, **kw)
                plan.argmax = kw.get("argmax")
                return logits
            except ContextFullError as e:
                if memory.make_room(plan.batch, self._evict_cached, self._drop_idle_state):
                    continue
                items = plan.items
                pre = [i for i, it in enumerate(items) if it.slot.phase is Phase.PREFILL]
                if pre and len(items) > 1:
                    # the youngest prefilling request gives its memory back and waits again
                    i = max(pre, key=lambda i: items[i].slot.task.t_submit)
                    self._preempt(plan.drop(i).slot)
                    continue
                # one request (or only decodes) that cannot fit: fail the youngest
                i = max(range(len(items)), key=lambda i: items[i].slot.task.t_submit)
                it = plan.drop(i)
                self.c.kv_full_failures += 1
                err = ContextFullError(
                    f"not enough KV memory for this request ({it.slot.n_tokens} tokens held, "
                    f"{it.n} more needed; KV pool limit "
                    f"{self._cache_numbers.get('kv_limit_bytes', 0) // 2**20} MiB, n_ctx {self.n_ctx}): {e}")
                log.warning("slot %d: %s", it.slot.id, err)
                self._fail(it.slot, err, drop_state=True)
            except Exception as e:  # noqa: BLE001 - fail these requests, keep serving
                log.exception("forward failed for %d segment(s)", len(plan))
                for it in plan.items:
                    self._fail(it.slot, e, drop_state=True)
                return None
        return None

    def _evict_cached(self) -> bool:
        return self.pcache is not None and self.pcache.evict_lru() is not None

    def _drop_idle_state(self) -> bool:
        idle = [s for s in self.slots if not s.busy and s.n_tokens > 0]
        if not idle:
            return False
        victim = min(idle, key=lambda s: s.t_last_used)
        log.info("KV pool full: dropping idle slot %d's state (%d tokens)", victim.id, victim.n_tokens)
        self.prefix.clear(victim)
        self.c.idle_slot_evictions += 1
        return True

    def _preempt(self, s: Slot) -> None:
        """Put a prefilling request back at the head of the queue, releasing its state (it
        has emitted nothing yet); it restarts when memory allows."""
        task = s.task
        self.c.kv_full_waits += 1
        log.info("KV pool full: slot %d's request (task %d) waits for memory", s.id, task.id)
        self.prefix.clear(s)
        self._release_slot(s)
        task.slot_id = None
        self._waiting.appendleft(task)

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

    # ---- after the forward: sampling and the end of a generation ---------------------
    def _sample(self, s: Slot, row: np.ndarray, mask=None, argmax: int | None = None) -> None:
        """Sample the slot's next token from its logits row (argmax: the row's, when the
        step found it; ignored once the row is changed here)."""
        g = s.gen
        p = g.task.params
        c = g.constraint
        if mask is not None:
            argmax = None
            pending, i = mask
            row = pending.apply(i, row)
            if not np.isfinite(row).any():
                raise GrammarStuckError(f"the grammar allows no next token ({c.error or 'no way to go on'})")
        if len(g.generated) < p.min_tokens and self.eog_ids:
            argmax = None
            row = self._without_eog(row)
        budget = p.reasoning_budget
        forced = budget.forced() if budget is not None else None
        if forced is not None:  # the thinking budget is spent: its block is closed
            sample = Sample(forced, float("nan"), None)
        else:
            sample = g.sampler.sample(row, g.history, argmax)
        tok = sample.token
        if budget is not None:
            budget.after(tok)
        g.generated.append(tok)
        g.history.append(tok)
        if tok in self.eog_ids and not p.ignore_eos:
            self._finish(s, StopReason.EOS)
            return
        if c is not None and not c.consume(tok):
            raise GrammarStuckError(f"the sampled token does not fit the grammar ({c.error})")
        text, stop = g.output.feed(tok)
        self._emit(g, [tok], text, [sample])
        if stop is not None:
            self._finish(s, StopReason.WORD, stop)
            return
        if c is not None and c.stopped:  # complete: only end-of-generation could follow
            self._finish(s, StopReason.EOS)
            return
        n_gen = len(g.generated)
        if (p.n_predict > 0 and n_gen >= p.n_predict) or g.n_prompt + n_gen >= s.n_ctx:
            self._finish(s, StopReason.LIMIT)
            return
        g.last_token = tok

    def _without_eog(self, row: np.ndarray) -> np.ndarray:
        """min_tokens: end-of-generation refused, unless nothing else is left (a grammar
        that is complete)."""
        ids = [t for t in self.eog_ids if t < row.shape[0]]
        out = row.copy()
        out[ids] = -np.inf
        return out if np.isfinite(out).any() else row

    def _emit(self, g: Generation, tokens, text: str, samples) -> None:
        want_probs = g.task.params.sampling.n_probs > 0
        g.task.put(TokenEvent(list(tokens), text, list(samples) if want_probs else []))

    def _finish(self, s: Slot, why: StopReason, word: str = "", embedding: list[float] | None = None) -> None:
        g = s.gen
        task = g.task
        now = time.perf_counter()
        if why not in (StopReason.CANCEL, StopReason.WORD):
            rest = g.output.flush()  # text held back for stop strings, incomplete UTF-8
            if rest:
                task.put(TokenEvent([], rest, []))
        t_prompt_done = g.t_prompt_done or now
        tm = Timings(
            cache_n=g.n_cached,
            prompt_n=min(g.i_pending, len(g.pending)),
            prompt_ms=1e3 * (t_prompt_done - g.t_start),
            predicted_n=len(g.generated),
            predicted_ms=1e3 * (now - t_prompt_done) if g.t_prompt_done else 0.0,
            cache_source=g.cache_source if g.n_cached else CacheSource.NONE,
            checkpoint_restores=g.n_ckpt_restored,
            draft_n=g.n_drafted, draft_n_accepted=g.n_draft_accepted,
        )
        c = self.c
        c.requests_total += 1
        c.prompt_tokens_total += tm.prompt_n
        c.prompt_seconds_total += tm.prompt_ms / 1e3
        c.tokens_predicted_total += tm.predicted_n
        c.tokens_predicted_seconds_total += tm.predicted_ms / 1e3
        c.cache_tokens_total += tm.cache_n
        final = None
        if why is StopReason.CANCEL:
            c.requests_cancelled += 1
            task.done = True
        else:
            final = FinalEvent(why, word, g.n_prompt, len(g.generated), tm, s.id, truncated=False,
                               embedding=embedding)
        td = tm.to_dict()
        log.info("slot %d task %d %s: prompt %d tok (%d cached from %s) %.1f tok/s, generated %d "
                 "tok %.1f tok/s", s.id, task.id, why, g.n_prompt, g.n_cached, tm.cache_source,
                 td["prompt_per_second"], len(g.generated), td["predicted_per_second"])
        # the slot is idle before the client hears "done": /slots and /metrics read right
        # after a response must not show it still processing
        self._release_slot(s)
        if final is not None:
            task.put(final)

    def _fail(self, s: Slot, err: BaseException, drop_state: bool) -> None:
        """End the slot's request with an error; `drop_state` when the state may be
        half-updated (the next request starts from scratch)."""
        self.c.requests_errors += 1
        if s.task is not None:
            s.task.put(ErrorEvent(err))
        if drop_state:
            self.prefix.drop(s)
        self._release_slot(s)

    def _release_slot(self, s: Slot) -> None:
        s.last, s.gen = s.gen, None
        if s.last is not None:
            s.last.ckpt_plan.clear()
        s.published = False
        s.t_last_used = time.time()


def load_engine(path: str | Path, cfg: EngineConfig | None = None, wait: bool = True) -> Engine:
    """Engine for the GGUF at `path`, started; waits for the load unless wait=False."""
    eng = Engine.from_path(path, cfg)
    eng.start()
    if wait and not eng.wait_ready():
        eng.stop()
        raise ModelLoadFailedError(f"cannot load {path}: {eng.load_error}")
    return eng


__all__ = ["Engine", "EngineStatus", "load_engine"]
