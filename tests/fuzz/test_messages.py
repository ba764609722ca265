"""The descriptor-driven strategies themselves (no cluster): they reach
every kind of field, respect oneofs and the depth bound, and always build a
message the protobuf runtime can serialize."""

from __future__ import annotations

from functools import partial

from google.protobuf.message import Message
from hypothesis import HealthCheck, find, given, settings

from corral.v1 import event_pb2, job_pb2, node_pb2
from corral.v1 import structs_pb2 as pb
from tests.fuzz import messages, mutate
from tests.fuzz.pool import Pool

FAST = settings(
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _depth(msg: Message) -> int:
    deepest = 0
    for fd, value in msg.ListFields():
        if fd.message_type is None or messages.is_map(fd):
            continue
        for sub in value if fd.is_repeated else [value]:
            deepest = max(deepest, 1 + _depth(sub))
    return deepest


@FAST
@given(messages.messages(pb.Job.DESCRIPTOR, depth=2))
def test_generated_jobs_serialize_and_stay_within_the_depth(job: Message) -> None:
    assert pb.Job.FromString(job.SerializeToString()) == job
    assert _depth(job) <= 3  # depth 2 below the job, plus the last level's own fields


@FAST
@given(messages.messages(pb.Event.DESCRIPTOR, depth=1))
def test_a_oneof_holds_at_most_one_member(event: Message) -> None:
    oneof = pb.Event.DESCRIPTOR.oneofs_by_name["payload"]
    assert sum(event.HasField(f.name) for f in oneof.fields) <= 1


def _kinds(msg: Message) -> set[str]:
    out: set[str] = set()
    for fd, _ in msg.ListFields():
        kind = "map" if messages.is_map(fd) else "repeated" if fd.is_repeated else ""
        out.add(kind or str(fd.type))
    return out


def test_every_kind_of_field_is_generated() -> None:
    """Scalars, strings, bytes, repeated fields, maps and nested messages
    all get values (hypothesis finds an example of each)."""
    F = messages.F
    search = settings(FAST, max_examples=500)
    for desc, kind in [
        (job_pb2.JobDispatchRequest.DESCRIPTOR, "map"),
        (job_pb2.JobDispatchRequest.DESCRIPTOR, str(F.TYPE_BYTES)),
        (job_pb2.JobDispatchRequest.DESCRIPTOR, str(F.TYPE_STRING)),
        (event_pb2.EventStreamRequest.DESCRIPTOR, "repeated"),
        (event_pb2.EventStreamRequest.DESCRIPTOR, str(F.TYPE_UINT64)),
        (node_pb2.NodeRegisterRequest.DESCRIPTOR, str(F.TYPE_MESSAGE)),
    ]:
        found = find(messages.messages(desc), partial(_has_kind, kind), settings=search)
        assert kind in _kinds(found)


def _has_kind(kind: str, msg: Message) -> bool:
    return kind in _kinds(msg)


def test_mutated_requests_start_valid_and_use_the_pool() -> None:
    """With no mutation drawn, a request is what a client would send: real
    ids from the pool, the node's own secret."""
    node = pb.Node(id="node-1", secret_id="s-1", status="ready")
    pool = Pool(nodes=[node], secrets={"node-1": "s-1"})
    found: list[Message] = []

    @FAST
    @given(mutate.mutated_requests(node_pb2.NodeUpdateStatusRequest.DESCRIPTOR, pool))
    def collect(msg: Message) -> None:
        found.append(msg)

    collect()
    valid = [
        m
        for m in found
        if isinstance(m, node_pb2.NodeUpdateStatusRequest)
        and m.node_id == "node-1"
        and m.secret_id == "s-1"
    ]
    assert valid, "no request spoke for the pool's node with its secret"
