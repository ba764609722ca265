"""Device requests against a node's devices (Nomad's `DeviceChecker`):
`vendor/type/name` matching and per-request counts."""

from __future__ import annotations

from collections.abc import Sequence

from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.constraints import (
    MatchCache,
    check_constraint,
    resolve_device_target,
)


def split_device_name(name: str) -> tuple[str, str, str]:
    """ "type", "vendor/type" or "vendor/type/name" as (vendor, type, name)."""
    parts = name.split("/", 2)
    if len(parts) == 1:
        return "", parts[0], ""
    if len(parts) == 2:
        return parts[0], parts[1], ""
    return parts[0], parts[1], parts[2]


def device_matches(req: pb.RequestedDevice, dev: pb.NodeDevice, cache: MatchCache) -> bool:
    """The node device group is what `req` names and meets its constraints."""
    vendor, dtype, name = split_device_name(req.name)
    if dtype != dev.type or (vendor and vendor != dev.vendor) or (name and name != dev.name):
        return False
    for c in req.constraints:
        lval, lok = resolve_device_target(c.l_target, dev)
        rval, rok = resolve_device_target(c.r_target, dev)
        if not check_constraint(c.operand, lval, rval, lok, rok, cache):
            return False
    return True


def has_devices(node: pb.Node, requests: Sequence[pb.RequestedDevice], cache: MatchCache) -> bool:
    """Every request can be met by one device group of the node (capacity
    only; what is already in use is the ranker's concern)."""
    if not requests:
        return True
    available = {i: len(d.instance_ids) for i, d in enumerate(node.node_resources.devices)}
    for req in requests:
        want = req.count or 1
        for i, dev in enumerate(node.node_resources.devices):
            if available[i] >= want and device_matches(req, dev, cache):
                available[i] -= want
                break
        else:
            return False
    return True
