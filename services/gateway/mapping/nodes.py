"""Client nodes as Nomad's api.Node and api.NodeListStub (the node's secret
and its hash never leave the gateway), node pools as api.NodePool (its
request body is read by `corral.domain.object_specs`)."""

from __future__ import annotations

from typing import Any

from corral.v1 import node_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.absent import fill, fill_all
from services.gateway.mapping.common import ZERO_TIME, rfc3339, to_nomad


def _attribute(value: str) -> dict[str, Any]:
    """A device attribute as Nomad's psstructs.Attribute: Corral keeps
    attributes as text, so a number is shown as one, anything else as a
    string."""
    out: dict[str, Any] = {"Float": None, "Int": None, "String": None, "Bool": None, "Unit": ""}
    try:
        out["Int"] = int(value)
    except ValueError:
        try:
            out["Float"] = float(value)
        except ValueError:
            if value in ("true", "false"):
                out["Bool"] = value == "true"
            else:
                out["String"] = value
    return out


def _device(d: pb.NodeDevice) -> dict[str, Any]:
    """api.NodeDeviceResource (every instance healthy: Corral's devices are
    fingerprinted once, at registration)."""
    return {
        "Vendor": d.vendor,
        "Type": d.type,
        "Name": d.name,
        "Instances": [
            {"ID": i, "Healthy": True, "HealthDescription": "", "Locality": None}
            for i in d.instance_ids
        ]
        or None,
        "Attributes": {k: _attribute(v) for k, v in d.attributes.items()} or None,
    }


def _drain_strategy(msg: pb.Node) -> dict[str, Any] | None:
    if not msg.HasField("drain_strategy"):
        return None
    ds = msg.drain_strategy
    return {
        "Deadline": ds.deadline,
        "IgnoreSystemJobs": ds.ignore_system_jobs,
        "ForceDeadline": rfc3339(ds.force_deadline),
        "StartedAt": rfc3339(ds.started_at),
    }


def _resources(msg: pb.Node | node_pb2.NodeListStub) -> dict[str, Any]:
    r = msg.node_resources
    return {
        "Cpu": {"CpuShares": r.cpu, "TotalCpuCores": r.total_cores, "ReservableCpuCores": None},
        "Memory": {"MemoryMB": r.memory_mb},
        "Disk": {"DiskMB": r.disk_mb},
        "Networks": None,
        "Devices": [_device(d) for d in r.devices] or None,
        "MinDynamicPort": r.min_dynamic_port,
        "MaxDynamicPort": r.max_dynamic_port,
    }


def _reserved(msg: pb.Node | node_pb2.NodeListStub) -> dict[str, Any]:
    r = msg.reserved_resources
    return {
        "Cpu": {"CpuShares": r.cpu, "ReservedCpuCores": None},
        "Memory": {"MemoryMB": r.memory_mb},
        "Disk": {"DiskMB": r.disk_mb},
        "Networks": {"ReservedHostPorts": r.reserved_host_ports},
    }


def node(msg: pb.Node) -> dict[str, Any]:
    """api.Node."""
    out = to_nomad(
        msg,
        {
            "events": lambda evs: [to_nomad(e, {"timestamp": rfc3339}) for e in evs] or None,
        },
    )
    for secret in ("SecretID", "SecretHash"):
        out.pop(secret, None)
    out["DrainStrategy"] = _drain_strategy(msg)
    out["NodeResources"] = _resources(msg)
    out["ReservedResources"] = _reserved(msg)
    out["SchedulingEligibility"] = msg.scheduling_eligibility
    out["StatusUpdatedAt"] = msg.status_updated_at // 1_000_000_000
    out["HTTPAddr"] = msg.http_addr
    out["TLSEnabled"] = False
    out["NodeMaxAllocs"] = msg.node_resources.max_allocs
    fill_all("DriverInfo", out["Drivers"])
    return fill("Node", out) or out


def stub(msg: node_pb2.NodeListStub) -> dict[str, Any]:
    """api.NodeListStub: NodeResources and ReservedResources with Nomad's
    `?resources=true` (the state fills them then), no attributes."""
    return {
        "Address": msg.address.rpartition(":")[0] if ":" in msg.address else msg.address,
        "ID": msg.id,
        "Attributes": None,
        "Datacenter": msg.datacenter,
        "Name": msg.name,
        "NodeClass": msg.node_class,
        "NodePool": msg.node_pool,
        "Version": "",
        "Drain": msg.drain,
        "SchedulingEligibility": msg.scheduling_eligibility,
        "Status": msg.status,
        "StatusDescription": "",
        "Drivers": {
            name: {
                "Detected": d.detected,
                "Healthy": d.healthy,
                "HealthDescription": "",
                "Attributes": None,
                "UpdateTime": ZERO_TIME,
            }
            for name, d in msg.drivers.items()
        }
        or None,
        "NodeResources": _resources(msg) if msg.HasField("node_resources") else None,
        "ReservedResources": _reserved(msg) if msg.HasField("reserved_resources") else None,
        "LastDrain": None,
        "CreateIndex": msg.create_index,
        "ModifyIndex": msg.modify_index,
    }


def node_pool(msg: pb.NodePool) -> dict[str, Any]:
    """api.NodePool."""
    sc = msg.scheduler_config if msg.HasField("scheduler_config") else None
    out = {
        "Name": msg.name,
        "Description": msg.description,
        "Meta": dict(msg.meta) or None,
        "SchedulerConfiguration": {
            "SchedulerAlgorithm": sc.scheduler_algorithm,
            "MemoryOversubscriptionEnabled": sc.memory_oversubscription_enabled
            if sc.HasField("memory_oversubscription_enabled")
            else None,
        }
        if sc is not None
        else None,
        "CreateIndex": msg.create_index,
        "ModifyIndex": msg.modify_index,
    }
    # Corral has no node identities: NodeIdentityTTL is Nomad's unset ""
    return fill("NodePool", out) or out
