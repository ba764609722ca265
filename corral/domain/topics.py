"""The change feed's topics, each described once.

Every write records one `pb.Event` per object it changes; the topic says
what kind of object (Nomad's event stream topics). What other code needs
to know of a topic is here, and only here:

* `name`: Nomad's topic name (`Event.topic`, the event stream's
  `topic=` filter, the CLI's `-topic`);
* `payload`: the `Event.payload` field that holds the object ("" for
  the ACL topics: their events carry only a key, never a secret);
* `index`: the table index its writes move (`table_indexes`, a blocking
  query's index, `StateSnapshot.table_index`); `tables`: the snapshot
  tables that hold its objects (`State.Snapshot`, a replica's feed view);
* `types`: the event types it records (`Event.type`), `key`: the event key
  of an object, `namespace`: the namespace its events carry ('' for none);
* for users: whether `Event.Stream` offers it (`streamed`), which ACL rule
  lets a caller see its events (`read_rule`), the ids besides the key that
  a `Topic:key` subscription matches (`match_keys`), Nomad's `FilterKeys`
  and payload key in the HTTP event stream (`filter_keys`,
  `nomad_payload`), and the CLI's shorthands (`aliases`).

`of(event)` is the one place that reads which payload an event carries:
code that handles events dispatches on the topic it returns
(`if topics.of(ev) is topics.ALLOCATION`). The layout test fails when a
module outside this one spells a topic name by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.v1 import structs_pb2 as pb


class EventType:
    """`Event.type` of every change the state records (Nomad's names where
    Nomad has the event)."""

    JOB_REGISTERED = "JobRegistered"
    JOB_DEREGISTERED = "JobDeregistered"
    JOB_VERSION = "JobVersion"
    JOB_STATUS_UPDATED = "JobStatusUpdated"
    JOB_STABILITY_UPDATED = "JobStabilityUpdated"
    EVALUATION_UPDATED = "EvaluationUpdated"
    EVALUATION_DELETED = "EvaluationDeleted"
    ALLOCATION_UPDATED = "AllocationUpdated"
    ALLOCATION_UPDATE_DESIRED_STATUS = "AllocationUpdateDesiredStatus"
    ALLOCATION_DELETED = "AllocationDeleted"
    NODE_REGISTRATION = "NodeRegistration"
    NODE_DEREGISTRATION = "NodeDeregistration"
    NODE_STREAM_EVENT = "NodeStreamEvent"
    NODE_ALLOC_UPDATE = "NodeAllocUpdate"
    NODE_ELIGIBILITY = "NodeEligibility"
    NODE_DRAIN = "NodeDrain"
    DEPLOYMENT_STATUS_UPDATE = "DeploymentStatusUpdate"
    DEPLOYMENT_DELETED = "DeploymentDeleted"
    SCHEDULER_CONFIG = "SchedulerConfig"
    SCHEDULER_CONFIG_UPDATED = "SchedulerConfigUpdated"
    JOB_SUMMARY = "JobSummary"
    #: every object a committed plan writes; the broker knows by it that an
    #: eval event is a plan's modify-index bump, not a new submission
    PLAN_RESULT = "PlanResult"
    SERVICE_REGISTRATION = "ServiceRegistration"
    SERVICE_DEREGISTRATION = "ServiceDeregistration"
    VARIABLE_UPDATED = "VariableUpdated"
    ROOT_KEY_UPSERTED = "RootKeyUpserted"
    ROOT_KEY_DELETED = "RootKeyDeleted"
    VARIABLES_REKEYED = "VariablesRekeyed"
    NAMESPACE_UPSERTED = "NamespaceUpserted"
    NAMESPACE_DELETED = "NamespaceDeleted"
    NODE_POOL_UPSERTED = "NodePoolUpserted"
    NODE_POOL_DELETED = "NodePoolDeleted"
    SCALING_POLICY_UPSERTED = "ScalingPolicyUpserted"
    SCALING_POLICY_DELETED = "ScalingPolicyDeleted"
    SCALING_EVENT_RECORDED = "ScalingEventRecorded"
    SCALING_EVENTS_DELETED = "ScalingEventsDeleted"
    ACL_POLICY_UPSERTED = "ACLPolicyUpserted"
    ACL_POLICY_DELETED = "ACLPolicyDeleted"
    ACL_TOKEN_UPSERTED = "ACLTokenUpserted"
    ACL_TOKEN_DELETED = "ACLTokenDeleted"
    ACL_ROLE_UPSERTED = "ACLRoleUpserted"
    ACL_ROLE_DELETED = "ACLRoleDeleted"
    ONE_TIME_TOKEN_UPSERTED = "OneTimeTokenUpserted"
    ONE_TIME_TOKEN_DELETED = "OneTimeTokenDeleted"


def _none(_obj: Any) -> tuple[str, ...]:
    return ()


def _id(obj: Any) -> str:
    return str(obj.id)


def _name(obj: Any) -> str:
    return str(obj.name)


def _namespace(obj: Any) -> str:
    return str(obj.namespace)


def _no_namespace(_obj: Any) -> str:
    return ""


@dataclass(frozen=True, slots=True, eq=False)
class Topic:
    """One topic of the change feed (see the module docstring)."""

    name: str
    payload: str
    index: str
    tables: tuple[str, ...]
    types: tuple[str, ...]
    key: Callable[[Any], str] = _id
    namespace: Callable[[Any], str] = _namespace
    streamed: bool = True
    #: "namespace" (read-job in the event's namespace), "node" (node:read),
    #: "operator" (operator:read), "variable" (`list` on the variable's path,
    #: the event's key) or "management" (a management token only)
    read_rule: str = "namespace"
    match_keys: Callable[[Any], tuple[str, ...]] = _none
    filter_keys: Callable[[Any], tuple[str, ...]] = _none
    #: the object's key in Nomad's event payload ("": the topic's name)
    nomad_payload: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def payload_key(self) -> str:
        """The object's key in Nomad's event payload (`{"Job": {...}}`)."""
        return self.nomad_payload or self.name

    def event(
        self,
        obj: Any,
        type_: str,
        *,
        deleted: bool = False,
        index: int = 0,
        into: Any = None,
    ) -> pb.Event:
        """The change record of `obj`: a message of this topic's payload, or
        for a key-only topic the key itself. With `into` (a batch's events)
        it is added there, built in place (adding a built event copies it)."""
        make = pb.Event if into is None else into.add
        if not self.payload:
            return make(index=index, topic=self.name, type=type_, key=obj, deleted=deleted)  # type: ignore[no-any-return]
        return make(  # type: ignore[no-any-return]
            index=index,
            topic=self.name,
            type=type_,
            key=self.key(obj),
            namespace=self.namespace(obj),
            deleted=deleted,
            **{self.payload: obj},
        )


JOB = Topic(
    name="Job",
    payload="job",
    index="jobs",
    # a job's older versions come with its jobs
    tables=("jobs", "job_versions"),
    types=(
        EventType.JOB_REGISTERED,
        EventType.JOB_DEREGISTERED,
        EventType.JOB_VERSION,
        EventType.JOB_STATUS_UPDATED,
        EventType.JOB_STABILITY_UPDATED,
    ),
    aliases=("job",),
)
EVALUATION = Topic(
    name="Evaluation",
    payload="evaluation",
    index="evals",
    tables=("evals",),
    types=(EventType.EVALUATION_UPDATED, EventType.EVALUATION_DELETED, EventType.PLAN_RESULT),
    match_keys=lambda e: (e.job_id,),
    filter_keys=lambda e: (e.job_id, e.deployment_id),
    aliases=("Eval", "eval", "evaluation"),
)
ALLOCATION = Topic(
    name="Allocation",
    payload="allocation",
    index="allocs",
    tables=("allocs",),
    types=(
        EventType.ALLOCATION_UPDATED,
        EventType.ALLOCATION_UPDATE_DESIRED_STATUS,
        EventType.ALLOCATION_DELETED,
        EventType.PLAN_RESULT,
    ),
    match_keys=lambda a: (a.job_id, a.node_id),
    filter_keys=lambda a: (a.job_id, a.deployment_id),
    aliases=("Alloc", "alloc", "allocation"),
)
NODE = Topic(
    name="Node",
    payload="node",
    index="nodes",
    tables=("nodes",),
    types=(
        EventType.NODE_REGISTRATION,
        EventType.NODE_DEREGISTRATION,
        EventType.NODE_STREAM_EVENT,
        EventType.NODE_ALLOC_UPDATE,
        EventType.NODE_ELIGIBILITY,
        EventType.NODE_DRAIN,
    ),
    namespace=_no_namespace,
    read_rule="node",
    aliases=("node",),
)
DEPLOYMENT = Topic(
    name="Deployment",
    payload="deployment",
    index="deployments",
    tables=("deployments",),
    types=(
        EventType.DEPLOYMENT_STATUS_UPDATE,
        EventType.DEPLOYMENT_DELETED,
        EventType.PLAN_RESULT,
    ),
    filter_keys=lambda d: (d.job_id,),
    aliases=("deployment",),
)
OPERATOR = Topic(
    name="Operator",
    payload="scheduler_config",
    index="scheduler_config",
    # the scheduler configuration comes with every snapshot's header
    tables=(),
    types=(EventType.SCHEDULER_CONFIG, EventType.SCHEDULER_CONFIG_UPDATED),
    key=lambda _c: "scheduler",
    namespace=_no_namespace,
    read_rule="operator",
    nomad_payload="SchedulerConfig",
    aliases=("operator",),
)
JOB_SUMMARY = Topic(
    name="JobSummary",
    payload="job_summary",
    # the name table_indexes has held since the first schema
    index="job_summary",
    tables=("job_summaries",),
    types=(EventType.JOB_SUMMARY,),
    key=lambda s: s.job_id,
)
NODE_POOL = Topic(
    name="NodePool",
    payload="node_pool",
    index="node_pools",
    tables=("node_pools",),
    types=(EventType.NODE_POOL_UPSERTED, EventType.NODE_POOL_DELETED),
    key=_name,
    namespace=_no_namespace,
    # Nomad cannot filter them by a pool rule either
    read_rule="management",
)
SERVICE = Topic(
    name="Service",  # Nomad's TopicService: service registrations
    payload="service_registration",
    index="service_registrations",
    tables=("service_registrations",),
    types=(EventType.SERVICE_REGISTRATION, EventType.SERVICE_DEREGISTRATION),
    match_keys=lambda r: (r.job_id, r.service_name),
    filter_keys=lambda r: (r.job_id, r.service_name),
)
VARIABLE = Topic(
    name="Variable",
    # metadata only, never the items; a delete is `deleted`
    payload="variable",
    index="variables",
    # no replica keeps variables: the state reads them from its database
    tables=(),
    types=(EventType.VARIABLE_UPDATED,),
    key=lambda meta: str(meta.path),
    read_rule="variable",
)
# Namespaces, scaling policies and scaling events are in the change log
# (every replica and state process keeps them) but, as in Nomad, not
# offered by Event.Stream.
NAMESPACE = Topic(
    name="Namespace",
    payload="namespace_object",
    index="namespaces",
    tables=("namespaces",),
    types=(EventType.NAMESPACE_UPSERTED, EventType.NAMESPACE_DELETED),
    key=_name,
    namespace=_name,  # a namespace's events are in the namespace itself
    streamed=False,
)
SCALING_POLICY = Topic(
    name="ScalingPolicy",
    payload="scaling_policy",
    index="scaling_policy",
    tables=("scaling_policies",),
    types=(EventType.SCALING_POLICY_UPSERTED, EventType.SCALING_POLICY_DELETED),
    namespace=lambda p: str(p.target.get("Namespace", "")),
    streamed=False,
)
SCALING_EVENT = Topic(
    name="ScalingEvent",
    payload="job_scaling_events",
    index="scaling_event",
    tables=("scaling_events",),
    types=(EventType.SCALING_EVENT_RECORDED, EventType.SCALING_EVENTS_DELETED),
    key=lambda se: str(se.job_id),
    streamed=False,
)
# Root key writes (key only: a key id) tell every state process to look at
# the keyring again; Event.Stream never offers them.
ROOT_KEY = Topic(
    name="RootKey",
    payload="",
    index="root_keys",
    tables=(),
    types=(EventType.ROOT_KEY_UPSERTED, EventType.ROOT_KEY_DELETED, EventType.VARIABLES_REKEYED),
    key=str,
    namespace=_no_namespace,
    streamed=False,
)
# ACL writes are in the change log (key only: a policy name, a token's
# accessor id or a role's id, never a secret) so every state process can drop cached
# tokens; Event.Stream never offers them.
ACL_POLICY = Topic(
    name="ACLPolicy",
    payload="",
    index="",
    tables=(),
    types=(EventType.ACL_POLICY_UPSERTED, EventType.ACL_POLICY_DELETED),
    key=str,
    namespace=_no_namespace,
    streamed=False,
)
ACL_TOKEN = Topic(
    name="ACLToken",
    payload="",
    index="",
    tables=(),
    types=(EventType.ACL_TOKEN_UPSERTED, EventType.ACL_TOKEN_DELETED),
    key=str,
    namespace=_no_namespace,
    streamed=False,
)
ACL_ROLE = Topic(
    name="ACLRole",
    payload="",
    index="",
    tables=(),
    types=(EventType.ACL_ROLE_UPSERTED, EventType.ACL_ROLE_DELETED),
    key=str,
    namespace=_no_namespace,
    streamed=False,
)
# One-time tokens (key: the ACL token's accessor id, never a secret): in the
# change log because every write is; they grant nothing by themselves, so no
# cached token is dropped for them.
ONE_TIME_TOKEN = Topic(
    name="OneTimeToken",
    payload="",
    index="",
    tables=(),
    types=(EventType.ONE_TIME_TOKEN_UPSERTED, EventType.ONE_TIME_TOKEN_DELETED),
    key=str,
    namespace=_no_namespace,
    streamed=False,
)

#: every topic, in the order users see them listed
ALL: tuple[Topic, ...] = (
    JOB,
    EVALUATION,
    ALLOCATION,
    NODE,
    DEPLOYMENT,
    OPERATOR,
    JOB_SUMMARY,
    NODE_POOL,
    VARIABLE,
    SERVICE,
    NAMESPACE,
    SCALING_POLICY,
    SCALING_EVENT,
    ROOT_KEY,
    ACL_POLICY,
    ACL_TOKEN,
    ACL_ROLE,
    ONE_TIME_TOKEN,
)
#: the topics `Event.Stream` offers
STREAMED: tuple[Topic, ...] = tuple(t for t in ALL if t.streamed)
#: their names, and "*" (every topic) for the stream's filters
STREAMED_NAMES: tuple[str, ...] = tuple(t.name for t in STREAMED)
ANY = "*"
#: the topics a replica may follow (every one that carries an object)
FOLLOWED_NAMES: tuple[str, ...] = tuple(t.name for t in ALL if t.payload)
#: the names of the ACL topics (a change to them re-resolves tokens)
ACL_NAMES = frozenset((ACL_POLICY.name, ACL_TOKEN.name, ACL_ROLE.name))

_BY_NAME = {t.name: t for t in ALL}
_BY_PAYLOAD = {t.payload: t for t in ALL if t.payload}


def named(name: str) -> Topic | None:
    """The topic called `name` (None: no such topic)."""
    return _BY_NAME.get(name)


def of(ev: pb.Event) -> Topic | None:
    """The topic of `ev`, by the payload it carries (a key-only event's
    by its name); None for a topic we do not know."""
    kind = ev.WhichOneof("payload")
    if kind is not None:
        return _BY_PAYLOAD[kind]
    return _BY_NAME.get(ev.topic)


def payload(ev: pb.Event) -> Any:
    """The object `ev` carries (None for a key-only event)."""
    kind = ev.WhichOneof("payload")
    return getattr(ev, kind) if kind is not None else None


def index_of(topic_name: str) -> str:
    """The table index a change of topic `topic_name` moves ("" for none)."""
    t = _BY_NAME.get(topic_name)
    return t.index if t is not None else ""


def parse_alias(name: str) -> str:
    """A topic name from the CLI's spelling of it (`Eval`, `alloc`, or the
    name itself); anything else comes back unchanged."""
    for t in STREAMED:
        if name in t.aliases:
            return t.name
    return name
