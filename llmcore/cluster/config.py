"""How a fleet of engine replicas is set up (``ClusterConfig``); each replica's engine has
its own ``EngineConfig``."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import LLMCoreError


class Routing(str, enum.Enum):
    """How the front end picks a replica for a request."""

    PREFIX = "prefix"  # the replica holding the longest prefix, unless it is much busier
    POWER_OF_TWO = "power_of_two"  # Ray Serve's default: the less busy of two random replicas

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 2
    # an existing Ray cluster ("auto", "ray://host:10001", "host:6379"); None: start a
    # local Ray instance with the server and stop it with the server
    ray_address: str | None = None
    threads_per_replica: int = 1  # CPUs Ray reserves for each replica; its engine's -t
    routing: Routing = Routing.PREFIX
    block_size: int = 16  # prompt tokens per hashed block in the router's prefix index
    # prefix affinity holds while the holder's queue is at most this many requests longer
    # than the shortest queue; None: the engine's slot count (-np)
    imbalance_threshold: int | None = None
    # the matched share of a prompt below which affinity does not count (a shared system
    # prompt alone does not pin conversations to one replica)
    match_rate_threshold: float = 0.1
    index_blocks_per_replica: int = 1 << 16  # router memory: hashed blocks kept per replica
    max_ongoing_requests: int = 256  # per replica (its engine queues what its slots can't take)
    stats_interval_s: float = 1.0  # how often the front end reads every replica's stats
    stats_timeout_s: float = 5.0  # a replica that does not answer in time counts as down
    retry_after_s: float = 5.0  # told to clients whose request a lost replica ended
    health_check_period_s: float = 2.0
    app_name: str = "llmcore"  # the Ray Serve application (one per served model)
    object_store_mib: int = 128  # a local Ray instance's object store (events are small)
    log_to_driver: bool = True  # replicas' log lines on the server's stderr

    def __post_init__(self):
        if self.replicas < 1:
            raise LLMCoreError(f"--replicas {self.replicas}: expected >= 1")
        if self.threads_per_replica < 1:
            raise LLMCoreError(f"threads per replica {self.threads_per_replica}: expected >= 1")
        if self.block_size < 1:
            raise LLMCoreError(f"block size {self.block_size}: expected >= 1")
        object.__setattr__(self, "routing", Routing(self.routing))


__all__ = ["ClusterConfig", "Routing"]
