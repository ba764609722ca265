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
    """structs.CheckQueryResult (StatusCode and Task only when set)."""
    out: dict[str, Any] = {
        "ID": r.id,
        "Mode": r.mode,
        "Status": r.status,
        "Output": r.output,
        "Timestamp": r.timestamp,
        "Group": r.group,
        "Service": r.service,
        "Check": r.check,
    }
    if r.status_code:
        out["StatusCode"] = r.status_code
    if r.task:
        out["Task"] = r.task
    return out


def check_header(header: dict[str, Any] | None) -> dict[str, list[str]] | None:
    """A check's Header as Nomad's map[string][]string (ours wraps each
    list in a message)."""
    if not header:
        return None
    return {k: list((v or {}).get("Values") or []) for k, v in header.items()}
