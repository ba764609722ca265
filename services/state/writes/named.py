"""The write rules namespaces and node pools share: both are cluster-wide
objects known by name, upserted in batches (Nomad's UpsertNamespaces and
UpsertNodePools), each checked before any transaction and written only when
it changed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from corral.domain.errors import InvalidArgument
from corral.domain.structs import INDEX_FIELDS, copy_msg, same_except
from corral.v1 import structs_pb2 as pb
from services.state import validate

#: most objects one upsert or delete names
MAX_BATCH = 100

Named = TypeVar("Named", pb.Namespace, pb.NodePool)


def validate_batch(
    items: Sequence[Named],
    field: str,
    noun: str,
    config_problem: Callable[[Named], tuple[str, str] | None],
    refusal: Callable[[Named], str | None] = lambda _: None,
) -> None:
    """Each object of `field` (a `noun` each) well formed, not refused and
    named once. `config_problem` answers (field, problem) of a bad object;
    `refusal` why a well-formed one may not be written."""
    if not items:
        raise InvalidArgument(field, f"must specify at least one {noun}")
    validate.at_most(len(items), MAX_BATCH, field, f"{noun}s")
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        validate.no_nul(item, where)
        found = config_problem(item)
        if found is not None:
            bad, problem = found
            raise InvalidArgument(f"{where}.{bad}", f"invalid {noun} {item.name!r}: {problem}")
        refused = refusal(item)
        if refused is not None:
            raise InvalidArgument(f"{where}.name", refused)
        validate.labels(item.meta, f"{where}.meta")
        if item.name in seen:
            raise InvalidArgument(f"{where}.name", f"{item.name!r} is given twice")
        seen.add(item.name)


async def upsert_changed(
    items: Sequence[Named],
    get: Callable[[str], Awaitable[Named | None]],
    put: Callable[[Named], None],
) -> None:
    """Write each object that differs from the stored one (indexes aside),
    keeping its create index; an unchanged one is not written (its modify
    index stays)."""
    for given in items:
        item = copy_msg(given)
        current = await get(item.name)
        item.create_index = current.create_index if current is not None else 0
        item.modify_index = 0
        if current is not None and same_except(current, item, INDEX_FIELDS):
            continue
        put(item)
