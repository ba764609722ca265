"""Cluster-level endpoints clients probe before anything else:
/v1/status/leader, /v1/status/peers, /v1/agent/self, /v1/regions."""

from __future__ import annotations

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import operator_pb2
from services.gateway.authz import OPEN, ApiRoute, Need
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
]
