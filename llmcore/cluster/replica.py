"""One engine as a Ray Serve replica: its own process, threads, model and caches.

The front end sends tokenized prompts (`ReplicaRequest`); `generate` streams back
`EventBatch`es, every event the engine had ready at once, never an exception: an error is
an event like the engine's own, so it reaches the client as the same error class.
`record_replica_metadata` tells the router the replica's rank (stable across a restart:
the replacement takes the rank of the replica it replaces), `report` its numbers.
"""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from .. import __version__
from ..engine import Engine, EngineConfig, EngineStatus, ErrorEvent, FinalEvent
from ..errors import EngineFailure, LLMCoreError, ModelLoadError, ModelLoadFailedError
from .wire import EventBatch, ReplicaFacts, ReplicaReport, ReplicaRequest

log = logging.getLogger("llmcore.cluster")

MAX_BATCH = 64  # events per stream item


def portable(err: BaseException) -> BaseException:
    """An error the front end can unpickle and the server maps to its status: llmcore's
    own classes as they are, anything else as EngineFailure (HTTP 500) with its text."""
    if isinstance(err, LLMCoreError):
        return err
    return EngineFailure(f"{type(err).__name__}: {err}")


class EngineReplica:
    """A Ray Serve deployment class (wrapped by `serve.deployment` in `pool.deploy`)."""

    def __init__(self, model_path: str, cfg: EngineConfig):
        import ray
        from ray import serve

        from ..threads import set_num_threads

        ctx = ray.get_runtime_context()
        self.rank = serve.get_replica_context().rank.rank
        self.node_id = ctx.get_node_id()
        self.actor_id = ctx.get_actor_id()
        path = Path(model_path)
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such file on node {ray.util.get_node_ip_address()} "
                                 "(every node that runs a replica needs the model at this path)")
        set_num_threads(cfg.n_threads or None)
        self.engine = Engine.from_path(path, cfg)
        self.engine.start()
        if not self.engine.wait_ready():
            raise ModelLoadFailedError(f"cannot load {path}: {self.engine.load_error}")
        log.info("replica %d (pid %d) serves %s", self.rank, os.getpid(), path.name)

    # ---- what Ray Serve calls --------------------------------------------------------
    def record_replica_metadata(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid()}

    def check_health(self) -> None:
        if self.engine.status is not EngineStatus.READY:
            raise ModelLoadFailedError(f"replica {self.rank}: engine {self.engine.status}")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop(timeout=2.0)

    # ---- what the front end calls ----------------------------------------------------
    def facts(self, rank: int | None = None) -> ReplicaFacts:
        e = self.engine
        return ReplicaFacts(n_ctx=e.n_ctx, n_ctx_slot=e.n_ctx_slot, n_slots=len(e.slots),
                            n_vocab=int(e.info.get("n_vocab") or 0),
                            n_ctx_train=int(e.info.get("n_ctx_train") or 0),
                            needs_checkpoints=e.needs_checkpoints, memory_plan=e.memory_plan,
                            version=__version__)

    def report(self, rank: int | None = None) -> ReplicaReport:
        """`rank` is read by the router (which replica to ask), not here."""
        return ReplicaReport(rank=self.rank, pid=os.getpid(), node_id=self.node_id,
                             actor_id=self.actor_id, stats=self.engine.stats())

    async def generate(self, request: ReplicaRequest):
        try:
            task = self.engine.submit(request.prompt, request.params_here(self.engine.tokenizer))
        except Exception as e:  # noqa: BLE001 - refused here (the front end checked most)
            yield EventBatch(self.rank, None, [ErrorEvent(portable(e))], self.engine.stats())
            return
        try:
            while True:
                events, last = await self._ready_events(task)
                yield EventBatch(self.rank, task.slot_id, events,
                                 self.engine.stats() if last else None)
                if last:
                    return
        finally:
            task.close()  # the front end went away (or the stream ended): free the slot

    async def _ready_events(self, task) -> tuple[list, bool]:
        """The next event, then every one already waiting; True when the request ended."""
        events: list = []
        try:
            events.append(await task.next_event())
            while not isinstance(events[-1], FinalEvent) and len(events) < MAX_BATCH:
                try:
                    events.append(await task.next_event(timeout=0))
                except asyncio.TimeoutError:
                    break
        except Exception as e:  # noqa: BLE001 - the engine's ErrorEvent, raised by next_event
            events.append(ErrorEvent(portable(e)))
            return events, True
        return events, isinstance(events[-1], FinalEvent)


__all__ = ["EngineReplica", "portable"]
