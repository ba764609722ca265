"""Namespace and node pool specifications as Nomad writes them, read into
our messages: Nomad's JSON (`api.Namespace`, `api.NodePool`: the HTTP API's
bodies and `-json` spec files) and the HCL files of `namespace apply` and
`node pool apply`. What Corral has no counterpart for (quotas, Vault and
Consul cluster settings, extra identity claims, node identity TTLs) is
refused when it carries a value, never dropped. Problems are ValueErrors
naming the field."""

from __future__ import annotations

from typing import Any

import hcl2
from hcl2 import SerializationOptions
from lark.exceptions import LarkError

from corral.domain.nomad_json import (
    body_field,
    body_meta,
    body_object,
    body_string,
    body_strings,
    refuse_unsupported,
)
from corral.v1 import structs_pb2 as pb


def namespace_from_nomad(body: dict[str, Any]) -> pb.Namespace:
    """Nomad's api.Namespace JSON as our Namespace."""
    refuse_unsupported(body, "Quota", "namespace quotas")
    refuse_unsupported(body, "VaultConfiguration", "per-namespace Vault clusters")
    refuse_unsupported(body, "ConsulConfiguration", "per-namespace Consul clusters")
    for claims in ("RequiredExtraClaims", "OptionalExtraClaims"):
        refuse_unsupported(body, claims, "extra workload identity claims")
    out = pb.Namespace(
        name=body_string(body_field(body, "Name"), "Name"),
        description=body_string(body_field(body, "Description"), "Description"),
        meta=body_meta(body_field(body, "Meta")),
    )
    caps = body_object(body_field(body, "Capabilities"), "Capabilities")
    if caps is not None:
        out.capabilities.SetInParent()
        for key, target in (
            ("EnabledTaskDrivers", out.capabilities.enabled_task_drivers),
            ("DisabledTaskDrivers", out.capabilities.disabled_task_drivers),
            ("EnabledNetworkModes", out.capabilities.enabled_network_modes),
            ("DisabledNetworkModes", out.capabilities.disabled_network_modes),
        ):
            target.extend(body_strings(body_field(caps, key), key))
    cfg = body_object(body_field(body, "NodePoolConfiguration"), "NodePoolConfiguration")
    if cfg is not None:
        out.node_pool_config.SetInParent()
        out.node_pool_config.default = body_string(body_field(cfg, "Default"), "Default")
        for key, patterns in (
            ("Allowed", out.node_pool_config.allowed),
            ("Denied", out.node_pool_config.denied),
        ):
            value = body_field(cfg, key)
            if value is not None:
                patterns.SetInParent()
                patterns.values.extend(body_strings(value, key))
    return out


def node_pool_from_nomad(body: dict[str, Any]) -> pb.NodePool:
    """Nomad's api.NodePool JSON as our NodePool."""
    refuse_unsupported(body, "NodeIdentityTTL", "node identity TTLs")
    out = pb.NodePool(
        name=body_string(body_field(body, "Name"), "Name"),
        description=body_string(body_field(body, "Description"), "Description"),
        meta=body_meta(body_field(body, "Meta")),
    )
    sc = body_object(body_field(body, "SchedulerConfiguration"), "SchedulerConfiguration")
    if sc is not None:
        out.scheduler_config.SetInParent()
        out.scheduler_config.scheduler_algorithm = body_string(
            body_field(sc, "SchedulerAlgorithm"), "SchedulerAlgorithm"
        )
        oversub = body_field(sc, "MemoryOversubscriptionEnabled")
        if oversub is not None:
            if not isinstance(oversub, bool):
                raise ValueError("MemoryOversubscriptionEnabled must be true or false")
            out.scheduler_config.memory_oversubscription_enabled = oversub
    return out


# -- HCL spec files ----------------------------------------------------------------

_HCL = SerializationOptions(
    strip_string_quotes=True, explicit_blocks=True, with_comments=False, preserve_heredocs=False
)
_BLOCK = "__is_block__"
MAX_SPEC_CHARS = 256 * 1024


def _load_hcl(text: str) -> dict[str, Any]:
    if len(text) > MAX_SPEC_CHARS:
        raise ValueError(f"the specification is longer than {MAX_SPEC_CHARS} characters")
    try:
        data = hcl2.loads(text, serialization_options=_HCL)
    except LarkError as exc:
        line = getattr(exc, "line", None)
        where = f" at line {line}" if isinstance(line, int) and line > 0 else ""
        raise ValueError(f"not valid HCL{where}") from None
    except RecursionError:
        raise ValueError("not valid HCL: nested too deeply") from None
    except (TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ValueError(f"not valid HCL: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("not valid HCL")
    return data


def _is_blocks(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and _BLOCK in v for v in value)


def _one_block(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    """`key { ... }` (once) or `key = { ... }`, without the block marker."""
    if key not in data:
        return None
    value = data[key]
    if _is_blocks(value):
        if len(value) != 1:
            raise ValueError(f"{key}: may appear only once")
        value = value[0]
    if not isinstance(value, dict):
        raise ValueError(f"{key}: expected a block")
    return {k: v for k, v in value.items() if k != _BLOCK}


def _body(data: dict[str, Any], key: str, allowed: dict[str, str]) -> dict[str, Any] | None:
    """One block's arguments renamed to Nomad's JSON names by `allowed`."""
    body = _one_block(data, key)
    if body is None:
        return None
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: unknown field (expected {', '.join(allowed)})")
    return {allowed[k]: v for k, v in body.items()}


def _check_keys(data: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key != _BLOCK and key not in allowed:
            raise ValueError(f"{where}{key}: unknown field (expected {', '.join(allowed)})")


def namespace_from_hcl(text: str) -> pb.Namespace:
    """A `namespace apply` HCL specification (Nomad's namespace spec)."""
    data = _load_hcl(text)
    _check_keys(
        data,
        (
            "name",
            "description",
            "quota",
            "capabilities",
            "node_pool_config",
            "meta",
            "vault",
            "consul",
            "required_extra_claims",
            "optional_extra_claims",
        ),
        "",
    )
    body: dict[str, Any] = {
        "Name": data.get("name"),
        "Description": data.get("description"),
        "Quota": data.get("quota"),
        "Meta": _one_block(data, "meta"),
        "VaultConfiguration": _one_block(data, "vault"),
        "ConsulConfiguration": _one_block(data, "consul"),
        "RequiredExtraClaims": _one_block(data, "required_extra_claims"),
        "OptionalExtraClaims": _one_block(data, "optional_extra_claims"),
        "Capabilities": _body(
            data,
            "capabilities",
            {
                "enabled_task_drivers": "EnabledTaskDrivers",
                "disabled_task_drivers": "DisabledTaskDrivers",
                "enabled_network_modes": "EnabledNetworkModes",
                "disabled_network_modes": "DisabledNetworkModes",
            },
        ),
        "NodePoolConfiguration": _body(
            data,
            "node_pool_config",
            {"default": "Default", "allowed": "Allowed", "denied": "Denied"},
        ),
    }
    return namespace_from_nomad(body)


def node_pool_from_hcl(text: str) -> pb.NodePool:
    """A `node pool apply` HCL specification: one `node_pool "name" { ... }`."""
    data = _load_hcl(text)
    _check_keys(data, ("node_pool",), "")
    blocks = data.get("node_pool")
    if not isinstance(blocks, list) or len(blocks) != 1 or not isinstance(blocks[0], dict):
        raise ValueError('expected one node_pool "name" { ... } block')
    block = blocks[0]
    if _BLOCK in block or len(block) != 1:
        raise ValueError('node_pool: needs exactly one label: node_pool "name" { ... }')
    ((name, inner),) = block.items()
    if not isinstance(inner, dict) or _BLOCK not in inner:
        raise ValueError('node_pool: needs exactly one label: node_pool "name" { ... }')
    _check_keys(
        inner, ("description", "meta", "scheduler_config", "node_identity_ttl"), "node_pool."
    )
    body: dict[str, Any] = {
        "Name": name,
        "Description": inner.get("description"),
        "Meta": _one_block(inner, "meta"),
        "NodeIdentityTTL": inner.get("node_identity_ttl"),
        "SchedulerConfiguration": _body(
            inner,
            "scheduler_config",
            {
                "scheduler_algorithm": "SchedulerAlgorithm",
                "memory_oversubscription_enabled": "MemoryOversubscriptionEnabled",
            },
        ),
    }
    return node_pool_from_nomad(body)
