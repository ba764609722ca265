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
from corral.domain.structs import DEFAULT_NAMESPACE, INDEX_FIELDS, copy_msg, same_except
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.db.database import WriteTx
from services.state.variables import any_in_namespace

MAX_BATCH = 100


def validate_namespaces(items: Sequence[pb.Namespace]) -> None:
    """Each namespace well formed and named once (before any transaction)."""
    if not items:
        raise InvalidArgument("namespaces", "must specify at least one namespace")
    validate.at_most(len(items), MAX_BATCH, "namespaces", "namespaces")
    seen: set[str] = set()
    for i, ns in enumerate(items):
        where = f"namespaces[{i}]"
        validate.no_nul(ns, where)
        found = namespaces.config_problem(ns)
        if found is not None:
            field, problem = found
            raise InvalidArgument(f"{where}.{field}", f"invalid namespace {ns.name!r}: {problem}")
        validate.labels(ns.meta, f"{where}.meta")
        if ns.name in seen:
            raise InvalidArgument(f"{where}.name", f"{ns.name!r} is given twice")
        seen.add(ns.name)


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
    for given in items:
        ns = copy_msg(given)
        current = await tx.get_namespace(ns.name)
        ns.create_index = current.create_index if current is not None else 0
        ns.modify_index = 0
        if current is not None and same_except(current, ns, INDEX_FIELDS):
            continue
        tx.put_namespace(ns)


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
