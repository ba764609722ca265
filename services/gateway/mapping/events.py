"""The event stream: our EventStreamResponse as one line of Nomad's NDJSON
(`{"Index": N, "Events": [...]}`, api/event_stream.go's `Events` and
`Event`), each payload in the same Nomad shape the object's own endpoint
answers (one mapping per object, reused) under the topic's Nomad payload
key, and Nomad's `topic=` parameter (`Job`, `Job:example`, `Job:*`, `*`) as
our EventTopic. What a topic is called and keyed by comes from the topic
registry (`corral.domain.topics`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.domain import topics, variables
from corral.v1 import event_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping import allocs, deployments, evals, jobs, nodes, operator, services

#: the mapping of each streamed topic's object to Nomad's JSON
_MAPPINGS: dict[topics.Topic, Callable[[Any], dict[str, Any]]] = {
    topics.JOB: jobs.job,
    topics.EVALUATION: evals.evaluation,
    topics.ALLOCATION: allocs.alloc,
    topics.NODE: nodes.node,
    topics.DEPLOYMENT: deployments.deployment,
    topics.OPERATOR: operator.scheduler_config,
    topics.JOB_SUMMARY: jobs.summary,
    topics.SERVICE: services.registration,
    topics.NODE_POOL: nodes.node_pool,
}

#: the topics a client may ask for (Nomad's names), and "*"
TOPICS = (*topics.STREAMED_NAMES, topics.ANY)


class TopicError(ValueError):
    """A `topic=` value naming no topic we stream."""


def topic(text: str) -> event_pb2.EventTopic:
    """`Topic[:Key]` (Nomad's form; `Key` `*` or absent = every key)."""
    name, _, key = text.partition(":")
    if name not in TOPICS:
        raise TopicError(f"unknown topic {name!r} (one of {', '.join(TOPICS)})")
    return event_pb2.EventTopic(topic=name, key="" if key in ("", topics.ANY) else key)


def event(ev: pb.Event) -> dict[str, Any]:
    """One Nomad event."""
    t = topics.of(ev)
    obj = topics.payload(ev)
    payload: dict[str, Any] = {}
    filter_keys: list[str] | None = None
    if t is topics.VARIABLE:  # Nomad's VariableEvent
        payload = {"Metadata": variables.metadata(ev.variable), "Deleted": ev.deleted}
    elif t is not None and obj is not None:
        payload[t.payload_key] = _MAPPINGS[t](obj)
    if t is not None and obj is not None:
        filter_keys = list(t.filter_keys(obj)) or None
    return {
        "Topic": ev.topic,
        "Type": ev.type,
        "Key": ev.key,
        "Namespace": ev.namespace,
        "FilterKeys": filter_keys,
        "Index": ev.index,
        "Payload": payload,
    }


def events(resp: event_pb2.EventStreamResponse) -> dict[str, Any]:
    """One NDJSON line's object: the batch of one index."""
    return {"Index": resp.index, "Events": [event(e) for e in resp.events]}
