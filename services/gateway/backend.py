"""The gateway's side of the public gRPC API: one channel to the state
service (every public service it serves) and leader-following channels to
the broker and planner for their queue statistics.

The gateway is a *user* of the cluster, never a server: its channels carry
no server token (it is dropped from the settings even when the environment
has one) and, with TLS, it should hold a `cli` certificate, so every call is
judged by the ACL token of the HTTP request that caused it. That token
(`X-Nomad-Token`, or `Authorization: Bearer`) travels per call as
`x-corral-token` metadata (`Backend.metadata`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from corral.runtime.rpc import LeaderChannel
from corral.runtime.settings import SecuritySettings
from corral.security import transport
from corral.security.acl import TOKEN_METADATA_KEY
from corral.security.acl_resolve import RemoteResolver
from corral.v1 import (
    acl_pb2_grpc,
    alloc_pb2_grpc,
    deployment_pb2_grpc,
    eval_pb2,
    eval_pb2_grpc,
    event_pb2_grpc,
    federation_pb2_grpc,
    job_pb2_grpc,
    keyring_pb2_grpc,
    namespace_pb2_grpc,
    node_pb2_grpc,
    node_pool_pb2_grpc,
    operator_pb2,
    operator_pb2_grpc,
    periodic_pb2_grpc,
    plan_pb2,
    plan_pb2_grpc,
    scaling_pb2_grpc,
    service_pb2_grpc,
    system_pb2_grpc,
    variables_pb2_grpc,
)

#: unary calls fail after this long rather than hang; blocking queries add
#: their wait to it
DEFAULT_TIMEOUT = 30.0
#: how long the gateway keeps a resolved token (the state's own cache: 5 s)
TOKEN_TTL = 5.0
#: the agents' ClientAlloc (logs) and big job lists
_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]

Metadata = Sequence[tuple[str, str]]


def user_security(settings: SecuritySettings) -> SecuritySettings:
    """`settings` without the server token: the gateway calls as a user."""
    return settings.model_copy(update={"server_token": SecretStr("")})


def token_metadata(token: str) -> list[tuple[str, str]]:
    """The call metadata that carries a request's ACL token (none: empty)."""
    return [(TOKEN_METADATA_KEY, token)] if token else []


def _split(addresses: str) -> list[str]:
    return [a.strip() for a in addresses.split(",") if a.strip()]


class Backend:
    """Stubs of the public services over long-lived channels. Create it
    inside the running event loop (grpc.aio binds channels to the loop)."""

    def __init__(
        self,
        state_addr: str,
        *,
        broker_addr: str = "",
        planner_addr: str = "",
        security_settings: SecuritySettings | None = None,
    ) -> None:
        self.security = user_security(security_settings or transport.current())
        self.state_addr = state_addr
        self.channel = transport.dial(state_addr, settings=self.security, options=_OPTIONS)
        self.jobs = job_pb2_grpc.JobStub(self.channel)
        self.allocs = alloc_pb2_grpc.AllocStub(self.channel)
        self.evals = eval_pb2_grpc.EvalsStub(self.channel)
        self.nodes = node_pb2_grpc.NodeStub(self.channel)
        self.deployments = deployment_pb2_grpc.DeploymentStub(self.channel)
        self.acl = acl_pb2_grpc.ACLStub(self.channel)
        self.events = event_pb2_grpc.EventStub(self.channel)
        self.operator = operator_pb2_grpc.OperatorStub(self.channel)
        self.periodic = periodic_pb2_grpc.PeriodicStub(self.channel)
        self.services = service_pb2_grpc.ServiceRegistrationStub(self.channel)
        self.namespaces = namespace_pb2_grpc.NamespaceStub(self.channel)
        self.node_pools = node_pool_pb2_grpc.NodePoolStub(self.channel)
        self.scaling = scaling_pb2_grpc.ScalingStub(self.channel)
        self.variables = variables_pb2_grpc.VariablesStub(self.channel)
        self.keyring = keyring_pb2_grpc.KeyringStub(self.channel)
        self.federation = federation_pb2_grpc.FederationStub(self.channel)
        self.system = system_pb2_grpc.SystemStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        #: request tokens resolved by the state (ACL.ResolveToken) and compiled
        #: as every server compiles them, for the few routes the gateway
        #: decides itself (services/gateway/authz.py); kept briefly, so a
        #: changed policy shows within TOKEN_TTL seconds
        self.tokens = RemoteResolver(self.channel, ttl=TOKEN_TTL, miss_ttl=TOKEN_TTL)
        self._broker_addr = broker_addr
        self._planner_addr = planner_addr
        self._leaders: dict[tuple[str, str], LeaderChannel] = {}
        self._agents: dict[tuple[str, str], grpc.aio.Channel] = {}

    async def healthy(self, timeout: float = 5.0) -> str:
        """'' when the state service answers its gRPC health check as
        SERVING, else why not (the gateway's /v1/agent/health)."""
        try:
            reply = await self._health.Check(
                health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as exc:
            return f"state service {self.state_addr}: {exc.code().name.lower()}"
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            return f"state service {self.state_addr} is not serving"
        return ""

    # -- the agents (task logs and files, resource usage, exec) ------------

    def _agent(self, address: str, region: str) -> grpc.aio.Channel:
        ch = self._agents.get((address, region))
        if ch is None:
            ch = self._agents[(address, region)] = transport.dial(
                address, peer="client", settings=self.security, options=_OPTIONS, region=region
            )
        return ch

    def client_alloc(self, address: str, region: str = "") -> alloc_pb2_grpc.ClientAllocAsyncStub:
        """The ClientAlloc service of the agent at `address` (Node.http_addr),
        a client of `region` (default the gateway's own)."""
        return alloc_pb2_grpc.ClientAllocStub(self._agent(address, region))

    def client_fs(self, address: str, region: str = "") -> alloc_pb2_grpc.ClientFSAsyncStub:
        """The ClientFS service (alloc files) of the agent at `address`, of `region`."""
        return alloc_pb2_grpc.ClientFSStub(self._agent(address, region))

    def client_stats(self, address: str, region: str = "") -> node_pb2_grpc.ClientStatsAsyncStub:
        """The ClientStats service of the agent at `address`, of `region`."""
        return node_pb2_grpc.ClientStatsStub(self._agent(address, region))

    def client_node(self, address: str, region: str = "") -> node_pb2_grpc.ClientNodeAsyncStub:
        """The ClientNode service (dynamic metadata, GC) of the agent at `address`."""
        return node_pb2_grpc.ClientNodeStub(self._agent(address, region))

    # -- the singleton roles' statistics -----------------------------------

    async def _leader(
        self, role: str, configured: str, metadata: Metadata, region: str = ""
    ) -> LeaderChannel | None:
        """A channel following the `role` leader of `region` (default the
        gateway's own: the configured addresses, else the registered
        members; another region's: its registered members, asked through
        the state, which forwards the question there)."""
        if (role, region) in self._leaders:
            return self._leaders[(role, region)]
        addresses = [] if region else _split(configured)
        if not addresses:
            # not configured: ask the state who is registered in that role
            resp = await self.operator.Members(
                operator_pb2.MembersRequest(role=role), metadata=metadata, timeout=10
            )
            members = sorted(resp.members, key=lambda m: not m.leader)
            addresses = [m.address for m in members if m.address]
        if not addresses:
            return None
        ch = self._leaders[(role, region)] = LeaderChannel(
            addresses, retry_budget=5.0, settings=self.security, region=region
        )
        return ch

    async def broker_stats(
        self, metadata: Metadata, region: str = ""
    ) -> eval_pb2.BrokerStats | None:
        """Eval.Stats from the broker leader of `region` (needs
        operator:read); None when no broker is known."""
        ch = await self._leader("broker", self._broker_addr, metadata, region)
        if ch is None:
            return None
        stats: eval_pb2.BrokerStats = await ch.call(
            lambda c: functools.partial(eval_pb2_grpc.EvalStub(c).Stats, metadata=metadata),
            eval_pb2.BrokerStatsRequest(),
            timeout=10,
        )
        return stats

    async def plan_stats(self, metadata: Metadata, region: str = "") -> plan_pb2.PlanStats | None:
        """Plan.Stats from the planner leader of `region` (needs operator:read)."""
        ch = await self._leader("planner", self._planner_addr, metadata, region)
        if ch is None:
            return None
        stats: plan_pb2.PlanStats = await ch.call(
            lambda c: functools.partial(plan_pb2_grpc.PlanStub(c).Stats, metadata=metadata),
            plan_pb2.PlanStatsRequest(),
            timeout=10,
        )
        return stats

    async def close(self) -> None:
        await self.channel.close()
        for leader in self._leaders.values():
            await leader.close()
        for ch in self._agents.values():
            await ch.close()
        self._leaders.clear()
        self._agents.clear()
