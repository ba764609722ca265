"""The event stream: our EventStreamResponse as one line of Nomad's NDJSON
(`{"Index": N, "Events": [...]}`, api/event_stream.go's `Events` and
`Event`), each payload in the same Nomad shape the object's own endpoint
answers (one mapping per object, reused), and Nomad's `topic=` parameter
(`Job`, `Job:example`, `Job:*`, `*`) as our EventTopic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.domain import variables
from corral.domain.structs import Topic
from corral.v1 import event_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping import allocs, deployments, evals, jobs, nodes, operator, services

#: our payload field → (Nomad's payload key, the mapping of that object)
_PAYLOADS: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "job": ("Job", jobs.job),
    "evaluation": ("Evaluation", evals.evaluation),
    "allocation": ("Allocation", allocs.alloc),
    "node": ("Node", nodes.node),
    "deployment": ("Deployment", deployments.deployment),
    "scheduler_config": ("SchedulerConfig", operator.scheduler_config),
    "job_summary": ("JobSummary", jobs.summary),
    "service_registration": ("Service", services.registration),
    "node_pool": ("NodePool", nodes.node_pool),
}

#: the topics a client may ask for (Nomad's names), and "*"
TOPICS = (*Topic.ALL, "*")


class TopicError(ValueError):
    """A `topic=` value naming no topic we stream."""


def topic(text: str) -> event_pb2.EventTopic:
    """`Topic[:Key]` (Nomad's form; `Key` `*` or absent = every key)."""
    name, _, key = text.partition(":")
    if name not in TOPICS:
        raise TopicError(f"unknown topic {name!r} (one of {', '.join(TOPICS)})")
    return event_pb2.EventTopic(topic=name, key="" if key in ("", "*") else key)


def _filter_keys(ev: pb.Event) -> list[str] | None:
    """Nomad's FilterKeys: the other ids a `Topic:key` subscription matches."""
    which = ev.WhichOneof("payload")
    if which == "evaluation":
        return [ev.evaluation.job_id, ev.evaluation.deployment_id]
    if which == "allocation":
        return [ev.allocation.job_id, ev.allocation.deployment_id]
    if which == "deployment":
        return [ev.deployment.job_id]
    if which == "service_registration":
        return [ev.service_registration.job_id, ev.service_registration.service_name]
    return None


def event(ev: pb.Event) -> dict[str, Any]:
    """One Nomad event."""
    which = ev.WhichOneof("payload")
    payload: dict[str, Any] = {}
    if which == "variable":  # Nomad's VariableEvent
        payload = {"Metadata": variables.metadata(ev.variable), "Deleted": ev.deleted}
    elif which is not None:
        key, mapping = _PAYLOADS[which]
        payload[key] = mapping(getattr(ev, which))
    return {
        "Topic": ev.topic,
        "Type": ev.type,
        "Key": ev.key,
        "Namespace": ev.namespace,
        "FilterKeys": _filter_keys(ev),
        "Index": ev.index,
        "Payload": payload,
    }


def events(resp: event_pb2.EventStreamResponse) -> dict[str, Any]:
    """One NDJSON line's object: the batch of one index."""
    return {"Index": resp.index, "Events": [event(e) for e in resp.events]}
