"""The topology page's data: every node the token may read with its
allocated CPU and memory and the allocations on it, grouped by datacenter
and node class, in one compact answer.

Why an answer of its own rather than /v1/nodes and /v1/allocations read by
the browser (as Nomad's UI does): at 5,000 nodes and 10,000 allocations
those two lists are tens of megabytes of Nomad JSON the browser would parse
to draw a few numbers per node. Here each node is a handful of fields and
each allocation a short row (`ALLOC_FIELDS`), which keeps the page's answer
well under a second. What is shown is exactly what the token could read
through /v1: the nodes need `node:read` (the state refuses the list
without it) and the allocations are those of the namespaces the token may
`read-job` in (the state's `namespace=*` listing filters them)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corral.domain import fit
from corral.domain.structs import ClientStatus
from corral.v1 import node_pb2
from corral.v1 import structs_pb2 as pb

#: the columns of each allocation row, in order (the page reads them by position)
ALLOC_FIELDS = ("ID", "Namespace", "JobID", "TaskGroup", "ClientStatus", "CPU", "MemoryMB")


def _alloc_row(alloc: pb.Allocation, mhz_per_core: int) -> list[Any]:
    res = alloc.resources
    return [
        alloc.id,
        alloc.namespace,
        alloc.job_id,
        alloc.task_group,
        alloc.client_status,
        res.cpu + res.cores * mhz_per_core,
        res.memory_mb,
    ]


def capacity(n: node_pb2.NodeListStub) -> fit.Capacity:
    """What the node offers (the scheduler's reckoning, corral.domain.fit)
    from a list stub read with resources."""
    return fit.node_capacity(
        pb.Node(node_resources=n.node_resources, reserved_resources=n.reserved_resources)
    )


def topology(
    nodes: Iterable[node_pb2.NodeListStub], allocs: Iterable[pb.Allocation]
) -> dict[str, Any]:
    """Nodes grouped by datacenter then class (sorted), each with what it
    offers (total minus reserved, as the scheduler counts it:
    corral.domain.fit), what its live allocations hold, and those
    allocations. Allocations the client reports finished hold nothing and
    are left out, as the scheduler leaves them out."""
    by_node: dict[str, list[pb.Allocation]] = {}
    for a in allocs:
        if a.node_id and a.client_status not in ClientStatus.TERMINAL:
            by_node.setdefault(a.node_id, []).append(a)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    totals = {
        "Nodes": 0,
        "Allocs": 0,
        "CPU": 0,
        "CPUAllocated": 0,
        "MemoryMB": 0,
        "MemoryAllocated": 0,
    }
    for n in nodes:
        cap = capacity(n)
        mine = sorted(by_node.get(n.id, ()), key=lambda a: (a.job_id, a.id))
        used = fit.usage_of(mine, cap.mhz_per_core)
        groups.setdefault((n.datacenter, n.node_class), []).append(
            {
                "ID": n.id,
                "Name": n.name,
                "Status": n.status,
                "Eligibility": n.scheduling_eligibility,
                "Drain": n.drain,
                "CPU": max(cap.cpu, 0),
                "MemoryMB": max(cap.memory_mb, 0),
                "CPUAllocated": used.cpu,
                "MemoryAllocated": used.memory_mb,
                "Allocs": [_alloc_row(a, cap.mhz_per_core) for a in mine],
            }
        )
        totals["Nodes"] += 1
        totals["Allocs"] += len(mine)
        totals["CPU"] += max(cap.cpu, 0)
        totals["MemoryMB"] += max(cap.memory_mb, 0)
        totals["CPUAllocated"] += used.cpu
        totals["MemoryAllocated"] += used.memory_mb
    return {
        "AllocFields": list(ALLOC_FIELDS),
        "Totals": totals,
        "Groups": [
            {
                "Datacenter": dc,
                "NodeClass": cls,
                "Nodes": sorted(members, key=lambda m: (m["Name"], m["ID"])),
            }
            for (dc, cls), members in sorted(groups.items())
        ],
    }
