"""Who may call each RPC: the one table, and the check every server runs
before a handler.

Three kinds of caller, as in Nomad:

* **servers** (state, broker, planner, worker) call the internal RPCs: the
  state's writes, snapshot and change feed, the broker's eval queue, the
  planner's plan queue, the worker's dry runs. They prove it with a
  certificate naming `server.<region>.corral`, or, on a plaintext
  development cluster, with the server token. Nobody else gets in, whatever
  ACL token they hold: no policy grants an internal RPC.
* **nodes** (client agents) call the node RPCs with a client or server
  certificate (when TLS is on); the handler then checks the node's secret
  id, because only the state knows it.
* **users** call the public API with an ACL token: the rule names the
  capability (`submit-job` in the request's namespace, `node:write`, ...).
  Where the namespace is the stored object's (an alloc id, a deployment id)
  or the answer spans namespaces (lists with `*`, the event stream), the
  rule says `HANDLER`, and the handler checks through `current_acl()` on
  what it read.

An RPC missing from the table is refused (fail closed);
tests/unit/test_layout.py keeps the table complete.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass
from typing import Any

from corral.domain.errors import (
    ConfigError,
    FailedPrecondition,
    PermissionDenied,
    ResourceExhausted,
)
from corral.security import acl, tls
from corral.security.acl_resolve import Resolver
from corral.security.transport import (
    FORWARDED_METADATA_KEY,
    REGION_METADATA_KEY,
    SERVER_TOKEN_METADATA_KEY,
    SecuritySettings,
)


class Caller(enum.Enum):
    SERVER = "server"
    NODE = "node"
    USER = "user"
    #: a server of any region of the federation (the link probes and ACL
    #: replication between regions)
    PEER = "peer"


@dataclass(frozen=True)
class Rule:
    caller: Caller
    #: a namespace capability, checked on the request's namespace
    capability: str = ""
    #: other capabilities any one of which does as well (Nomad's Job.Scale
    #: takes scale-job or submit-job)
    alternatives: tuple[str, ...] = ()
    #: (scope, level): node|agent|operator, read|write
    scope: tuple[str, str] | None = None
    management: bool = False
    #: the handler checks the ACL against what it reads (see the module doc)
    handler: bool = False
    #: no token needed at all (ACL bootstrap, a token resolving itself)
    anonymous: bool = False

    def describe(self) -> str:
        """How docs/api-reference.md names the rule."""
        if self.caller is Caller.SERVER:
            return "servers only"
        if self.caller is Caller.PEER:
            return "servers of any federated region"
        if self.caller is Caller.NODE:
            return "nodes (node secret)"
        if self.anonymous:
            return "anyone"
        if self.management:
            return "management token"
        parts = []
        if self.capability:
            names = " or ".join(f"`{c}`" for c in self.capabilities)
            parts.append(f"namespace {names}")
        if self.scope:
            parts.append(f"`{self.scope[0]}:{self.scope[1]}`")
        if self.handler:
            parts.append("per object")
        return ", ".join(parts) or "any token"

    @property
    def capabilities(self) -> tuple[str, ...]:
        """The namespace capabilities any one of which the rule accepts."""
        return (self.capability, *self.alternatives) if self.capability else ()


SERVER = Rule(Caller.SERVER)
PEER = Rule(Caller.PEER)
NODE = Rule(Caller.NODE)
OPEN = Rule(Caller.USER, anonymous=True)
MANAGEMENT = Rule(Caller.USER, management=True)
PER_OBJECT = Rule(Caller.USER, handler=True)


def ns(capability: str, *alternatives: str, handler: bool = False) -> Rule:
    """Any of the capabilities in the request's namespace."""
    return Rule(Caller.USER, capability=capability, alternatives=alternatives, handler=handler)


def scope(name: str, level: str) -> Rule:
    return Rule(Caller.USER, scope=(name, level))


READ_JOB, SUBMIT_JOB, LIST_JOBS = "read-job", "submit-job", "list-jobs"
TAG_JOB_VERSION = "tag-job-version"
DELETE_SERVICE = "delete-service-registration"
SCALE_JOB, READ_JOB_SCALING = "scale-job", "read-job-scaling"
LIST_SCALING_POLICIES, READ_SCALING_POLICY = "list-scaling-policies", "read-scaling-policy"

#: the largest request a user or a node may send (a job spec is at most
#: 1 MiB; an agent's alloc updates for thousands of allocs fit easily). Only
#: servers send more: plans and eval batches of a whole cluster.
MAX_PUBLIC_REQUEST_BYTES = 16 * 1024 * 1024

#: every RPC of every Corral service, by full method name
RULES: dict[str, Rule] = {
    # the state's internal API
    **{
        f"/corral.v1.State/{m}": SERVER
        for m in (
            "GetIndex",
            "Snapshot",
            "Subscribe",
            "UpsertEvals",
            "DecideEval",
            "ApplyPlans",
            "UpdateAllocDesiredTransitions",
            "UpsertDeployments",
            "SetDeploymentStatus",
            "GarbageCollect",
            "PeriodicLaunches",
            "RegisterMember",
        )
    },  # fmt: skip
    # the broker's eval queue (workers, planner)
    **{
        f"/corral.v1.Eval/{m}": SERVER
        for m in (
            "Dequeue",
            "Ack",
            "Nack",
            "PlanFence",
            "Heartbeat",
        )
    },  # fmt: skip
    "/corral.v1.Eval/Stats": scope("operator", "read"),
    "/corral.v1.Plan/Submit": SERVER,
    "/corral.v1.Plan/Stats": scope("operator", "read"),
    # jobs
    "/corral.v1.Job/Register": ns(SUBMIT_JOB),
    "/corral.v1.Job/Plan": ns(SUBMIT_JOB),
    "/corral.v1.Job/Get": ns(READ_JOB),
    "/corral.v1.Job/List": ns(LIST_JOBS, handler=True),
    "/corral.v1.Job/Versions": ns(READ_JOB),
    "/corral.v1.Job/Statuses": ns(READ_JOB, handler=True),
    "/corral.v1.Job/Deregister": ns(SUBMIT_JOB),
    # scale-job or submit-job (Nomad's either-or; checked by the handler)
    "/corral.v1.Job/Scale": PER_OBJECT,
    # read-job or read-job-scaling
    "/corral.v1.Job/ScaleStatus": PER_OBJECT,
    "/corral.v1.Job/Revert": ns(SUBMIT_JOB),
    "/corral.v1.Job/Evaluate": ns(SUBMIT_JOB),
    "/corral.v1.Job/Stable": ns(SUBMIT_JOB),
    "/corral.v1.Job/TagVersion": ns(SUBMIT_JOB, TAG_JOB_VERSION),
    "/corral.v1.Job/Dispatch": ns("dispatch-job"),
    "/corral.v1.Job/Summary": ns(READ_JOB),
    "/corral.v1.Job/Allocations": ns(READ_JOB),
    "/corral.v1.Job/Evaluations": ns(READ_JOB),
    "/corral.v1.Job/GetSubmission": ns(READ_JOB),
    "/corral.v1.Periodic/Force": ns(SUBMIT_JOB, "dispatch-job"),
    # allocs, evals, deployments: the namespace is the stored object's
    "/corral.v1.Alloc/List": ns(READ_JOB, handler=True),
    "/corral.v1.Alloc/Get": PER_OBJECT,
    "/corral.v1.Alloc/Stop": PER_OBJECT,
    "/corral.v1.ClientAlloc/Logs": PER_OBJECT,
    "/corral.v1.ClientAlloc/Stats": PER_OBJECT,
    # alloc-exec (and alloc-node-exec without file system isolation)
    "/corral.v1.ClientAlloc/Exec": PER_OBJECT,
    # read-fs in the alloc's namespace
    "/corral.v1.ClientFS/List": PER_OBJECT,
    "/corral.v1.ClientFS/Stat": PER_OBJECT,
    "/corral.v1.ClientFS/Stream": PER_OBJECT,
    "/corral.v1.ClientAlloc/Signal": PER_OBJECT,
    "/corral.v1.ClientAlloc/Restart": PER_OBJECT,
    "/corral.v1.ClientStats/Stats": scope("node", "read"),
    # submit-job in the alloc's namespace (Nomad's ClientAllocations.GarbageCollect)
    "/corral.v1.ClientAlloc/GarbageCollect": PER_OBJECT,
    # the node's dynamic metadata and its garbage collection (Nomad's NodeMeta, GarbageCollectAll)
    "/corral.v1.ClientNode/ReadMeta": scope("node", "read"),
    "/corral.v1.ClientNode/ApplyMeta": scope("node", "write"),
    "/corral.v1.ClientNode/GarbageCollectAll": scope("node", "write"),
    "/corral.v1.Evals/List": ns(READ_JOB, handler=True),
    "/corral.v1.Evals/Get": PER_OBJECT,
    "/corral.v1.Deployment/List": ns(READ_JOB, handler=True),
    "/corral.v1.Deployment/Get": PER_OBJECT,
    "/corral.v1.Deployment/Fail": PER_OBJECT,
    "/corral.v1.Deployment/Pause": PER_OBJECT,
    "/corral.v1.Deployment/Promote": PER_OBJECT,
    "/corral.v1.Deployment/SetAllocHealth": PER_OBJECT,
    "/corral.v1.Event/Stream": PER_OBJECT,
    # the service catalog: reads check `may_read_services` (one place for
    # Nomad's AllowServiceRegistrationReadList), the clients write their own
    "/corral.v1.ServiceRegistration/List": PER_OBJECT,
    "/corral.v1.ServiceRegistration/GetService": PER_OBJECT,
    "/corral.v1.ServiceRegistration/ListByJob": ns(READ_JOB),
    "/corral.v1.ServiceRegistration/ListByAlloc": PER_OBJECT,
    "/corral.v1.ServiceRegistration/DeleteByID": PER_OBJECT,
    "/corral.v1.ServiceRegistration/Upsert": NODE,
    "/corral.v1.ServiceRegistration/Deregister": NODE,
    "/corral.v1.ClientAlloc/Checks": PER_OBJECT,
    # nodes: the agent's own RPCs, and the operators' view
    "/corral.v1.Node/Register": NODE,
    "/corral.v1.Node/UpdateStatus": NODE,
    "/corral.v1.Node/UpdateAlloc": NODE,
    "/corral.v1.Node/GetClientAllocs": NODE,
    "/corral.v1.Node/SignIdentities": NODE,
    "/corral.v1.Node/Deregister": scope("node", "write"),
    "/corral.v1.Node/Evaluate": scope("node", "write"),
    "/corral.v1.Node/UpdateDrain": scope("node", "write"),
    "/corral.v1.Node/UpdateEligibility": scope("node", "write"),
    "/corral.v1.Node/List": scope("node", "read"),
    "/corral.v1.Node/Get": scope("node", "read"),
    "/corral.v1.Node/Allocations": scope("node", "read"),
    # operators
    "/corral.v1.Operator/SchedulerGetConfiguration": scope("operator", "read"),
    "/corral.v1.Operator/SchedulerSetConfiguration": scope("operator", "write"),
    "/corral.v1.Operator/Members": scope("operator", "read"),
    # the whole state, secrets included, out and in: Nomad asks a management
    # token for both
    "/corral.v1.Operator/SnapshotSave": MANAGEMENT,
    "/corral.v1.Operator/SnapshotRestore": MANAGEMENT,
    "/corral.v1.System/GarbageCollect": scope("operator", "write"),
    "/corral.v1.System/ReconcileSummaries": MANAGEMENT,
    "/corral.v1.CoreGC/Force": SERVER,
    "/corral.v1.Worker/List": scope("operator", "read"),
    "/corral.v1.Worker/GetConfig": scope("operator", "read"),
    "/corral.v1.Worker/Pause": scope("operator", "write"),
    "/corral.v1.Worker/Resume": scope("operator", "write"),
    "/corral.v1.Worker/Stop": scope("operator", "write"),
    "/corral.v1.Worker/SetConfig": scope("operator", "write"),
    "/corral.v1.Worker/PlanJob": SERVER,
    # namespaces: writes need a management token; reads show what the
    # token may see (any capability in the namespace)
    "/corral.v1.Namespace/List": PER_OBJECT,
    "/corral.v1.Namespace/Get": PER_OBJECT,
    "/corral.v1.Namespace/Upsert": MANAGEMENT,
    "/corral.v1.Namespace/Delete": MANAGEMENT,
    # node pools: the token's node_pool rules, checked per pool
    "/corral.v1.NodePool/List": PER_OBJECT,
    "/corral.v1.NodePool/Get": PER_OBJECT,
    "/corral.v1.NodePool/Upsert": PER_OBJECT,
    "/corral.v1.NodePool/Delete": PER_OBJECT,
    "/corral.v1.NodePool/ListNodes": Rule(Caller.USER, scope=("node", "read"), handler=True),
    "/corral.v1.NodePool/ListJobs": PER_OBJECT,
    # scaling policies: list-scaling-policies / read-scaling-policy, or
    # list-jobs and read-job, in the policy's namespace
    "/corral.v1.Scaling/ListPolicies": PER_OBJECT,
    "/corral.v1.Scaling/GetPolicy": PER_OBJECT,
    # Variables: each path against the caller's variables rules (or the
    # implicit policy of a workload identity)
    "/corral.v1.Variables/List": PER_OBJECT,
    "/corral.v1.Variables/Read": PER_OBJECT,
    "/corral.v1.Variables/Apply": PER_OBJECT,
    "/corral.v1.Variables/RenewLock": PER_OBJECT,
    # the keyring (Nomad's keyring-read/rotate/delete come with operator read/write)
    "/corral.v1.Keyring/List": scope("operator", "read"),
    "/corral.v1.Keyring/Rotate": scope("operator", "write"),
    "/corral.v1.Keyring/Delete": scope("operator", "write"),
    "/corral.v1.Keyring/ListPublic": OPEN,
    "/corral.v1.Keyring/GetConfig": OPEN,
    # ACLs themselves
    "/corral.v1.ACL/Bootstrap": OPEN,
    "/corral.v1.ACL/ResolveToken": OPEN,
    "/corral.v1.ACL/TokenSelf": PER_OBJECT,
    "/corral.v1.ACL/UpsertPolicies": MANAGEMENT,
    "/corral.v1.ACL/ListPolicies": PER_OBJECT,
    "/corral.v1.ACL/GetPolicy": PER_OBJECT,
    "/corral.v1.ACL/DeletePolicies": MANAGEMENT,
    "/corral.v1.ACL/CreateToken": MANAGEMENT,
    "/corral.v1.ACL/ListTokens": MANAGEMENT,
    "/corral.v1.ACL/GetToken": MANAGEMENT,
    "/corral.v1.ACL/DeleteTokens": MANAGEMENT,
    # federation: the regions and their links (Nomad's /v1/regions needs no
    # token, `server members` node:read, `server join`/`force-leave`
    # agent:write); between regions, servers of any region
    "/corral.v1.Federation/Regions": OPEN,
    "/corral.v1.Federation/Status": scope("node", "read"),
    "/corral.v1.Federation/Join": scope("agent", "write"),
    "/corral.v1.Federation/ForceLeave": scope("agent", "write"),
    "/corral.v1.Federation/Hello": PEER,
    "/corral.v1.Federation/ReplicatePolicies": PEER,
    "/corral.v1.Federation/ReplicateTokens": PEER,
    "/corral.v1.Federation/ReplicateRoles": PEER,
    "/corral.v1.ACL/UpdateToken": MANAGEMENT,
    # roles: written with a management token; read by it, or by a token
    # linking the role (decided by the handler)
    "/corral.v1.ACL/UpsertRoles": MANAGEMENT,
    "/corral.v1.ACL/DeleteRoles": MANAGEMENT,
    "/corral.v1.ACL/ListRoles": PER_OBJECT,
    "/corral.v1.ACL/GetRole": PER_OBJECT,
    "/corral.v1.ACL/GetRoleByName": PER_OBJECT,
    # one-time tokens: made by any non-anonymous token for itself (the
    # handler refuses the anonymous one); exchanged by whoever holds the
    # one-time secret (the secret in the request is the authorization)
    "/corral.v1.ACL/UpsertOneTimeToken": PER_OBJECT,
    "/corral.v1.ACL/ExchangeOneTimeToken": OPEN,
}

ACL_SERVICE = "/corral.v1.ACL/"

#: services any caller may use (gRPC health checks, server reflection)
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def current_acl() -> acl.ACL:
    """The caller's ACL inside a handler (everything when ACLs are off)."""
    return acl.CURRENT.get()


def require_namespace(namespace: str, capability: str) -> None:
    """Refuse unless the caller holds `capability` in `namespace`, the
    namespace of a stored object the caller named by id: the refusal does
    not say which namespace that is (it would tell a caller who may not
    read it where the object lives)."""
    if not current_acl().allows_namespace(namespace or "default", capability):
        raise PermissionDenied(f"Permission denied: {capability} in the object's namespace")


def may_read_services(namespace: str) -> bool:
    """Whether the caller may read the service catalog of `namespace`
    (Nomad's AllowServiceRegistrationReadList): read-job there, or a
    workload identity of that namespace (what a task's templates read
    `nomadService` with). Every read of service registrations by name or
    namespace asks here."""
    return current_acl().allows_service_read(namespace or "default")


def require_service_read(namespace: str) -> None:
    if not may_read_services(namespace):
        raise PermissionDenied(f"Permission denied: {READ_JOB} in namespace {namespace!r}")


def require_any_capability(namespace: str, capabilities: tuple[str, ...]) -> None:
    """Refuse unless the caller holds one of `capabilities` in `namespace`
    (Nomad's either-or checks, e.g. scale-job or submit-job)."""
    acl_ = current_acl()
    if not any(acl_.allows_namespace(namespace or "default", c) for c in capabilities):
        wanted = " or ".join(capabilities)
        raise PermissionDenied(f"Permission denied: {wanted} in namespace {namespace!r}")


def may_read_scaling_policies(namespace: str, capability: str) -> bool:
    """Nomad's rule for scaling policies: `capability` (list- or
    read-scaling-policy), or both list-jobs and read-job."""
    acl_ = current_acl()
    namespace = namespace or "default"
    return acl_.allows_namespace(namespace, capability) or (
        acl_.allows_namespace(namespace, LIST_JOBS) and acl_.allows_namespace(namespace, READ_JOB)
    )


def require_node_pool(pool: str, capability: str) -> None:
    """Refuse unless the caller's node_pool rules grant `capability`
    (read, write or delete) on `pool`."""
    if not current_acl().allows_node_pool(pool, capability):
        raise PermissionDenied(f"Permission denied: node pool {pool!r} {capability}")


def may_read_namespace(namespace: str) -> bool:
    """Whether a listing or a stream may show an object of `namespace`."""
    return current_acl().allows_namespace(namespace or "default", READ_JOB)


def request_namespace(request: Any) -> str:
    """The namespace a request acts in: its own field, its query's, or its
    job's ('default' when none is set; '*' for every namespace)."""
    for holder in (request, getattr(request, "query", None), getattr(request, "job", None)):
        value = getattr(holder, "namespace", "") if holder is not None else ""
        if value:
            return str(value)
    return "default"


def _metadata(context: Any, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode(errors="replace")
    return ""


def requested_region(context: Any) -> str:
    """The region a call asks for (`x-corral-region`; '' = the server's own)."""
    return _metadata(context, REGION_METADATA_KEY).strip()


def forwarded_from(context: Any) -> str:
    """The region that forwarded this call here ('' when none did)."""
    return _metadata(context, FORWARDED_METADATA_KEY).strip()


class Guard:
    """The check a server runs before each handler (see the module doc).

    Returns the ACL to expose to the handler; raises PermissionDenied."""

    def __init__(self, settings: SecuritySettings, resolver: Resolver | None = None) -> None:
        self.settings = settings
        self.resolver = resolver
        self._server_token = settings.server_token.get_secret_value().encode()

    def check_startable(self, methods: list[str]) -> None:
        """A server with internal RPCs needs a way to tell servers apart; one
        that enforces ACLs needs a resolver. Refuse to start otherwise."""
        internal = any(RULES.get(m) in (SERVER, PEER) for m in methods)
        if internal and not self.settings.tls and not self._server_token:
            raise ConfigError(
                "this role serves internal RPCs: set TLS files (CORRAL_CA_FILE, "
                "CORRAL_CERT_FILE, CORRAL_KEY_FILE) or a server token "
                "(CORRAL_SERVER_TOKEN), or anyone could call them"
            )
        if self.settings.acl_enabled and self.resolver is None:
            raise ConfigError("ACLs are enabled but this role has no way to resolve tokens")

    def foreign_region(self, context: Any) -> str:
        """The region a call asks for when it is not this process's ('' when
        it is this region's, or names none)."""
        region = requested_region(context)
        return region if region and region != self.settings.region else ""

    def check_forward(self, method: str, request: Any, context: Any, region: str) -> None:
        """What a server checks before it forwards a call to `region`: the
        call is a user's public RPC, its transport identity is admitted
        here, it is not too large and was not forwarded already. Its ACL
        token is left to the region that serves it (a token of that region
        may be unknown here, as in Nomad)."""
        rule = RULES.get(method)
        if rule is None:
            raise PermissionDenied(f"Permission denied: {method} has no access rule")
        if rule.caller is not Caller.USER:
            raise FailedPrecondition(
                f"{method} is served by each region's own servers and clients: it is not "
                f"forwarded to region {region!r} (this is region {self.settings.region!r})"
            )
        origin = forwarded_from(context)
        if origin:
            raise FailedPrecondition(
                f"a request for region {region!r} forwarded from region {origin!r} reached "
                f"region {self.settings.region!r}: forwarded requests are not forwarded again "
                "(check the federation addresses of both regions)"
            )
        self._check_transport(rule, context)
        size = request.ByteSize()
        if size > MAX_PUBLIC_REQUEST_BYTES:
            raise ResourceExhausted(
                f"request is {size} bytes; at most {MAX_PUBLIC_REQUEST_BYTES} are accepted"
            )

    async def check(self, method: str, request: Any, context: Any) -> acl.ACL:
        if method.startswith(OPEN_SERVICES):
            return acl.MANAGEMENT
        rule = RULES.get(method)
        if rule is None:
            raise PermissionDenied(f"Permission denied: {method} has no access rule")
        if method.startswith(ACL_SERVICE) and not self.settings.acl_enabled:
            # a token made now would guard nothing: say so instead
            raise FailedPrecondition("ACL support disabled (start the servers with ACLs enabled)")
        server = self._check_transport(rule, context)
        if rule.caller is not Caller.SERVER:
            size = request.ByteSize()
            if size > MAX_PUBLIC_REQUEST_BYTES:
                raise ResourceExhausted(
                    f"request is {size} bytes; at most {MAX_PUBLIC_REQUEST_BYTES} are accepted"
                )
        if rule.caller is not Caller.USER or rule.anonymous:
            internal = rule.caller in (Caller.SERVER, Caller.PEER)
            return acl.MANAGEMENT if internal else acl.DENY_ALL
        if not self.settings.acl_enabled or server:
            # a server acting for the cluster (the broker launching a periodic
            # job's child, promoting canaries) holds every capability, as in Nomad
            return acl.MANAGEMENT
        assert self.resolver is not None  # check_startable
        secret = acl.token_from_metadata(context.invocation_metadata())
        found = await self.resolver.resolve(secret)
        _check_acl(rule, found, request)
        acl.CURRENT_TOKEN.set(secret)
        return found

    def _check_transport(self, rule: Rule, context: Any) -> bool:
        """Refuse a caller whose transport identity the rule does not admit;
        return whether the caller is a server of this region.

        With TLS the certificate's name decides: internal RPCs want a server
        of this region, node RPCs a server or client of this region, the
        calls between regions a server of any region. A user's public call
        may come with a certificate of any role and region our CA signed (a
        server of another region forwarding a request, a person's CLI of
        another region): it is judged by its ACL token, and a server of
        another region acts for nobody here."""
        if self.settings.tls:
            identity = tls.peer_identity(context)
            if identity is None:
                raise PermissionDenied(
                    "Permission denied: the client certificate names no Corral role"
                )
            role, region = identity
            here = region == self.settings.region
            shown = f"certificate role {role!r}" + ("" if here else f" of region {region!r}")
            if rule.caller is Caller.SERVER and not (role == "server" and here):
                raise PermissionDenied(f"Permission denied: servers only ({shown})")
            if rule.caller is Caller.PEER and role != "server":
                raise PermissionDenied(f"Permission denied: servers only ({shown})")
            if rule.caller is Caller.NODE and not (here and role in ("server", "client")):
                raise PermissionDenied(f"Permission denied: nodes only ({shown})")
            return role == "server" and here
        given = _metadata(context, SERVER_TOKEN_METADATA_KEY).encode()
        server = bool(given and self._server_token) and hmac.compare_digest(
            given, self._server_token
        )
        if rule.caller in (Caller.SERVER, Caller.PEER) and not server:
            raise PermissionDenied("Permission denied: servers only")
        return server


def _check_acl(rule: Rule, found: acl.ACL, request: Any) -> None:
    if rule.management and not found.is_management:
        raise PermissionDenied("Permission denied: a management token is required")
    if rule.scope is not None and not found.allows(*rule.scope):
        raise PermissionDenied(f"Permission denied: {rule.scope[0]}:{rule.scope[1]} required")
    if rule.capability:
        namespace = request_namespace(request)
        if namespace != "*" and not any(
            found.allows_namespace(namespace, cap) for cap in rule.capabilities
        ):
            raise PermissionDenied(
                f"Permission denied: {' or '.join(rule.capabilities)} in namespace {namespace!r}"
            )
