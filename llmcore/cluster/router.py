"""The request router: Ray Serve's RequestRouter API with prefix affinity on token blocks.

Ray Serve builds one router per deployment handle, in the process that holds the handle
(the front end), and asks it for each request which replicas may take it. This one follows
Ray Serve LLM's PrefixCacheAffinityRouter, on the tokenized prompt instead of its text and
with the index in the router itself (one front end; no tree actor to call per request):
`prefix_index.rank_replicas` picks the replica holding the longest prefix of the prompt
unless its queue is more than `imbalance_threshold` requests longer than the shortest, and
every routed prompt is remembered for the replica it went to.

Two more rules: a call with a `rank=` keyword goes to the replica of that rank (the front
end reads each replica's stats this way; when that replica is gone, any replica answers
and says who it is), and `routing="power_of_two"` is Ray Serve's default choice unchanged
(`PowerOfTwoChoicesRequestRouter.choose_replicas`), for comparison.

Ray pickles this module by value for the router; what it imports is imported by name.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import List, Optional

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import (LocalityMixin, MultiplexMixin, PendingRequest, ReplicaID,
                                      RequestRouter, RunningReplica)

from llmcore.cluster.prefix_index import PrefixIndex, rank_replicas
from llmcore.cluster.wire import ReplicaRequest

log = logging.getLogger("llmcore.cluster")

CHOOSING_TTL_S = 2.0  # a choice not sent by then was not taken


def request_of(pending: Optional[PendingRequest]) -> Optional[ReplicaRequest]:
    if pending is None or not pending.args:
        return None
    arg = pending.args[0]
    return arg if isinstance(arg, ReplicaRequest) else None


class PrefixAffinityRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """Ray Serve builds it with `request_router_kwargs` (llmcore.cluster.pool._deploy)
    passed to `initialize_state`; everything it keeps lives on the handle's router loop."""

    def initialize_state(self, routing: str = "prefix", block_size: int = 16, imbalance_threshold: int = 1,
                         match_rate_threshold: float = 0.1, index_blocks_per_replica: int = 1 << 16):
        self._routing = routing
        self._imbalance = imbalance_threshold
        self._match_rate = match_rate_threshold
        self._index = PrefixIndex(block_size, index_blocks_per_replica)
        # chosen here but not yet sent (Ray's queue-length cache counts a request once it
        # is sent): without them a burst of requests would all see the same queues
        self._choosing: dict[ReplicaID, list[float]] = defaultdict(list)

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if pending_request is not None and (rank := pending_request.kwargs.get("rank")) is not None:
            pinned = [r for r in candidate_replicas if r.replica_metadata.get("rank") == rank]
            if pinned:
                return [pinned]
        req = request_of(pending_request)
        if req is None or self._routing != "prefix" or not candidate_replicas:
            return await PowerOfTwoChoicesRequestRouter.choose_replicas(
                self, candidate_replicas=candidate_replicas, pending_request=pending_request)
        hashes = self._index.hashes(req.prompt)
        ids = [r.replica_id for r in candidate_replicas]
        queues = await self._queue_lens(candidate_replicas)
        now = time.monotonic()
        for i, q in queues.items():
            if q is not None:
                queues[i] = q + self._n_choosing(i, now)
        ranked = rank_replicas(
            ids, queues, matched={i: self._index.matched_blocks(i, hashes) for i in ids},
            held={i: self._index.size(i) for i in ids}, n_prompt_blocks=len(hashes),
            imbalance=self._imbalance, match_rate=self._match_rate)
        if any(q is not None for q in queues.values()):  # then the first group is the one chosen
            self._choosing[ranked[0][0]].append(now)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("route %d tokens: matched %s, queues %s -> %s", len(req.prompt),
                      {i.unique_id: self._index.matched_blocks(i, hashes) for i in ids},
                      {i.unique_id: q for i, q in queues.items()}, [[i.unique_id for i in g] for g in ranked])
        by_id = {r.replica_id: r for r in candidate_replicas}
        return [[by_id[i] for i in group] for group in ranked]

    def _n_choosing(self, replica_id: ReplicaID, now: float) -> int:
        times = self._choosing.get(replica_id)
        if not times:
            return 0
        times[:] = [t for t in times if now - t < CHOOSING_TTL_S]  # sent elsewhere, or cancelled
        return len(times)

    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)
        times = self._choosing.get(replica_id)
        if times:
            times.pop(0)

    async def _queue_lens(self, replicas: List[RunningReplica]) -> dict:
        """Requests on each replica: the handle's cached counts, probing the ones it lacks
        (None: the replica did not answer)."""
        lens: dict[ReplicaID, Optional[int]] = {}
        missing = []
        for r in replicas:
            q = self._replica_queue_len_cache.get(r.replica_id) if self._use_replica_queue_len_cache else None
            if q is None:
                missing.append(r)
            else:
                lens[r.replica_id] = q
        if missing:
            for r, q in await self._probe_queue_lens(missing, 0):
                lens[r.replica_id] = q
        return lens

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        req = request_of(pending_request)
        if req is not None and self._routing == "prefix":
            self._index.insert(replica_id, self._index.hashes(req.prompt))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.forget(replica_id)  # its replacement starts with empty caches

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._index.keep_only(self._replica_id_set)
        for i in [i for i in self._choosing if i not in self._replica_id_set]:
            del self._choosing[i]


__all__ = ["PrefixAffinityRouter"]
