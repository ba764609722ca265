"""corral.domain.fit: AllocsFit, port parsing, the network index and device accounting
(Nomad's funcs_test.go TestAllocsFit*, network_test.go, devices_test.go)."""

from __future__ import annotations

import random

import pytest

from corral.domain import fit
from corral.domain.errors import InvalidArgument
from corral.domain.structs import ClientStatus, DesiredStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb


def _node(**kw: object) -> pb.Node:
    n = mock.node(cpu=2000, memory_mb=2048, disk_mb=10000)
    n.reserved_resources.CopyFrom(
        pb.NodeReservedResources(cpu=0, memory_mb=0, disk_mb=0, reserved_host_ports="")
    )
    for k, v in kw.items():
        setattr(n.node_resources, k, v)
    return n


def _alloc(
    node: pb.Node,
    *,
    cpu: int = 1000,
    memory_mb: int = 1024,
    disk_mb: int = 0,
    cores: int = 0,
    ports: tuple[int, ...] = (),
    dyn: tuple[int, ...] = (),
    client_status: str = ClientStatus.RUNNING,
) -> pb.Allocation:
    job = mock.job()
    a = mock.alloc(job, node, client_status=client_status)
    a.resources.CopyFrom(pb.Resources(cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, cores=cores))
    if ports or dyn:
        net = a.resources.networks.add()
        for p in ports:
            net.reserved_ports.add(label=f"p{p}", value=p)
        for p in dyn:
            net.dynamic_ports.add(label=f"d{p}", value=p)
    return a


# --------------------------------------------------------------------------- capacity


def test_node_capacity_subtracts_reserved() -> None:
    n = mock.node(cpu=4000, memory_mb=8192, disk_mb=100 * 1024)
    cap = fit.node_capacity(n)
    assert (cap.cpu, cap.memory_mb, cap.disk_mb) == (3900, 8192 - 256, 100 * 1024 - 4096)
    assert cap.cores == 4
    assert cap.mhz_per_core == 1000


def test_allocs_fit_exact_capacity_fits_and_reports_usage() -> None:
    n = _node()
    res = fit.allocs_fit(n, [_alloc(n, cpu=1000), _alloc(n, cpu=1000)])
    assert res.fits and res.dimension == ""
    assert res.used.cpu == 2000 and res.used.memory_mb == 2048


@pytest.mark.parametrize(
    ("kwargs", "dimension"),
    [
        ({"cpu": 2001, "memory_mb": 1}, "cpu"),
        ({"cpu": 1, "memory_mb": 2049}, "memory"),
        ({"cpu": 1, "memory_mb": 1, "disk_mb": 10001}, "disk"),
        ({"cpu": 0, "memory_mb": 1, "cores": 5}, "cores"),
        ({"cpu": 1000, "memory_mb": 1, "cores": 3}, "cpu"),
    ],
)
def test_allocs_fit_reports_first_exhausted_dimension(
    kwargs: dict[str, int], dimension: str
) -> None:
    n = _node()
    res = fit.allocs_fit(n, [_alloc(n, **kwargs)])  # type: ignore[arg-type]
    assert not res.fits
    assert res.dimension == dimension


def test_cores_are_counted_as_cores_and_cpu() -> None:
    n = _node(total_cores=4)  # 500 MHz per core
    a = _alloc(n, cpu=0, memory_mb=1, cores=2)
    res = fit.allocs_fit(n, [a])
    assert res.fits and res.used.cpu == 1000 and res.used.cores == 2
    b = _alloc(n, cpu=0, memory_mb=1, cores=3)
    # 5 cores asked of 4: reported as cores, checked before cpu
    assert fit.allocs_fit(n, [a, b]).dimension == "cores"
    n.reserved_resources.cores = 2
    assert fit.allocs_fit(n, [a]).fits
    assert fit.allocs_fit(n, [a, _alloc(n, cpu=0, memory_mb=1, cores=1)]).dimension == "cores"


def test_reserved_resources_shrink_capacity() -> None:
    n = _node()
    n.reserved_resources.cpu = 1000
    assert fit.allocs_fit(n, [_alloc(n, cpu=1000)]).fits
    assert fit.allocs_fit(n, [_alloc(n, cpu=1001)]).dimension == "cpu"


def test_client_terminal_allocs_hold_nothing_but_server_terminal_do() -> None:
    n = _node()
    big = _alloc(n, cpu=2000)
    for status in (ClientStatus.COMPLETE, ClientStatus.FAILED, ClientStatus.LOST):
        done = _alloc(n, cpu=2000, client_status=status)
        assert fit.allocs_fit(n, [big, done]).fits, status
    stopping = _alloc(n, cpu=2000)
    stopping.desired_status = DesiredStatus.STOP  # client still running it
    assert fit.allocs_fit(n, [big, stopping]).dimension == "cpu"


def test_max_allocs() -> None:
    n = _node(max_allocs=2)
    small = [_alloc(n, cpu=1, memory_mb=1) for _ in range(3)]
    assert fit.allocs_fit(n, small[:2]).fits
    res = fit.allocs_fit(n, small)
    assert not res.fits and res.dimension == "max allocation exceeded"
    small[2].client_status = ClientStatus.COMPLETE
    assert fit.allocs_fit(n, small).fits


def test_port_collision_with_node_reserved_ports() -> None:
    n = _node()
    n.reserved_resources.reserved_host_ports = "22,80,8000-8100"
    res = fit.allocs_fit(n, [_alloc(n, cpu=1, memory_mb=1, ports=(8050,))])
    assert not res.fits and res.dimension.startswith("reserved alloc port collision")
    assert fit.allocs_fit(n, [_alloc(n, cpu=1, memory_mb=1, ports=(8101,))]).fits


def test_port_collision_between_allocs_static_and_dynamic() -> None:
    n = _node()
    a = _alloc(n, cpu=1, memory_mb=1, ports=(8080,))
    b = _alloc(n, cpu=1, memory_mb=1, dyn=(8080,))
    res = fit.allocs_fit(n, [a, b])
    assert not res.fits and "8080" in res.dimension
    b.client_status = ClientStatus.FAILED
    assert fit.allocs_fit(n, [a, b]).fits


def test_malformed_node_reserved_ports_reject_node() -> None:
    n = _node()
    n.reserved_resources.reserved_host_ports = "80-20"
    res = fit.allocs_fit(n, [])
    assert not res.fits and res.dimension.startswith("reserved node port collision")


def test_device_oversubscription() -> None:
    n = _node()
    n.node_resources.devices.add(
        vendor="nvidia", type="gpu", name="1080ti", instance_ids=["g0", "g1"]
    )
    a = _alloc(n, cpu=1, memory_mb=1)
    a.resources.allocated_devices.add(vendor="nvidia", type="gpu", name="1080ti", device_ids=["g0"])
    b = _alloc(n, cpu=1, memory_mb=1)
    b.resources.allocated_devices.add(vendor="nvidia", type="gpu", name="1080ti", device_ids=["g0"])
    res = fit.allocs_fit(n, [a, b])
    assert not res.fits and res.dimension == "device oversubscribed"
    assert fit.allocs_fit(n, [a, b], check_devices=False).fits
    b.resources.allocated_devices[0].device_ids[:] = ["g1"]
    assert fit.allocs_fit(n, [a, b]).fits


# --------------------------------------------------------------------------- port specs


def test_parse_port_spec() -> None:
    assert fit.parse_port_spec("") == []
    assert fit.parse_port_spec("22, 80,8000-8003") == [22, 80, 8000, 8001, 8002, 8003]


@pytest.mark.parametrize("spec", ["0", "65536", "80-20", "1-2-3", "a", "22,,80", "70000-70001"])
def test_parse_port_spec_rejects(spec: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        fit.parse_port_spec(spec, "node.reserved_resources.reserved_host_ports")
    assert e.value.field == "node.reserved_resources.reserved_host_ports"


# --------------------------------------------------------------------------- network index


def test_network_index_assigns_static_and_dynamic_ports_deterministically() -> None:
    n = _node(min_dynamic_port=20000, max_dynamic_port=20010)
    ask = pb.NetworkResource(
        reserved_ports=[pb.Port(label="http", value=8080)],
        dynamic_ports=[pb.Port(label="a", to=-1), pb.Port(label="b", to=9000)],
    )
    idx1, reason = fit.NetworkIndex.for_node(n)
    assert reason == ""
    out1 = idx1.assign(ask, random.Random(7))
    idx2, _ = fit.NetworkIndex.for_node(n)
    out2 = idx2.assign(ask, random.Random(7))
    assert out1 == out2
    assert out1.reserved_ports[0].value == 8080
    dyn = [p.value for p in out1.dynamic_ports]
    assert len(set(dyn)) == 2 and all(20000 <= v <= 20010 for v in dyn)
    assert out1.dynamic_ports[0].to == out1.dynamic_ports[0].value
    assert out1.dynamic_ports[1].to == 9000
    assert {8080, *dyn} <= idx1.used


def test_network_index_static_collision_leaves_index_unchanged() -> None:
    n = _node()
    n.reserved_resources.reserved_host_ports = "22"
    idx, _ = fit.NetworkIndex.for_node(n)
    before = set(idx.used)
    ask = pb.NetworkResource(
        dynamic_ports=[pb.Port(label="a")], reserved_ports=[pb.Port(label="ssh", value=22)]
    )
    with pytest.raises(fit.PortAssignmentError, match="22"):
        idx.assign(ask, random.Random(1))
    assert idx.used == before


def test_network_index_dynamic_range_exhaustion_and_full_scan() -> None:
    n = _node(min_dynamic_port=30000, max_dynamic_port=30002)
    idx, _ = fit.NetworkIndex.for_node(n, [_alloc(n, cpu=1, memory_mb=1, dyn=(30000, 30002))])
    out = idx.assign(pb.NetworkResource(dynamic_ports=[pb.Port(label="x")]), random.Random(3))
    assert out.dynamic_ports[0].value == 30001  # the only free port, found by scan if needed
    with pytest.raises(fit.PortAssignmentError):
        idx.assign(pb.NetworkResource(dynamic_ports=[pb.Port(label="y")]), random.Random(3))


def test_network_index_reports_collisions_among_existing_allocs() -> None:
    n = _node()
    a = _alloc(n, cpu=1, memory_mb=1, ports=(5000,))
    b = _alloc(n, cpu=1, memory_mb=1, ports=(5000,))
    _, reason = fit.NetworkIndex.for_node(n, [a, b])
    assert reason.startswith("reserved alloc port collision")
