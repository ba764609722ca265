"""The consistency contract (docs/consistency.md), under concurrency, on two
real state processes over one PostgreSQL:

* read-your-writes: once a write RPC answers index N, every read on the
  process that answered reflects at least N;
* any process answers a read with `min_index = N - 1` only once it holds N;
* no lost updates: a burst of status changes for one node, sent to either
  process, is each written at an index of its own with its evals.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from corral.security import transport
from corral.testing import mock
from corral.v1 import (
    eval_pb2,
    eval_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    namespace_pb2,
    namespace_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    query_pb2,
)
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster

CLIENTS = 30
WRITES_PER_CLIENT = 10  # 300 registrations, each followed by reads on both processes
NODES = 4
FLIPS_PER_NODE = 50  # 200 interleaved status changes
WAIT_MS = 60_000  # a bound for a loaded machine, not a latency claim


class Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.job = job_pb2_grpc.JobStub(channel)
        self.evals = eval_pb2_grpc.EvalsStub(channel)
        self.node = node_pb2_grpc.NodeStub(channel)
        self.namespaces = namespace_pb2_grpc.NamespaceStub(channel)


@pytest.fixture
async def two_states(make_cluster: Callable[..., Cluster]) -> AsyncIterator[list[Stubs]]:
    cluster = make_cluster()
    procs = [cluster.start("state", name=f"state-{i}") for i in range(2)]
    channels = [transport.dial(p.address) for p in procs]
    try:
        yield [Stubs(ch) for ch in channels]
    finally:
        for ch in channels:
            await ch.close()


def _at_least(index: int) -> query_pb2.QueryOptions:
    """A blocking query that answers once the process holds `index`."""
    return query_pb2.QueryOptions(min_index=index - 1, wait_ms=WAIT_MS)


async def test_reads_follow_acknowledged_writes_on_both_processes(
    two_states: list[Stubs],
) -> None:
    rng = random.Random(7)
    # A write answered at index 1 could not be asked for with `min_index =
    # index - 1`: 0 means "do not block" (Nomad's too), and the other process
    # would answer from whatever it holds. One write first, so every
    # registration below commits at index 2 or later.
    warmup = await two_states[0].job.Register(job_pb2.JobRegisterRequest(job=mock.job()))
    assert warmup.index >= 1

    async def client(n: int) -> list[int]:
        indexes = []
        for i in range(WRITES_PER_CLIENT):
            here, there = rng.sample(two_states, 2)
            job = mock.job(job_id=f"ryw-{n}-{i}")
            reg = await here.job.Register(job_pb2.JobRegisterRequest(job=job))
            indexes.append(reg.index)
            # the same process, with no min_index: must already know the eval and job
            got = await here.evals.Get(eval_pb2.EvalGetRequest(eval_id=reg.eval_id))
            assert got.eval.id == reg.eval_id
            assert got.meta.index >= reg.index
            listed = await here.job.Get(job_pb2.JobGetRequest(job_id=job.id))
            assert listed.job.job_modify_index == reg.job_modify_index
            # the other process, asked for at least the write's index
            other = await there.evals.Get(
                eval_pb2.EvalGetRequest(eval_id=reg.eval_id, query=_at_least(reg.index))
            )
            assert other.eval.id == reg.eval_id
        return indexes

    results = await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    indexes = [i for r in results for i in r]
    # every registration (job + eval) committed at an index of its own or a
    # shared batch; none was dropped
    assert len(indexes) == CLIENTS * WRITES_PER_CLIENT
    for stubs in two_states:
        listed = await stubs.job.List(job_pb2.JobListRequest(query=_at_least(max(indexes))))
        assert sum(j.id.startswith("ryw-") for j in listed.jobs) == len(indexes)


async def _register_node(stubs: Stubs) -> pb.Node:
    node = mock.node(status="initializing")
    await stubs.node.Register(node_pb2.NodeRegisterRequest(node=node))
    resp = await stubs.node.UpdateStatus(
        node_pb2.NodeUpdateStatusRequest(node_id=node.id, status="ready", secret_id=node.secret_id)
    )
    assert resp.index
    return node


async def test_a_burst_of_status_changes_loses_no_update(two_states: list[Stubs]) -> None:
    # a system job, so every node status change that needs evals makes one
    sys_job = mock.system_job(job_id="everywhere")
    await two_states[0].job.Register(job_pb2.JobRegisterRequest(job=sys_job))
    nodes = [await _register_node(two_states[i % 2]) for i in range(NODES)]

    async def flip(k: int, node: pb.Node) -> list[tuple[str, Any]]:
        node_id = node.id
        seen: list[tuple[str, Any]] = []
        last = 0
        for i in range(FLIPS_PER_NODE):
            stubs = two_states[(k + i) % 2]
            status = "down" if i % 2 == 0 else "ready"
            resp = await stubs.node.UpdateStatus(
                node_pb2.NodeUpdateStatusRequest(
                    node_id=node_id, status=status, secret_id=node.secret_id
                )
            )
            # each call changes the node (down <-> ready/initializing), so each
            # is written at a newer index than the one before it
            assert resp.index > last, f"call {i} ({status}) was not written"
            assert resp.node_modify_index == resp.index
            last = resp.index
            if status == "down":
                assert resp.eval_ids, f"call {i}: a node going down must create evals"
            # read-your-writes on the process that answered
            got = await stubs.node.Get(node_pb2.NodeGetRequest(node_id=node_id))
            assert got.node.modify_index >= resp.index
            seen.append((status, resp))
        return seen

    runs = await asyncio.gather(*(flip(k, n) for k, n in enumerate(nodes)))
    made = {e for run in runs for _, r in run for e in r.eval_ids}
    newest = max(r.index for run in runs for _, r in run)
    for stubs in two_states:
        listed = await stubs.evals.List(
            eval_pb2.EvalListRequest(job_id=sys_job.id, query=_at_least(newest))
        )
        node_evals = {e.id for e in listed.evals if e.triggered_by == "node-update"}
        assert made <= node_evals  # every eval a call reported was written


async def test_a_heartbeat_that_changes_nothing_consumes_no_index(
    two_states: list[Stubs],
) -> None:
    node = await _register_node(two_states[0])
    beat = node_pb2.NodeUpdateStatusRequest(
        node_id=node.id, status="ready", secret_id=node.secret_id
    )
    first = await two_states[0].node.UpdateStatus(beat)
    again = await two_states[1].node.UpdateStatus(beat)
    assert again.index == first.index  # the current index, not a new one
    assert not again.eval_ids


async def test_eval_list_across_all_namespaces(two_states: list[Stubs]) -> None:
    stubs = two_states[0]
    await stubs.namespaces.Upsert(
        namespace_pb2.NamespaceUpsertRequest(namespaces=[pb.Namespace(name="team-a")])
    )
    made = []
    for ns in ("default", "team-a"):
        job = mock.job(job_id="everyns")
        job.namespace = ns
        made.append(await stubs.job.Register(job_pb2.JobRegisterRequest(job=job)))
    every = query_pb2.QueryOptions(namespace="*")
    listed = await stubs.evals.List(eval_pb2.EvalListRequest(query=every))
    assert {r.eval_id for r in made} <= {e.id for e in listed.evals}
    by_job = await stubs.evals.List(eval_pb2.EvalListRequest(job_id="everyns", query=every))
    assert {e.namespace for e in by_job.evals} == {"default", "team-a"}
    one = await stubs.evals.List(
        eval_pb2.EvalListRequest(job_id="everyns", query=query_pb2.QueryOptions())
    )
    assert {e.namespace for e in one.evals} == {"default"}


async def test_a_relayed_heartbeat_carries_the_leaders_refusal(two_states: list[Stubs]) -> None:
    """Whichever process the client reaches, a heartbeat the leader refuses
    is refused (not handled again by the process that relayed it)."""
    node = mock.node(status="initializing")
    node.secret_id = "the-right-secret"
    await two_states[0].node.Register(node_pb2.NodeRegisterRequest(node=node))
    for stubs in two_states:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.node.UpdateStatus(
                node_pb2.NodeUpdateStatusRequest(
                    node_id=node.id, status="ready", secret_id="a-wrong-secret"
                )
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.node.UpdateStatus(
                node_pb2.NodeUpdateStatusRequest(
                    node_id="no-such-node", status="ready", secret_id="a-secret"
                )
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
