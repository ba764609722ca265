"""The service catalog as Nomad's api: ServiceRegistration,
ServiceRegistrationListStub and the client's CheckQueryResult."""

from __future__ import annotations

from typing import Any

from corral.v1 import service_pb2
from corral.v1 import structs_pb2 as pb


def registration(r: pb.ServiceRegistration) -> dict[str, Any]:
    """api.ServiceRegistration (`Meta` is Corral's: the service's meta)."""
    return {
        "ID": r.id,
        "ServiceName": r.service_name,
        "Namespace": r.namespace,
        "NodeID": r.node_id,
        "Datacenter": r.datacenter,
        "JobID": r.job_id,
        "AllocID": r.alloc_id,
        "Tags": list(r.tags),
        "Address": r.address,
        "Port": r.port,
        "Meta": dict(r.meta) or None,
        "CreateIndex": r.create_index,
        "ModifyIndex": r.modify_index,
    }


def list_stub(ns: service_pb2.ServiceNamespaceStub) -> dict[str, Any]:
    """api.ServiceRegistrationListStub: a namespace and its services."""
    return {
        "Namespace": ns.namespace,
        "Services": [{"ServiceName": s.service_name, "Tags": list(s.tags)} for s in ns.services],
    }


def check_result(r: pb.CheckResult) -> dict[str, Any]:
    """api.AllocCheckStatus (Nomad's server omits a zero StatusCode and an
    empty Task; the api struct has both, so both are always here)."""
    return {
        "ID": r.id,
        "Mode": r.mode,
        "Status": r.status,
        "StatusCode": r.status_code,
        "Output": r.output,
        "Timestamp": r.timestamp,
        "Group": r.group,
        "Task": r.task,
        "Service": r.service,
        "Check": r.check,
    }


def check_header(header: dict[str, Any] | None) -> dict[str, list[str]] | None:
    """A check's Header as Nomad's map[string][]string (ours wraps each
    list in a message)."""
    if not header:
        return None
    return {k: list((v or {}).get("Values") or []) for k, v in header.items()}
