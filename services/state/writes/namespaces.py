"""Namespace writes (Nomad's Namespace.UpsertNamespaces/DeleteNamespaces and
the state store's checks), each deciding on rows read in its transaction.

A namespace cannot be deleted while something still lives in it. Each kind
of object that lives in a namespace adds its check to `HOLDERS`: jobs that
are not dead, allocs the client has not finished, and variables (Nomad also
refuses while variables remain)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from corral.domain import namespaces
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.domain.structs import DEFAULT_NAMESPACE
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.db.database import WriteTx
from services.state.variables import any_in_namespace
from services.state.writes import named
from services.state.writes.named import MAX_BATCH


def validate_namespaces(items: Sequence[pb.Namespace]) -> None:
    """Each namespace well formed and named once (before any transaction)."""
    named.validate_batch(items, "namespaces", "namespace", namespaces.config_problem)


async def upsert_namespaces(tx: WriteTx, items: Sequence[pb.Namespace]) -> None:
    """Create or replace each namespace (validated by `validate_namespaces`);
    a namespace's default node pool must exist."""
    for i, given in enumerate(items):
        pool = given.node_pool_config.default
        if pool and await tx.get_node_pool(pool) is None:
            raise InvalidArgument(
                f"namespaces[{i}].node_pool_config.default",
                f"node pool {pool!r} does not exist",
            )
    await named.upsert_changed(items, tx.get_namespace, tx.put_namespace)


#: (name, check) of what keeps a namespace from being deleted: the check
#: answers why, or None when nothing of its kind remains
Holder = Callable[[WriteTx, str], Awaitable[str | None]]


async def _live_jobs(tx: WriteTx, name: str) -> str | None:
    found = await tx.first_live_job(namespace=name)
    if found is None:
        return None
    return (
        f"namespace {name!r} contains at least one non-terminal job {found[1]!r}; "
        "all jobs must be terminal in the namespace before it can be deleted"
    )


async def _live_allocs(tx: WriteTx, name: str) -> str | None:
    count = await tx.count_live_allocs_in_namespace(name)
    if not count:
        return None
    return f"namespace {name!r} has {count} non-terminal allocations"


async def _variables(tx: WriteTx, name: str) -> str | None:
    if not await any_in_namespace(tx.conn, name):
        return None
    return (
        f"namespace {name!r} contains at least one variable. "
        "All variables in namespace must be deleted before it can be deleted"
    )


HOLDERS: list[Holder] = [_live_jobs, _live_allocs, _variables]


async def delete_namespaces(tx: WriteTx, names: Sequence[str]) -> None:
    """Delete each namespace; refused (nothing deleted) for `default`, one
    that does not exist, or one something still lives in."""
    if not names:
        raise InvalidArgument("names", "must specify at least one namespace to delete")
    validate.at_most(len(names), MAX_BATCH, "names", "names")
    found: list[pb.Namespace] = []
    for i, name in enumerate(names):
        if name == DEFAULT_NAMESPACE:
            raise InvalidArgument(f"names[{i}]", "the default namespace cannot be deleted")
        if namespaces.name_problem(name) is not None:
            raise NotFound(f"namespace {name!r} not found")
        ns = await tx.get_namespace(name)
        if ns is None:
            raise NotFound(f"namespace {name!r} not found")
        for holder in HOLDERS:
            why = await holder(tx, name)
            if why is not None:
                raise FailedPrecondition(why)
        found.append(ns)
    for ns in found:
        tx.delete_namespace(ns)
