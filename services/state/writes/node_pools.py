"""Node pool writes (Nomad's NodePool.UpsertNodePools/DeleteNodePools and the
state store's `fetchOrCreateNodePoolTxn`), each deciding on rows read in its
transaction. The built-in pools `all` and `default` are never changed."""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain import node_pools
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.db.database import WriteTx
from services.state.writes import named
from services.state.writes.named import MAX_BATCH


def validate_node_pools(items: Sequence[pb.NodePool]) -> None:
    """Each pool well formed, not built in, named once (before any transaction)."""
    named.validate_batch(
        items, "node_pools", "node pool", node_pools.config_problem, refusal=_built_in
    )


def _built_in(pool: pb.NodePool) -> str | None:
    if not node_pools.is_built_in(pool.name):
        return None
    return f"modifying node pool {pool.name!r} is not allowed"


async def upsert_node_pools(tx: WriteTx, items: Sequence[pb.NodePool]) -> None:
    """Create or replace each pool (validated by `validate_node_pools`)."""
    await named.upsert_changed(items, tx.get_node_pool, tx.put_node_pool)


async def delete_node_pools(tx: WriteTx, names: Sequence[str]) -> None:
    """Delete each pool; refused (nothing deleted) for a built-in pool, one
    that does not exist, one with nodes or jobs that are not dead, or one a
    namespace names as its default."""
    if not names:
        raise InvalidArgument("names", "must specify at least one node pool to delete")
    validate.at_most(len(names), MAX_BATCH, "names", "names")
    found: list[pb.NodePool] = []
    for i, name in enumerate(names):
        if not name:
            raise InvalidArgument(f"names[{i}]", "node pool name is empty")
        if node_pools.is_built_in(name):
            raise InvalidArgument(f"names[{i}]", f"deleting node pool {name!r} is not allowed")
        pool = await tx.get_node_pool(name) if node_pools.name_problem(name) is None else None
        if pool is None:
            raise NotFound(f"node pool {name!r} not found")
        node_id = await tx.first_node_in_pool(name)
        if node_id is not None:
            raise FailedPrecondition(f"node pool {name!r} has nodes (node {node_id})")
        job = await tx.first_live_job(node_pool=name)
        if job is not None:
            # as Nomad's, without naming the job: a node_pool delete grant
            # gives no read of any namespace's jobs
            raise FailedPrecondition(f"node pool {name!r} has non-terminal jobs")
        users = await tx.namespaces_with_default_pool(name)
        if users:
            raise FailedPrecondition(
                f"node pool {name!r} is the default node pool of namespace(s) {', '.join(users)}"
            )
        found.append(pool)
    for pool in found:
        tx.delete_node_pool(pool)


async def ensure_node_pool(tx: WriteTx, name: str) -> None:
    """A node registering in a pool that does not exist creates it (Nomad's
    fetchOrCreateNodePoolTxn); the pool's name was checked by the caller."""
    if await tx.get_node_pool(name) is None:
        tx.put_node_pool(pb.NodePool(name=name))
