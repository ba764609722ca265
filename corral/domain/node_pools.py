"""Node pools as objects (Nomad's `NodePool`): the two built-in pools, what a
name may be, and the scheduler configuration a pool's jobs are placed with
(the pool's own settings over the cluster's, Nomad's `WithNodePool`)."""

from __future__ import annotations

import re

from corral.domain.structs import ALL_NODE_POOL, DEFAULT_NODE_POOL, SchedulerAlgorithm, copy_msg
from corral.v1 import structs_pb2 as pb

#: Nomad's rule for node pool names
NAME = re.compile(r"^[a-zA-Z0-9-_]{1,128}$")
MAX_DESCRIPTION = 256
BUILT_IN = (ALL_NODE_POOL, DEFAULT_NODE_POOL)
ALGORITHMS = (SchedulerAlgorithm.BINPACK, SchedulerAlgorithm.SPREAD)


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a node pool, or None."""
    if not NAME.match(name):
        return "must be 1 to 128 letters, digits, '-' or '_'"
    return None


def built_in() -> list[pb.NodePool]:
    """The pools that always exist: `all` (every node) and `default`."""
    return [
        pb.NodePool(name=ALL_NODE_POOL, description="Node pool with all nodes in the cluster."),
        pb.NodePool(name=DEFAULT_NODE_POOL, description="Default node pool."),
    ]


def is_built_in(name: str) -> bool:
    return name in BUILT_IN


def node_in_pool(node: pb.Node, pool: str) -> bool:
    """Nomad's IsInPool: every node is in `all`."""
    return pool in ("", ALL_NODE_POOL) or (node.node_pool or DEFAULT_NODE_POOL) == pool


def config_problem(pool: pb.NodePool) -> tuple[str, str] | None:
    """(field, problem) of the first thing wrong in a pool, or None."""
    problem = name_problem(pool.name)
    if problem is not None:
        return "name", problem
    if len(pool.description) > MAX_DESCRIPTION:
        return "description", f"is longer than {MAX_DESCRIPTION} characters"
    algorithm = pool.scheduler_config.scheduler_algorithm
    if algorithm and algorithm not in ALGORITHMS:
        return (
            "scheduler_config.scheduler_algorithm",
            f"unknown algorithm {algorithm!r} (expected {' or '.join(ALGORITHMS)})",
        )
    return None


def effective_config(
    cluster: pb.SchedulerConfiguration, pool: pb.NodePool | None
) -> pb.SchedulerConfiguration:
    """The configuration a job of `pool` is scheduled with: the cluster's,
    with the algorithm and memory oversubscription the pool sets (a pool
    that sets neither, or a pool not known, leaves the cluster's)."""
    if pool is None or not pool.HasField("scheduler_config"):
        return cluster
    own = pool.scheduler_config
    if not own.scheduler_algorithm and not own.HasField("memory_oversubscription_enabled"):
        return cluster
    out = copy_msg(cluster)
    if own.scheduler_algorithm:
        out.scheduler_algorithm = own.scheduler_algorithm
    if own.HasField("memory_oversubscription_enabled"):
        out.memory_oversubscription_enabled = own.memory_oversubscription_enabled
    return out
