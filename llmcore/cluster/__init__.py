"""Engines as Ray Serve replicas behind one front end (`llmcore serve --replicas N`).

Its parts, one module each:

- ``config``        ClusterConfig (replicas, Ray address, routing), Routing
- ``pool``          ReplicaPool: the engine interface (EngineClient) over the replicas
- ``replica``       EngineReplica: one engine as a Ray Serve replica
- ``router``        PrefixAffinityRouter: Ray Serve's RequestRouter with prefix affinity
- ``prefix_index``  which replica holds which prompt prefix; the routing policy itself
- ``fleet``         the latest report per replica and the fleet's EngineStats
- ``wire``          what travels between front end and replicas

Ray is imported only when a pool starts (``router`` and ``replica`` import it at once):
llmcore runs without it, `--replicas` says how to install it.
"""
from .config import ClusterConfig, Routing
from .pool import RayMissingError, ReplicaPool

__all__ = ["ClusterConfig", "Routing", "ReplicaPool", "RayMissingError"]
