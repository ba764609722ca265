"""Cluster-level endpoints clients probe before anything else:
/v1/status/leader, /v1/status/peers, /v1/agent/self, /v1/regions, and
/v1/agent/members (Corral's server processes as Nomad's server members)."""

from __future__ import annotations

from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import operator_pb2, state_pb2
from services.gateway.authz import OPEN, OPERATOR_READ, ApiRoute, Need
from services.gateway.http import backend_of, metadata_of, respond
from services.gateway.mapping.absent import fill
from services.gateway.mapping.jobs import REGION


async def _state_members(request: Request) -> list[str]:
    """The state processes' addresses (our equivalent of Nomad's servers).
    Needs operator:read; without it, the gateway's own view (its state
    address) stands in, as clients only need a non-empty answer."""
    backend = backend_of(request)
    try:
        resp = await backend.operator.Members(
            operator_pb2.MembersRequest(role="state"), metadata=metadata_of(request), timeout=10
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            raise
        return [backend.state_addr]
    return [m.address for m in resp.members if m.address] or [backend.state_addr]


async def leader(request: Request) -> Response:
    """Nomad answers the leader's RPC address as a JSON string."""
    members = await _state_members(request)
    return respond(request, members[0])


async def peers(request: Request) -> Response:
    return respond(request, await _state_members(request))


async def regions(request: Request) -> Response:
    return respond(request, [REGION])


async def agent_self(request: Request) -> Response:
    """Enough of api.AgentSelf for clients that probe it (the CLI, the
    Terraform provider, UIs): the agent's config, member and version. Needs
    `agent:read`, as Nomad's (decided here: no RPC answers it)."""
    backend = backend_of(request)
    settings = request.app.state.settings
    acl = bool(settings.security.acl_enabled)
    body = {
        "config": {
            "Region": REGION,
            "Datacenter": "dc1",
            "NodeName": "corral-gateway",
            "Version": {"Version": "1.9.0", "VersionPrerelease": "", "VersionMetadata": "corral"},
            "ACL": {"Enabled": acl},
            "Server": {"Enabled": False},
            "Client": {"Enabled": False},
            "TLSConfig": {"EnableHTTP": bool(settings.security.tls)},
        },
        "member": fill(
            "AgentMember",
            {
                "Name": "corral-gateway",
                "Addr": backend.state_addr.rpartition(":")[0],
                "Port": int(backend.state_addr.rpartition(":")[2] or 0),
                "Tags": {"region": REGION, "dc": "dc1", "role": "gateway"},
                "Status": "alive",
            },
        ),
        "stats": {},
    }
    return respond(request, body)


def _member(m: state_pb2.Member) -> dict[str, Any]:
    """A server process as Nomad's api.AgentMember: `Tags` carry its role,
    whether it leads its role (`leader`), its version (`build`) and id."""
    host, _, port = m.address.rpartition(":")
    tags = {
        **m.tags,
        "role": m.role,
        "id": m.id,
        "region": REGION,
        "dc": "dc1",
        "build": m.version,
        "leader": "true" if m.leader else "false",
    }
    digits = int(port) if port.isdigit() else 0
    member = {
        "Name": f"{m.id}.{REGION}",
        "Addr": host,
        "Port": digits if digits < 2**16 else 0,
        "Tags": tags,
        "Status": "alive",
    }
    return fill("AgentMember", member) or member


async def agent_members(request: Request) -> Response:
    """Nomad's server members: every registered process of the server
    roles (state, broker, planner, worker; client agents are nodes, as in
    Nomad). A process leaves the list when its registration lapses, so each
    one listed is alive. Needs `operator:read` (Corral's Operator.Members;
    Nomad's asks `node:read`)."""
    resp = await backend_of(request).operator.Members(
        operator_pb2.MembersRequest(), metadata=metadata_of(request), timeout=10
    )
    servers = sorted((m for m in resp.members if m.role != "agent"), key=lambda m: (m.role, m.id))
    body = {
        "ServerName": "corral-gateway",
        "ServerRegion": REGION,
        "ServerDC": "dc1",
        "Members": [_member(m) for m in servers],
    }
    return respond(request, body)


async def agent_health(request: Request) -> Response:
    """Nomad's agent health: `server.ok` when the state service (the
    gateway's one dependency) answers its health check; 500 otherwise, so
    a load balancer's or Kubernetes' probe takes the gateway out."""
    problem = await backend_of(request).healthy()
    body = {"server": {"ok": not problem, "message": problem or "ok"}}
    return respond(request, body, status=500 if problem else 200)


AGENT_READ = Need(summary="`agent:read`", scopes=(("agent", "read"),), gateway=True)
#: the state's members when the token has operator:read, else the gateway's
#: own view: open either way, as Nomad's status endpoints
STATUS = Need(summary="none (open; members in full with `operator:read`)", open=True)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/agent/health", agent_health, {"GET": OPEN}),
    ApiRoute("/v1/status/leader", leader, {"GET": STATUS}),
    ApiRoute("/v1/status/peers", peers, {"GET": STATUS}),
    ApiRoute("/v1/regions", regions, {"GET": OPEN}),
    ApiRoute("/v1/agent/self", agent_self, {"GET": AGENT_READ}),
    ApiRoute("/v1/agent/members", agent_members, {"GET": OPERATOR_READ}),
]
