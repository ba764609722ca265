"""Namespaces as Nomad's api.Namespace (its request body is read by
`corral.domain.object_specs`, as the CLI's `namespace apply -json` is)."""

from __future__ import annotations

from typing import Any

from corral.domain.object_specs import namespace_from_nomad as namespace_from_body
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.absent import fill

__all__ = ["namespace", "namespace_from_body"]

# -- namespaces ----------------------------------------------------------------


def namespace(msg: pb.Namespace) -> dict[str, Any]:
    """api.Namespace."""
    caps = msg.capabilities if msg.HasField("capabilities") else None
    cfg = msg.node_pool_config if msg.HasField("node_pool_config") else None
    out = {
        "Name": msg.name,
        "Description": msg.description,
        "Quota": "",
        "Capabilities": {
            "EnabledTaskDrivers": list(caps.enabled_task_drivers) or None,
            "DisabledTaskDrivers": list(caps.disabled_task_drivers) or None,
            "EnabledNetworkModes": list(caps.enabled_network_modes) or None,
            "DisabledNetworkModes": list(caps.disabled_network_modes) or None,
        }
        if caps is not None
        else None,
        "NodePoolConfiguration": {
            "Default": cfg.default,
            "Allowed": list(cfg.allowed.values) if cfg.HasField("allowed") else None,
            "Denied": list(cfg.denied.values) if cfg.HasField("denied") else None,
        }
        if cfg is not None
        else None,
        "VaultConfiguration": None,
        "ConsulConfiguration": None,
        "Meta": dict(msg.meta) or None,
        "CreateIndex": msg.create_index,
        "ModifyIndex": msg.modify_index,
    }
    return fill("Namespace", out) or out
