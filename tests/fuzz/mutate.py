"""Mutated valid requests: start from a request the cluster would accept
(built from the request's descriptor, real ids from the pool and valid
objects from `corral.testing.mock`), then break one to three fields of it:
unknown and foreign ids, prefixes, hostile namespaces, huge and negative
numbers, a sub-message cleared or made of noise, a list entry repeated.

Fields are matched by name (`job_id`, `node_id`, `secret_id`, ...) and
message type (`types.Job`, `types.Node`, ...), never by RPC, so a new RPC
whose request reuses those names is covered without a line here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from corral.domain import structs, topics
from corral.domain.structs import new_id
from corral.testing import mock
from corral.v1 import query_pb2
from corral.v1 import structs_pb2 as pb
from tests.fuzz import messages
from tests.fuzz.messages import F, Field, Hints, is_map, message_class, sub_type
from tests.fuzz.pool import Pool

SECOND = structs.SECOND
M = TypeVar("M", bound=Message)


def _ends(*suffixes: str) -> Callable[[str], bool]:
    return lambda name: name.endswith(suffixes)


def hints(pool: Pool) -> Hints:
    """Real values for string fields, by field name (the last rule offers
    the vocabulary to every string)."""
    return Hints(
        strings=[
            (_ends("job_id", "parent_id"), pool.job_ids()),
            (_ends("node_id", "node_ids"), pool.node_ids()),
            (_ends("alloc_id", "alloc_ids"), pool.alloc_ids()),
            (_ends("eval_id", "eval_ids"), pool.eval_ids()),
            (_ends("deployment_id"), pool.deployment_ids()),
            (lambda n: n in ("id", "ids", "key"), pool.all_ids()),
            (_ends("namespace"), pool.namespaces()),
            (_ends("secret_id"), pool.secret_values()),
            (lambda n: n in ("prefix", "next_token"), pool.prefixes()),
            (lambda n: n in ("group", "groups", "task_group", "name", "task"), pool.groups()),
            (lambda n: True, pool.words),
        ]
    )


#: the accepted values of the enumerated string fields, by field name
#: (a name used in several messages gets every set it may mean)
ACCEPTED: dict[str, tuple[str, ...]] = {
    "status": (*structs.NodeStatus.ALL, *structs.EvalStatus.ALL),
    "client_status": structs.ClientStatus.ALL,
    "desired_status": structs.DesiredStatus.ALL,
    "eligibility": structs.Eligibility.ALL,
    "scheduling_eligibility": structs.Eligibility.ALL,
    "type": structs.JobType.ALL,
    "triggered_by": tuple(sorted(structs.Trigger.ALL)),
    "topic": (*topics.STREAMED_NAMES, topics.ANY),
    "origin": ("start", "end"),
    "schedulers": structs.JobType.ALL,
    "enabled_schedulers": structs.JobType.ALL,
}


# ------------------------------------------------------------ valid objects


def _job_seeds(pool: Pool) -> list[Callable[[], pb.Job]]:
    def stored(j: pb.Job) -> Callable[[], pb.Job]:
        return lambda: _copy(j)

    return [
        lambda: mock.job(count=2),
        lambda: mock.batch_job(count=1),
        lambda: mock.system_job(),
        lambda: mock.sysbatch_job(),
        *(stored(j) for j in pool.jobs[:10]),
    ]


def _node_seeds(pool: Pool) -> list[Callable[[], pb.Node]]:
    def stored(n: pb.Node) -> Callable[[], pb.Node]:
        def make() -> pb.Node:
            out = _copy(n)
            out.secret_id = pool.secret_of(n.id) or out.secret_id
            return out

        return make

    return [lambda: mock.node(), *(stored(n) for n in pool.nodes[:10])]


def _copy(m: M) -> M:
    out = type(m)()
    out.CopyFrom(m)
    return out


def _valid_message(draw: st.DrawFn, desc: Descriptor, pool: Pool) -> Message | None:
    """A valid object for a message type the cluster stores, or None."""
    name = desc.full_name
    if name == pb.Job.DESCRIPTOR.full_name:
        return draw(st.sampled_from(_job_seeds(pool)))()
    if name == pb.Node.DESCRIPTOR.full_name:
        return draw(st.sampled_from(_node_seeds(pool)))()
    if name == pb.Allocation.DESCRIPTOR.full_name and pool.allocs:
        alloc: pb.Allocation = _copy(draw(st.sampled_from(pool.allocs)))
        alloc.client_status = draw(st.sampled_from(structs.ClientStatus.ALL))
        return alloc
    if name == pb.Evaluation.DESCRIPTOR.full_name and pool.jobs:
        return mock.eval_for(draw(st.sampled_from(pool.jobs)))
    if name == pb.DrainStrategy.DESCRIPTOR.full_name:
        return pb.DrainStrategy(deadline=draw(st.sampled_from([-1, 0, 3600 * SECOND])))
    if name == pb.SchedulerConfiguration.DESCRIPTOR.full_name and pool.scheduler_config:
        return _copy(pool.scheduler_config)
    if name == query_pb2.QueryOptions.DESCRIPTOR.full_name:
        return query_pb2.QueryOptions(
            namespace=draw(st.sampled_from(["", "default"])),
            min_index=draw(st.sampled_from([0, 0, pool.index])),
            wait_ms=draw(st.sampled_from([0, 10, 100])),
            per_page=draw(st.integers(0, 3)),
            prefix=draw(st.sampled_from(["", *pool.prefixes()[:5]])),
        )
    return None


def valid_request(draw: st.DrawFn, desc: Descriptor, pool: Pool, *, depth: int = 2) -> Message:
    """A request of type `desc` as a well-behaved client would send it."""
    known = _valid_message(draw, desc, pool)
    if known is not None:
        return known
    msg = message_class(desc)()
    h = hints(pool)
    for fd in desc.fields:
        if fd.containing_oneof is not None and len(fd.containing_oneof.fields) > 1:
            continue  # a real oneof: left for the mutations
        if fd.type == F.TYPE_MESSAGE and not is_map(fd):
            # the objects a request is about are always there; other parts
            # of it (options, filters) half of the time
            stored_type = _valid_message(draw, sub_type(fd), pool) is not None
            if not stored_type and (depth <= 0 or not draw(st.booleans())):
                continue
            n = draw(st.integers(1, 2)) if fd.is_repeated else 1
            for _ in range(n):
                sub = valid_request(draw, sub_type(fd), pool, depth=depth - 1)
                if fd.is_repeated:
                    getattr(msg, fd.name).add().CopyFrom(sub)
                else:
                    getattr(msg, fd.name).CopyFrom(sub)
            continue
        if fd.type == F.TYPE_STRING and not is_map(fd):
            known_values = [v for rule, values in h.strings[:-1] if rule(fd.name) for v in values]
            known_values += ACCEPTED.get(fd.name, ())
            if not known_values:
                continue
            if fd.is_repeated:
                picked = draw(st.lists(st.sampled_from(known_values), max_size=5, unique=True))
                getattr(msg, fd.name).extend(picked)
            else:
                setattr(msg, fd.name, draw(st.sampled_from(known_values)))
            continue
        if fd.type in messages.INT_RANGES and not fd.is_repeated:
            setattr(msg, fd.name, draw(st.integers(0, 3)))
        elif fd.type == F.TYPE_BOOL and not fd.is_repeated:
            setattr(msg, fd.name, draw(st.booleans()))
    _match_secret(msg, pool)
    return msg


def _node_of(msg: Message) -> str:
    """The node a request speaks for: its node_id, its node's, its allocs'."""
    for fd, value in msg.ListFields():
        if fd.name == "node_id" and isinstance(value, str):
            return value
        if fd.name == "node" and fd.type == F.TYPE_MESSAGE and not fd.is_repeated:
            return str(value.id)
        if fd.type == F.TYPE_MESSAGE and fd.is_repeated and not is_map(fd) and len(value):
            first = value[0]
            if "node_id" in first.DESCRIPTOR.fields_by_name and first.node_id:
                return str(first.node_id)
    return ""


def _match_secret(msg: Message, pool: Pool) -> None:
    """Give a node request the secret of the node it speaks for."""
    if "secret_id" not in msg.DESCRIPTOR.fields_by_name:
        return
    secret = pool.secret_of(_node_of(msg))
    if secret:
        msg.secret_id = secret  # type: ignore[attr-defined]


# ---------------------------------------------------------------- mutations


def _fields(msg: Message, depth: int = 5) -> list[tuple[Message, Field]]:
    """(message, field) for every field of `msg` and of its set sub-messages."""
    out: list[tuple[Message, Field]] = [(msg, fd) for fd in msg.DESCRIPTOR.fields]
    if depth <= 0:
        return out
    for fd, value in msg.ListFields():
        if fd.type != F.TYPE_MESSAGE or is_map(fd):
            continue
        for sub in value if fd.is_repeated else [value]:
            out.extend(_fields(sub, depth - 1))
    return out


def _hostile_id(pool: Pool) -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(new_id),  # unknown
        st.sampled_from(pool.all_ids() or [""]),  # another object's (a foreign node's)
        st.sampled_from(pool.prefixes() or ["a"]),
        st.sampled_from(messages.HOSTILE_STRINGS),
    )


def mutate_field(draw: st.DrawFn, msg: Message, fd: Field, pool: Pool) -> None:
    """Break one field of `msg`."""
    h = hints(pool)
    if fd.type == F.TYPE_MESSAGE and not is_map(fd):
        how = draw(st.sampled_from(["clear", "noise", "repeat", "flood"]))
        if how == "clear":
            msg.ClearField(fd.name)
            return
        items = getattr(msg, fd.name)
        if how in ("repeat", "flood") and fd.is_repeated and len(items):
            # the same entry twice, or past the bounds on counts (1,000
            # groups, 100 tasks, ...) with entries that are valid one by one
            times = 1 if how == "repeat" else draw(st.sampled_from([101, 1_001, 5_000]))
            first = _copy(items[0])
            for _ in range(times):
                items.add().CopyFrom(first)
            return
    if fd.type == F.TYPE_STRING and not is_map(fd) and fd.name.endswith(("id", "ids")):
        value = draw(_hostile_id(pool))
        if fd.is_repeated:
            getattr(msg, fd.name).append(value)
        else:
            setattr(msg, fd.name, value)
        return
    messages.set_field(draw, msg, fd, depth=2, hints=h, max_items=3)


def mutated_requests(desc: Descriptor, pool: Pool) -> st.SearchStrategy[Message]:
    """A valid request of type `desc` with zero to three fields broken."""

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = valid_request(draw, desc, pool)
        for _ in range(draw(st.integers(0, 3))):
            candidates = _fields(msg)
            if not candidates:
                break
            target, fd = draw(st.sampled_from(candidates))
            mutate_field(draw, target, fd, pool)
        return msg

    return build()


def learn(request: Message, pool: Pool) -> None:
    """Remember the secret of a node a successful request registered, so
    later requests can speak for it (and for it against other nodes)."""
    for fd, value in request.ListFields():
        if fd.type != F.TYPE_MESSAGE or fd.is_repeated:
            continue
        if value.DESCRIPTOR.full_name == pb.Node.DESCRIPTOR.full_name and value.secret_id:
            pool.secrets[value.id] = value.secret_id
