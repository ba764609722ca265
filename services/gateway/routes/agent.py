"""Cluster-level endpoints clients probe before anything else:
/v1/status/leader, /v1/status/peers, /v1/agent/self, /v1/regions, and the
federation's members: /v1/agent/members, /v1/agent/join,
/v1/agent/force-leave (Nomad's server gossip, here the state's links to the
other regions)."""

from __future__ import annotations

from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import federation_pb2, operator_pb2
from services.gateway.authz import NODE_READ, OPEN, ApiRoute, Need, scope
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import QueryOptions, backend_of, bad_request, metadata_of, respond
from services.gateway.mapping.absent import fill


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
    """Every region the state knows, sorted (anyone may ask)."""
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).federation.Regions(
        federation_pb2.RegionsRequest(), metadata=q.metadata, timeout=q.timeout
    )
    return respond(request, list(resp.regions))


def _member(server: federation_pb2.RegionServer) -> dict[str, Any]:
    """A state server as Nomad's api.AgentMember."""
    host, _, port = server.address.rpartition(":")
    member: dict[str, Any] = {
        "Name": server.name,
        "Addr": host.strip("[]"),
        "Port": int(port) if port.isdigit() else 0,
        "Tags": {
            "role": "nomad",
            "region": server.region,
            "dc": "dc1",
            "port": port,
            "build": server.version or "1",
            "leader": str(server.leader).lower(),
        },
        "Status": server.status,
        "ProtocolMin": 1,
        "ProtocolMax": 5,
        "ProtocolCur": 2,
        "DelegateMin": 2,
        "DelegateMax": 5,
        "DelegateCur": 4,
    }
    fill("AgentMember", member)
    return member


async def agent_members(request: Request) -> Response:
    """Nomad's ServerMembers: the state servers of every region this one
    knows, alive or failed (needs node:read)."""
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).federation.Status(
        federation_pb2.FederationStatusRequest(), metadata=q.metadata, timeout=q.timeout
    )
    own = next((s for s in resp.servers if s.region == resp.region), None)
    body = {
        "ServerName": own.name if own is not None else "",
        "ServerRegion": resp.region,
        "ServerDC": "dc1",
        "Members": [_member(s) for s in resp.servers],
    }
    return respond(request, body)


async def agent_join(request: Request) -> Response:
    """Join the regions whose state servers listen at `?address=` (needs
    agent:write): Nomad's {num_joined, error}."""
    addresses = request.query_params.getlist("address")
    if not addresses:
        raise bad_request("missing address to join")
    resp = await backend_of(request).federation.Join(
        federation_pb2.FederationJoinRequest(addresses=addresses),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, {"num_joined": resp.joined, "error": resp.error, "warning": ""})


async def agent_force_leave(request: Request) -> Response:
    """Forget a joined region: `?node=` names it, or one of its servers
    (`<id>.<region>`, as `server members` shows them)."""
    node = request.query_params.get("node", "")
    if not node:
        raise bad_request("missing node to force leave")
    await backend_of(request).federation.ForceLeave(
        federation_pb2.FederationForceLeaveRequest(region=node.rpartition(".")[2]),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, None)


async def agent_self(request: Request) -> Response:
    """Enough of api.AgentSelf for clients that probe it (the CLI, the
    Terraform provider, UIs): the agent's config, member and version. Needs
    `agent:read`, as Nomad's (decided here: no RPC answers it)."""
    backend = backend_of(request)
    settings = request.app.state.settings
    acl = bool(settings.security.acl_enabled)
    region = settings.security.region
    body = {
        "config": {
            "Region": region,
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
                "Tags": {"region": region, "dc": "dc1", "role": "gateway"},
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


AGENT_WRITE = scope("agent", "write")
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
    # the federation (Nomad's Status.Members needs node:read; join and
    # force-leave agent:write): the state's Federation RPCs decide
    ApiRoute("/v1/agent/members", agent_members, {"GET": NODE_READ}),
    ApiRoute("/v1/agent/join", agent_join, {"PUT": AGENT_WRITE, "POST": AGENT_WRITE}),
    ApiRoute("/v1/agent/force-leave", agent_force_leave, {"PUT": AGENT_WRITE, "POST": AGENT_WRITE}),
]
