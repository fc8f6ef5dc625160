"""`ReplicaPool`: the engine interface (`llmcore.engine.EngineClient`) over engine replicas
running as a Ray Serve deployment, on this machine or a Ray cluster.

The front end holds what a prompt needs before any engine sees it: the tokenizer and chat
template read from the GGUF (no weights), so prompts are tokenized here and the router
can route by tokens. `submit` checks a request as an engine would and returns the same
`Task` an engine returns; a pump coroutine on the caller's loop feeds it from the
replica's stream (Ray Serve streaming handle), batch by batch as tokens come.

Start-up runs on a thread (`start` returns at once, /health says 503 meanwhile): connect
to Ray (or start a local instance: `ClusterConfig.ray_address` None), deploy the replicas
(`serve.run` returns once every replica loaded its model), read their facts. Then a
poller thread reads every replica's stats each `stats_interval_s`; `stats()` aggregates
the latest without waiting on anyone.

Faults: Ray replaces a replica whose process dies (the same rank comes back). Its
requests end with `ReplicaLostError` (HTTP 503 + Retry-After when the answer had not
started; an error event in a stream that had); the router stops sending to it as soon
as Ray reports it dead, and it shows as down until its replacement answers.
"""
from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path

from .. import metrics
from ..engine import EngineConfig, EngineStatus, ErrorEvent, FinalEvent, GenParams, Task
from ..engine.config import check_params, check_prompt
from ..errors import (EngineFailure, LLMCoreError, ModelLoadFailedError, ModelLoadingError,
                      NotSupportedError, ReplicaLostError,
                      ReplicaUnavailableError, RequestError, ShuttingDownError)
from .config import ClusterConfig
from .fleet import FleetView, aggregate, global_slot
from .wire import ReplicaFacts, ReplicaReport, ReplicaRequest

log = logging.getLogger("llmcore.cluster")

DEPLOYMENT = "llmcore-engine"


class RayMissingError(LLMCoreError):
    """`--replicas` needs Ray Serve: pip install 'llmcore[cluster]'."""


def import_ray():
    """(ray, ray.serve), or RayMissingError naming the install command."""
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise RayMissingError(f"--replicas needs Ray Serve ({e}): pip install 'llmcore[cluster]'") from None
    return ray, serve


class ReplicasFailedError(LLMCoreError):
    """The replicas could not start (their model did not load, no node had the CPUs)."""


def _why_replicas_failed(serve, app: str) -> str:
    """The last line of the replicas' own error, from Ray Serve's status ("" if none)."""
    try:
        msg = serve.status().applications[app].deployments[DEPLOYMENT].message or ""
    except Exception:  # noqa: BLE001 - only for the message
        return ""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b", ln)]
    return (errors or lines or [""])[-1]


class ClusterUnreachableError(LLMCoreError):
    """--ray-address names a host:port where no Ray cluster answers."""


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """ClusterUnreachableError unless a TCP connection to a `host:port` address opens
    (other forms, "auto" and "ray://...", are left to Ray)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ClusterUnreachableError(f"--ray-address {address}: no Ray cluster answers there "
                                      f"({e.strerror or e}); start one with `ray start --head`") from None


def _package_root() -> str:
    import llmcore

    return str(Path(llmcore.__file__).resolve().parent.parent)


class ReplicaPool:
    """Engine replicas behind one interface. `cfg` is each replica's EngineConfig (its
    threads are `cluster.threads_per_replica`); `self.cfg` shows it for the fleet
    (`n_parallel` counts every replica's slots, as /props "total_slots" does)."""

    def __init__(self, model_path: str | Path, cfg: EngineConfig | None = None,
                 cluster: ClusterConfig | None = None):
        cfg = cfg or EngineConfig()
        self.cluster = cluster or ClusterConfig()
        self.model_path = Path(model_path)
        n, t = self.cluster.replicas, self.cluster.threads_per_replica
        self.replica_cfg = dataclasses.replace(cfg, n_threads=t, n_threads_batch=t)
        self.cfg = dataclasses.replace(cfg, n_parallel=max(1, cfg.n_parallel) * n)
        self.tokenizer = None
        self.chat_template = None
        self.info: dict = {"path": str(self.model_path), "name": self.model_path.stem}
        self.status = EngineStatus.LOADING
        self.load_error: str | None = None
        self.n_ctx = 0
        self.n_ctx_slot = 0
        self.t_start = time.time()
        self.facts: ReplicaFacts | None = None
        self.fleet = FleetView(n)
        self._handle = None  # ray.serve DeploymentHandle
        self._stream = None  # the same, streaming
        self._actor_errors: tuple[type[BaseException], ...] = ()
        self._thread: threading.Thread | None = None  # start-up, the stats poller, teardown
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._connected = False  # we called ray.init (and disconnect at stop)
        self._local_ray = False  # ... and it started a local instance
        self._deployed = False
        self._pumps: set[asyncio.Task] = set()
        self._closed = False  # close_intake: new requests get ShuttingDownError

    # ---- facts -----------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.cfg.model_alias or self.info.get("path") or self.info.get("name") or "model"

    @property
    def needs_checkpoints(self) -> bool:
        return bool(self.facts and self.facts.needs_checkpoints)

    @property
    def memory_plan(self) -> dict:
        """The fleet's plan: every budget of one replica's plan times the replicas."""
        plan = dict(self.facts.memory_plan) if self.facts else {}
        for k, v in plan.items():
            if k.endswith("_max_bytes") and isinstance(v, int):
                plan[k] = v * self.cluster.replicas
        return plan

    @property
    def default_n_predict(self) -> int:
        """As an engine's: -n, else a slot's share of one replica's context."""
        if self.cfg.n_predict > 0:
            return self.cfg.n_predict
        return max(1, (self.facts.n_ctx if self.facts else 0) // self.n_slots_per_replica)

    @property
    def n_slots_per_replica(self) -> int:
        return self.facts.n_slots if self.facts else max(1, self.replica_cfg.n_parallel)

    def require_ready(self) -> None:
        if self.status is EngineStatus.LOADING:
            raise ModelLoadingError()
        if self.status is not EngineStatus.READY:
            raise ModelLoadFailedError(f"replicas failed to start: {self.load_error}")
        if self.fleet.n_up == 0:
            raise ReplicaUnavailableError("no replica is serving now (they are being replaced)",
                                          self.cluster.retry_after_s)

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llmcore-pool", daemon=True)
            self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.status is EngineStatus.READY

    def stop(self, timeout: float = 60.0) -> None:
        """Remove the replicas (and the local Ray instance, when it is ours). A start-up
        still under way is given a few seconds: the pool's thread ends with the process."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout if self.status is not EngineStatus.LOADING else min(timeout, 10.0))
        self._thread = None

    def _run(self) -> None:
        """The pool's own thread, for the whole Ray session: a local Ray instance's
        processes end with the thread that started them (parent-death signal)."""
        try:
            if self._boot():
                self._poll_loop()
        finally:
            self._teardown()

    def _boot(self) -> bool:
        try:
            from ..loader import load_gguf_text

            text = load_gguf_text(self.model_path, **self.replica_cfg.template_options())
            self.tokenizer, self.chat_template = text.tokenizer, text.chat_template
            self.info.update({k: v for k, v in text.info.items() if v is not None})
            ray, serve = import_ray()
            self._actor_errors = (ray.exceptions.RayActorError,)
            self._connect(ray)
            if self._stopping.is_set():
                return False
            self._deploy(serve)
            facts = self._handle.facts.remote().result(timeout_s=120)
            if facts.version != _version():
                log.warning("replicas run llmcore %s, this front end %s", facts.version, _version())
            self.facts = facts
            self.n_ctx = facts.n_ctx * self.cluster.replicas
            self.n_ctx_slot = facts.n_ctx_slot
            self.info.setdefault("n_vocab", facts.n_vocab)
            self.info.setdefault("n_ctx_train", facts.n_ctx_train)
            self.poll_once()
            self.status = EngineStatus.READY
            log.info("%d replica(s) of %s ready (%d slot(s) each, routing %s)", self.cluster.replicas,
                     self.model_path.name, facts.n_slots, self.cluster.routing)
            return True
        except Exception as e:  # noqa: BLE001 - reported through status / load_error
            if isinstance(e, LLMCoreError):
                log.error("replicas failed to start: %s", e)
            else:
                log.exception("replicas failed to start")
            self.load_error = str(e) or type(e).__name__
            self.status = EngineStatus.FAILED
            return False
        finally:
            self._ready.set()

    def _connect(self, ray) -> None:
        if ray.is_initialized():  # the caller's Ray session: use it, leave it up
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not faulthandler.is_enabled():  # Ray would, on sys.stderr: the dashboard replaces it
            faulthandler.enable(file=sys.__stderr__, all_threads=False)
        c = self.cluster
        if c.ray_address is not None:
            check_reachable(c.ray_address)  # ray.init would retry an unreachable address forever
            try:
                ray.init(address=c.ray_address, log_to_driver=c.log_to_driver)
            except ConnectionError as e:  # "auto" with no cluster here, or its token missing
                raise ClusterUnreachableError(
                    f"--ray-address {c.ray_address}: {e} (a cluster with token authentication: "
                    "RAY_AUTH_MODE=token and its token, see docs/cluster.md)") from None
        else:
            ray.init(num_cpus=c.replicas * c.threads_per_replica, include_dashboard=False,
                     object_store_memory=c.object_store_mib << 20, log_to_driver=c.log_to_driver,
                     runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}})
            self._local_ray = True
        self._connected = True

    def _deploy(self, serve) -> None:
        from ray.serve.config import RequestRouterConfig

        from .replica import EngineReplica
        from .router import PrefixAffinityRouter

        c = self.cluster
        router = RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs=dict(
                routing=str(c.routing), block_size=c.block_size,
                imbalance_threshold=(c.imbalance_threshold if c.imbalance_threshold is not None
                                     else self.n_slots_per_replica),
                match_rate_threshold=c.match_rate_threshold,
                index_blocks_per_replica=c.index_blocks_per_replica))
        env = {"OMP_NUM_THREADS": str(c.threads_per_replica)}
        deployment = serve.deployment(EngineReplica, name=DEPLOYMENT).options(
            num_replicas=c.replicas, max_ongoing_requests=c.max_ongoing_requests,
            ray_actor_options={"num_cpus": c.threads_per_replica, "runtime_env": {"env_vars": env}},
            request_router_config=router, health_check_period_s=c.health_check_period_s,
            graceful_shutdown_timeout_s=5, max_constructor_retry_count=3,  # a model that cannot load fails
            logging_config={"enable_access_log": False})  # a line per stats poll otherwise
        serve.start(proxy_location="Disabled")
        self._deployed = True
        try:
            self._handle = serve.run(deployment.bind(str(self.model_path.resolve()), self.replica_cfg),
                                     name=c.app_name, route_prefix=None)
        except RuntimeError as e:  # the replicas failed to start: say why, in their words
            raise ReplicasFailedError(f"{e} {_why_replicas_failed(serve, c.app_name)}".strip()) from None
        self._stream = self._handle.options(stream=True)

    def _teardown(self) -> None:
        try:
            ray, serve = import_ray()
        except RayMissingError:
            return
        try:
            if self._local_ray:
                serve.shutdown()
            elif self._deployed:
                serve.delete(self.cluster.app_name)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            log.exception("removing the replicas failed")
        self._deployed = False
        if self._connected:
            ray.shutdown()
            self._connected = self._local_ray = False

    # ---- the fleet's numbers -----------------------------------------------------------
    def _poll_loop(self) -> None:
        while not self._stopping.wait(self.cluster.stats_interval_s):
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - the poller must go on
                log.exception("reading the replicas' stats failed")

    def poll_once(self) -> None:
        """Ask every rank for its report (the router sends each to its rank); one that does
        not answer in time, or whose rank nobody holds now, is down."""
        calls = {r: self._handle.report.remote(rank=r) for r in range(self.cluster.replicas)}
        for rank, call in calls.items():
            try:
                rep: ReplicaReport = call.result(timeout_s=self.cluster.stats_timeout_s)
            except Exception as e:  # noqa: BLE001 - a replica that does not answer is down
                call.cancel()
                log.debug("replica %d did not report: %s", rank, e)
                self.fleet.mark_down(rank)
                continue
            self.fleet.update(rep)
            if rep.rank != rank:  # the router had no replica of this rank
                self.fleet.mark_down(rank)

    def stats(self) -> metrics.EngineStats:
        if self.status is not EngineStatus.READY:
            return metrics.EngineStats(status=str(self.status), model=self.model_name)
        per_rank = [rep.stats if rep is not None else None for rep in self.fleet.reports()]
        return aggregate(per_rank, status=str(self.status), model=self.model_name,
                         n_slots=self.n_slots_per_replica)

    def replica_reports(self) -> list[ReplicaReport | None]:
        """Per rank: who serves it now (pid, node, actor) and its numbers; None while down."""
        return self.fleet.reports()

    # ---- requests ----------------------------------------------------------------------
    def close_intake(self) -> None:
        """Refuse new requests from now on (graceful shutdown); those sent run on."""
        self._closed = True

    @property
    def n_active(self) -> int:
        """Requests this front end has sent and not yet seen end."""
        return len(self._pumps)

    def slot_action(self, action: str, slot_id: int, filename: str | None = None):
        raise NotSupportedError("slot save/restore/erase is not available with --replicas: each "
                                "replica keeps its own slots (its prompt cache's disk tier still works)")

    def submit(self, prompt, params: GenParams | None = None) -> Task:
        """Check the request as an engine would, send it to the replica the router picks,
        and return the Task its events arrive on (from the calling event loop)."""
        prompt = [int(t) for t in prompt]
        params = params or GenParams()
        if self._closed:
            raise ShuttingDownError()
        self.require_ready()
        check_prompt(prompt, self.n_ctx_slot, int(self.info.get("n_vocab") or 0))
        if params.id_slot is not None and params.id_slot >= 0:
            raise RequestError("id_slot is not supported with replicas: each replica has its own "
                               "slots and the router picks the replica holding the prompt's prefix")
        check_params(params)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise LLMCoreError("ReplicaPool.submit must be called from a coroutine") from None
        pump: list[asyncio.Task] = []
        task = Task(prompt, params, loop, wake=lambda: loop.call_soon_threadsafe(_cancel, pump))
        stream = self._stream.generate.remote(ReplicaRequest.of(prompt, params))
        p = loop.create_task(self._pump(task, stream))
        pump.append(p)
        self._pumps.add(p)
        p.add_done_callback(self._pumps.discard)
        return task

    async def _pump(self, task: Task, stream) -> None:
        rank: int | None = None
        n_tokens = 0
        n = self.n_slots_per_replica
        try:
            async for batch in stream:
                rank = batch.rank
                if batch.slot_id is not None:
                    task.slot_id = global_slot(rank, batch.slot_id, n)
                if batch.stats is not None:  # before the client hears "done"
                    self.fleet.update_stats(rank, batch.stats)
                for ev in batch.events:
                    if isinstance(ev, FinalEvent):
                        ev = dataclasses.replace(ev, slot_id=global_slot(rank, ev.slot_id, n))
                    n_tokens += len(getattr(ev, "tokens", ()))
                    task.put(ev)
                    if isinstance(ev, (FinalEvent, ErrorEvent)):
                        return
            task.put(ErrorEvent(EngineFailure("the replica ended the stream without a result")))
        except asyncio.CancelledError:
            stream.cancel()  # the replica's generator is cancelled: its engine frees the slot
            raise
        except self._actor_errors as e:
            if rank is None:
                rank = self.fleet.rank_of_actor(getattr(e, "actor_id", None))
            if rank is not None:
                self.fleet.mark_down(rank)
            who = "a replica" if rank is None else f"replica {rank}"
            after = f" after {n_tokens} token(s)" if n_tokens else " before it started"
            log.warning("%s stopped while running a request%s", who, after)
            task.put(ErrorEvent(ReplicaLostError(
                f"{who} stopped while running this request{after}; it is being replaced: "
                f"retry in {self.cluster.retry_after_s:g} s", rank, self.cluster.retry_after_s)))
        except Exception as e:  # noqa: BLE001 - reported to the caller
            log.exception("a replica call failed")
            task.put(ErrorEvent(EngineFailure(f"replica call failed: {type(e).__name__}: {e}")))


def _cancel(pump: list) -> None:
    for p in pump:
        p.cancel()


def _version() -> str:
    from .. import __version__

    return __version__


def _pythonpath() -> str:
    """Replicas of a local instance import the llmcore this front end runs."""
    return os.pathsep.join(p for p in (_package_root(), os.environ.get("PYTHONPATH", "")) if p)


__all__ = ["ReplicaPool", "RayMissingError", "ClusterUnreachableError", "check_reachable", "import_ray"]
