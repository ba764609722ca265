"""The topology page's answer (services/gateway/ui/topology.py): nodes
grouped by datacenter and class, what each offers and what its live
allocations hold, as the scheduler counts them; and the node list stub's
resources (Nomad's /v1/nodes?resources=true) it is built from."""

from __future__ import annotations

from corral.domain.structs import ClientStatus
from corral.testing import mock
from corral.v1 import node_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping import nodes as node_map
from services.gateway.ui.topology import ALLOC_FIELDS, topology
from services.state import stubs


class _NoAllocs:
    def allocs_by_node(self, node_id: str) -> list[pb.Allocation]:
        return []


def stub(n: pb.Node, *, resources: bool = True) -> node_pb2.NodeListStub:
    return stubs.node(_NoAllocs(), n, resources=resources)  # type: ignore[arg-type]


def test_the_list_stub_carries_resources_only_when_asked() -> None:
    n = mock.node(cpu=4000, memory_mb=8192)
    bare = node_map.stub(stub(n, resources=False))
    assert bare["NodeResources"] is None and bare["ReservedResources"] is None
    full = node_map.stub(stub(n))
    assert full["NodeResources"]["Cpu"]["CpuShares"] == 4000
    assert full["NodeResources"]["Memory"]["MemoryMB"] == 8192
    assert full["ReservedResources"]["Cpu"]["CpuShares"] == 100
    assert full["ReservedResources"]["Memory"]["MemoryMB"] == 256


def test_nodes_grouped_by_datacenter_and_class_with_their_live_allocations() -> None:
    a1 = mock.node(datacenter="dc2", node_class="gpu")
    a1.name = "b"
    a2 = mock.node(datacenter="dc2", node_class="gpu")
    a2.name = "a"
    other = mock.node(datacenter="dc1")
    job = mock.job(job_id="web", cpu=500, memory_mb=256)
    running = mock.alloc(job, a1)
    pending = mock.alloc(job, a1, index=1, client_status=ClientStatus.PENDING)
    done = mock.alloc(job, a1, index=2, client_status=ClientStatus.COMPLETE)
    cores = mock.alloc(job, other, index=3)
    cores.resources.cores = 1  # a reserved core counts as the node's MHz per core
    unplaced = mock.alloc(job, other, index=4)
    unplaced.node_id = ""

    out = topology([stub(n) for n in (a1, a2, other)], [running, pending, done, cores, unplaced])

    assert [(g["Datacenter"], g["NodeClass"]) for g in out["Groups"]] == [
        ("dc1", ""),
        ("dc2", "gpu"),
    ]
    gpu = out["Groups"][1]["Nodes"]
    assert [n["Name"] for n in gpu] == ["a", "b"], "sorted by name"
    busy = gpu[1]
    assert busy["ID"] == a1.id
    # what the node offers: total minus reserved (corral.domain.fit)
    assert busy["CPU"] == 4000 - 100 and busy["MemoryMB"] == 8192 - 256
    # the finished allocation holds nothing and is not drawn
    assert {row[0] for row in busy["Allocs"]} == {running.id, pending.id}
    assert busy["CPUAllocated"] == 1000 and busy["MemoryAllocated"] == 512
    assert out["AllocFields"] == list(ALLOC_FIELDS)
    row = dict(zip(ALLOC_FIELDS, busy["Allocs"][0], strict=True))
    assert row["JobID"] == "web" and row["CPU"] == 500 and row["MemoryMB"] == 256
    # 4000 MHz over 4 cores: the reserved core adds 1000 MHz
    dc1 = out["Groups"][0]["Nodes"][0]
    assert dc1["CPUAllocated"] == 500 + 1000
    assert out["Totals"] == {
        "Nodes": 3,
        "Allocs": 3,
        "CPU": 3 * 3900,
        "CPUAllocated": 1000 + 1500,
        "MemoryMB": 3 * (8192 - 256),
        "MemoryAllocated": 3 * 256,
    }
