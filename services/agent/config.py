"""The client agent's settings (`python -m services.agent`)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field

from corral.runtime.settings import CommaList, KeyValues, Option, ServerSettings, StateAddr


class AgentSettings(ServerSettings):
    """A client node: what it offers the cluster and where it keeps its allocations."""

    ROLE: ClassVar[str] = "agent"

    state_addr: StateAddr
    data_dir: Annotated[Path, AfterValidator(Path.resolve)] = Field(
        Path(".corral/agent"),
        validate_default=True,
        description="alloc directories and the node's identity (client.json)",
    )
    datacenter: str = Field("dc1", min_length=1, description="the node's datacenter")
    node_class: str = Field("", description="the node's class")
    node_pool: str = Field("default", min_length=1, description="the node's pool")
    name: Annotated[str, Option(env="CORRAL_AGENT_NODE_NAME", shown_default="the host name")] = (
        Field(default_factory=socket.gethostname, min_length=1, description="node name")
    )
    meta: KeyValues = Field(
        default_factory=dict, description="node meta key=value (repeat the flag for more)"
    )
    drivers: CommaList = Field(
        default_factory=lambda: ["mock"],
        description="enabled task drivers; raw_exec only when named here (it runs tasks as "
        "the agent's own user, without isolation: off unless configured, as in Nomad; "
        "`corral dev` turns it on)",
    )
    update_interval: float = Field(
        0.2, gt=0, description="seconds alloc status updates are batched (Nomad's allocSyncIntv)"
    )
    reserved_memory_mb: int = Field(256, ge=0, description="memory (MB) kept from allocations")
    reserved_cpu: int = Field(100, ge=0, description="CPU (MHz) kept from allocations")
