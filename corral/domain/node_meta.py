"""Nomad's NodeMetaResponse JSON of a node's metadata as its agent answers
(`GET|POST /v1/client/metadata`, `corral node meta read -json`): the one
shape the gateway and the CLI both print."""

from __future__ import annotations

from typing import Any

from corral.v1 import node_pb2


def nomad_json(resp: node_pb2.NodeMetaResponse) -> dict[str, Any]:
    """Meta (merged), Dynamic (a static key unset is null) and Static."""
    dynamic: dict[str, str | None] = dict(resp.dynamic)
    dynamic.update(dict.fromkeys(resp.dynamic_unset))
    return {"Meta": dict(resp.meta), "Dynamic": dynamic, "Static": dict(resp.static)}
