"""Service registration writes (nomad/state/state_store_service_registration.go):
a client registers and deregisters the instances of its own allocs; an
operator deletes one by hand. The state itself removes the instances of
allocs that become client-terminal and of nodes that go down, in the write
that does it (`WriteTx._drop_gone_services`).

A client's writes are proven by its node secret and decided on the rows
read inside the transaction: the alloc must be stored on the calling node
(as Nomad's AuthorizeSameNodeServiceRegistrations), and the namespace, job
and datacenter come from the stored alloc and node, never from the request.
An instance of an alloc that is gone or already client-terminal is skipped:
a registration arriving after its alloc's last update would otherwise stay
in the catalog for good."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from corral.domain import services, structs
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from corral.domain.structs import NodeStatus, copy_msg
from corral.v1 import structs_pb2 as pb
from services.state import node_identity, validate
from services.state.db.database import WriteTx

#: instances one call may carry (a node runs at most a few hundred allocs
#: with a handful of services each)
MAX_REGISTRATIONS = 10_000
MAX_ID_LEN = 1024
MAX_TAGS = 256
MAX_TAG_LEN = 1024
MAX_ADDRESS_LEN = 256


def validate_registrations(regs: Sequence[pb.ServiceRegistration]) -> None:
    """What a client may send, before anything is read."""
    validate.batch_size(len(regs), "registrations")
    validate.at_most(len(regs), MAX_REGISTRATIONS, "registrations", "registrations")
    for i, r in enumerate(regs):
        f = f"registrations[{i}]"
        validate.no_nul(r, f)
        validate_id(r.id, f"{f}.id")
        validate.require_id(r.alloc_id, f"{f}.alloc_id")
        if not r.id.startswith(f"{services.REGISTRATION_ID_PREFIX}{r.alloc_id}-"):
            raise InvalidArgument(
                f"{f}.id",
                f"must start with {services.REGISTRATION_ID_PREFIX}<alloc id>- "
                "(an instance belongs to its alloc)",
            )
        if not r.service_name:
            raise InvalidArgument(f"{f}.service_name", "is required")
        validate.name_length(r.service_name, f"{f}.service_name")
        if len(r.address) > MAX_ADDRESS_LEN:
            raise InvalidArgument(f"{f}.address", f"is longer than {MAX_ADDRESS_LEN} characters")
        if _is_any(r.address):
            # ServiceRegistration.Validate: nobody can reach "any address"
            raise InvalidArgument(f"{f}.address", f"{r.address!r} is not a reachable address")
        if not 0 <= r.port <= 65535:
            raise InvalidArgument(f"{f}.port", "must be 0..65535")
        validate.at_most(len(r.tags), MAX_TAGS, f"{f}.tags", "tags")
        for j, tag in enumerate(r.tags):
            if len(tag) > MAX_TAG_LEN:
                raise InvalidArgument(f"{f}.tags[{j}]", f"is longer than {MAX_TAG_LEN} characters")
        validate.labels(r.meta, f"{f}.meta")


def validate_id(value: str, field: str) -> None:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_ID_LEN:
        raise InvalidArgument(field, f"is longer than {MAX_ID_LEN} characters")


def _is_any(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_unspecified
    except ValueError:
        return False


async def _node(tx: WriteTx, node_id: str, secret_id: str) -> pb.Node:
    node = await tx.get_node(node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found")
    node_identity.check(node, secret_id)
    return node


def _same(a: pb.ServiceRegistration, b: pb.ServiceRegistration) -> bool:
    """Equal but for the indexes (ServiceRegistration.Equal, tags as sets)."""
    return (
        a.service_name == b.service_name
        and a.node_id == b.node_id
        and a.datacenter == b.datacenter
        and a.job_id == b.job_id
        and a.alloc_id == b.alloc_id
        and a.namespace == b.namespace
        and a.address == b.address
        and a.port == b.port
        and set(a.tags) == set(b.tags)
        and dict(a.meta) == dict(b.meta)
    )


async def upsert(
    tx: WriteTx, node_id: str, secret_id: str, regs: Sequence[pb.ServiceRegistration]
) -> int:
    """Register (or update) instances of the node's allocs; returns how many
    were written (an unchanged instance is not rewritten, as Nomad)."""
    node = await _node(tx, node_id, secret_id)
    if node.status == NodeStatus.DOWN:
        raise FailedPrecondition(f"node {node_id} is down: its services are not registered")
    allocs = await tx.get_allocs(sorted({r.alloc_id for r in regs}))
    chosen: list[pb.ServiceRegistration] = []
    for i, r in enumerate(regs):
        alloc = allocs.get(r.alloc_id)
        if alloc is None or structs.alloc_client_terminal(alloc):
            continue
        if alloc.node_id != node_id:
            raise PermissionDenied(
                f"registrations[{i}]: alloc {r.alloc_id} is not on node {node_id}; "
                "a node may register only its own allocs' services"
            )
        reg = copy_msg(r)
        reg.node_id = node_id
        reg.namespace = alloc.namespace or structs.DEFAULT_NAMESPACE
        reg.job_id = alloc.job_id
        reg.datacenter = node.datacenter
        reg.create_index = 0
        reg.modify_index = 0
        chosen.append(reg)
    written = 0
    for reg in chosen:
        existing = await tx.get_service_registration(reg.namespace, reg.id)
        if existing is not None:
            if _same(existing, reg):
                continue
            reg.create_index = existing.create_index
        tx.put_service_registration(reg)
        written += 1
    return written


async def deregister(
    tx: WriteTx, node_id: str, secret_id: str, namespace: str, ids: Sequence[str]
) -> int:
    """Remove instances the node registered; ids not (or no longer) in the
    catalog are skipped. Returns how many were removed."""
    await _node(tx, node_id, secret_id)
    found: list[pb.ServiceRegistration] = []
    for reg_id in dict.fromkeys(ids):
        existing = await tx.get_service_registration(namespace, reg_id)
        if existing is None:
            continue
        if existing.node_id != node_id:
            raise PermissionDenied(
                f"service registration {reg_id!r} is not on node {node_id}; "
                "a node may deregister only its own services"
            )
        found.append(existing)
    for reg in found:
        tx.delete_service_registration(reg)
    return len(found)


async def delete_by_id(tx: WriteTx, namespace: str, reg_id: str) -> pb.ServiceRegistration:
    """An operator removes one instance (`corral service delete`)."""
    existing = await tx.get_service_registration(namespace, reg_id)
    if existing is None:
        raise NotFound(f"service registration {reg_id!r} not found in namespace {namespace!r}")
    tx.delete_service_registration(existing)
    return existing
