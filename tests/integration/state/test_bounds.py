"""The bounds on a job's and a node's parts (docs/cli.md, "bounds on a
job"): constraints, affinities and spreads per job, group and task; meta
and attribute entry counts, key and value lengths; group and task name
lengths. Each one over is refused with INVALID_ARGUMENT naming the field,
and nothing is written (the index does not move); each one at its limit is
accepted, so the limits are where the docs say."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, MutableMapping
from typing import Any

import grpc
import pytest

from corral.security import transport
from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.app import StateApp

Mutation = Callable[[pb.Job], None]
NodeMutation = Callable[[pb.Node], None]


@pytest.fixture(scope="module")
async def channel(state_addr: str) -> AsyncIterator[grpc.aio.Channel]:
    async with transport.dial(state_addr) as ch:
        yield ch


def _constraint() -> pb.Constraint:
    return pb.Constraint(l_target="${attr.kernel.name}", r_target="linux", operand="=")


def _affinity() -> pb.Affinity:
    return pb.Affinity(l_target="${node.class}", r_target="a", operand="=", weight=50)


def _spread() -> pb.Spread:
    return pb.Spread(attribute="${node.datacenter}", weight=50)


def _meta(n: int, key_len: int = 8, value_len: int = 8) -> dict[str, str]:
    return {f"{i:0{key_len}d}": "v" * value_len for i in range(n)}


def _set(items: Any, values: Iterable[Any]) -> None:
    """Replace a repeated field's or a map's contents (mock objects come
    with a few of their own)."""
    if isinstance(items, MutableMapping):
        items.clear()
        items.update(values)
    else:
        del items[:]
        items.extend(values)


def _task(j: pb.Job) -> pb.Task:
    return j.task_groups[0].tasks[0]


Factory = Callable[[int], Mutation]


def _constraints(where: Callable[[pb.Job], Any]) -> Factory:
    return lambda n: lambda j: _set(where(j).constraints, (_constraint() for _ in range(n)))


def _affinities(where: Callable[[pb.Job], Any]) -> Factory:
    return lambda n: lambda j: _set(where(j).affinities, (_affinity() for _ in range(n)))


def _spreads(where: Callable[[pb.Job], Any]) -> Factory:
    return lambda n: lambda j: _set(where(j).spreads, (_spread() for _ in range(n)))


def _spread_targets(n: int) -> Mutation:
    def mutate(j: pb.Job) -> None:
        sp = j.task_groups[0].spreads.add(attribute="${node.datacenter}", weight=50)
        sp.spread_target.extend(pb.SpreadTarget(value=f"dc{i}", percent=0) for i in range(n))

    return mutate


def _entries(where: Callable[[pb.Job], Any]) -> Factory:
    return lambda n: lambda j: _set(where(j).meta, _meta(n).items())


def _key_len(where: Callable[[pb.Job], Any]) -> Factory:
    return lambda n: lambda j: _set(where(j).meta, _meta(1, key_len=n).items())


def _value_len(where: Callable[[pb.Job], Any]) -> Factory:
    return lambda n: lambda j: _set(where(j).meta, _meta(1, value_len=n).items())


def _name(where: Callable[[pb.Job], Any], letter: str) -> Factory:
    return lambda n: lambda j: setattr(where(j), "name", letter * n)


def _job(j: pb.Job) -> pb.Job:
    return j


def _group(j: pb.Job) -> pb.TaskGroup:
    return j.task_groups[0]


MAX_C, MAX_A, MAX_S = validate.MAX_CONSTRAINTS, validate.MAX_AFFINITIES, validate.MAX_SPREADS
MAX_M = validate.MAX_META_ENTRIES
KEY, VALUE, NAME = validate.MAX_META_KEY_LEN, validate.MAX_META_VALUE_LEN, validate.MAX_NAME_LEN
G, T = "job.task_groups[0]", "job.task_groups[0].tasks[0]"

# (mutation for n items, the limit n, the field named, the problem when over)
JOB_BOUNDS: list[tuple[Factory, int, str, str]] = [
    (_constraints(_job), MAX_C, "job.constraints", f"has {MAX_C + 1} constraints, more than"),
    (_constraints(_group), MAX_C, f"{G}.constraints", "constraints, more than"),
    (_constraints(_task), MAX_C, f"{T}.constraints", "constraints, more than"),
    (_affinities(_job), MAX_A, "job.affinities", f"has {MAX_A + 1} affinities, more than"),
    (_affinities(_group), MAX_A, f"{G}.affinities", "affinities, more than"),
    (_affinities(_task), MAX_A, f"{T}.affinities", "affinities, more than"),
    (_spreads(_job), MAX_S, "job.spreads", f"has {MAX_S + 1} spreads, more than"),
    (_spreads(_group), MAX_S, f"{G}.spreads", "spreads, more than"),
    (_spread_targets, validate.MAX_SPREAD_TARGETS, f"{G}.spreads[0].spread_target", "targets"),
    (_entries(_job), MAX_M, "job.meta", f"has {MAX_M + 1} entries, more than"),
    (_entries(_group), MAX_M, f"{G}.meta", "entries, more than"),
    (_entries(_task), MAX_M, f"{T}.meta", "entries, more than"),
    (_key_len(_job), KEY, "job.meta", f"is longer than {KEY}"),
    (_key_len(_group), KEY, f"{G}.meta", f"is longer than {KEY}"),
    (_key_len(_task), KEY, f"{T}.meta", f"is longer than {KEY}"),
    (_value_len(_job), VALUE, "job.meta[00000000]", f"is longer than {VALUE}"),
    (_value_len(_group), VALUE, f"{G}.meta[00000000]", f"is longer than {VALUE}"),
    (_value_len(_task), VALUE, f"{T}.meta[00000000]", f"is longer than {VALUE}"),
    (_name(_group, "g"), NAME, f"{G}.name", f"is longer than {NAME}"),
    (_name(_task, "t"), NAME, f"{T}.name", f"is longer than {NAME}"),
    (_name(_job, "n"), validate.MAX_ID_LEN, "job.name", "is longer than"),
]


def _id(case: tuple[Any, int, str, str]) -> str:
    return f"{case[2]}:{case[3]}"


@pytest.mark.parametrize("case", JOB_BOUNDS, ids=[_id(c) for c in JOB_BOUNDS])
async def test_job_bounds_refused_over_and_accepted_at_the_limit(
    state_app: StateApp,
    channel: grpc.aio.Channel,
    case: tuple[Factory, int, str, str],
) -> None:
    mutation, limit, field, problem = case
    at_limit, over = mutation(limit), mutation(limit + 1)
    jobs = job_pb2_grpc.JobStub(channel)
    job = mock.job(count=1)
    over(job)
    before = await state_app.db.latest_index()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await jobs.Register(job_pb2.JobRegisterRequest(job=job))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    details = err.value.details() or ""
    assert details.startswith(field) and problem in details, details
    assert await state_app.db.latest_index() == before

    job = mock.job(count=1)
    at_limit(job)
    resp = await jobs.Register(job_pb2.JobRegisterRequest(job=job))
    assert resp.index > before


NodeFactory = Callable[[int], NodeMutation]


def _node_entries(where: Callable[[pb.Node], Any]) -> NodeFactory:
    return lambda n: lambda node: _set(where(node), _meta(n).items())


def _node_key_len(where: Callable[[pb.Node], Any]) -> NodeFactory:
    return lambda n: lambda node: _set(where(node), _meta(1, key_len=n).items())


def _node_value_len(where: Callable[[pb.Node], Any]) -> NodeFactory:
    return lambda n: lambda node: _set(where(node), _meta(1, value_len=n).items())


def _device(node: pb.Node) -> Any:
    dev = node.node_resources.devices.add(vendor="nvidia", type="gpu", name="t4")
    return dev.attributes


NODE_BOUNDS: list[tuple[NodeFactory, int, str, str]] = [
    (_node_entries(lambda n: n.meta), MAX_M, "node.meta", f"has {MAX_M + 1} entries"),
    (_node_entries(lambda n: n.attributes), MAX_M, "node.attributes", "entries, more than"),
    (
        _node_entries(lambda n: n.drivers["mock"].attributes),
        MAX_M,
        "node.drivers[mock].attributes",
        "entries, more than",
    ),
    (_node_entries(_device), MAX_M, "node.node_resources.devices[0].attributes", "entries"),
    (_node_key_len(lambda n: n.meta), KEY, "node.meta", f"is longer than {KEY}"),
    (_node_key_len(lambda n: n.attributes), KEY, "node.attributes", f"is longer than {KEY}"),
    (_node_value_len(lambda n: n.meta), VALUE, "node.meta[00000000]", "is longer than"),
    (_node_value_len(lambda n: n.attributes), VALUE, "node.attributes[00000000]", "longer"),
]


@pytest.mark.parametrize("case", NODE_BOUNDS, ids=[_id(c) for c in NODE_BOUNDS])
async def test_node_bounds_refused_over_and_accepted_at_the_limit(
    state_app: StateApp,
    channel: grpc.aio.Channel,
    case: tuple[NodeFactory, int, str, str],
) -> None:
    mutation, limit, field, problem = case
    within, over = mutation(limit), mutation(limit + 1)
    nodes = node_pb2_grpc.NodeStub(channel)
    node = mock.node()
    over(node)
    before = await state_app.db.latest_index()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    details = err.value.details() or ""
    assert details.startswith(field) and problem in details, details
    assert await state_app.db.latest_index() == before

    node = mock.node()
    within(node)
    resp = await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
    assert resp.index > before


async def test_an_empty_meta_key_is_refused(state_app: StateApp, channel: grpc.aio.Channel) -> None:
    job = mock.job(count=1)
    job.task_groups[0].meta[""] = "x"
    before = await state_app.db.latest_index()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await job_pb2_grpc.JobStub(channel).Register(job_pb2.JobRegisterRequest(job=job))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("job.task_groups[0].meta: has an empty key")
    assert await state_app.db.latest_index() == before
