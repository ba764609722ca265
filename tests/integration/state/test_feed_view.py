"""Filtered feeds (corral/runtime/feed_view.py): a replica with the broker's view
holds exactly the full replica's objects on the topics and alloc fields it
keeps, whether it bootstrapped before the writes and followed them or
bootstrapped after them; subscribers of one view get the same bytes."""

from __future__ import annotations

import grpc
import pytest

from corral.domain import topics
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, copy_msg, new_id
from corral.runtime import feed_view
from corral.runtime.feed_view import BROKER_STATUS_VIEW as BROKER_VIEW
from corral.runtime.feed_view import FeedView
from corral.runtime.replica import Replica
from corral.security import transport
from corral.testing import mock
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp


async def _write_mix(app: StateApp, tag: str) -> int:
    """Nodes, a job with its summary, an eval, a deployment and allocs full
    of fields the broker never reads; then an alloc update and a delete."""
    n = mock.node()
    j = mock.job(job_id=f"{tag}-{new_id()[:8]}", count=3)
    d = pb.Deployment(id=new_id(), namespace=j.namespace, job_id=j.id, status="running")
    allocs = []
    for i in range(3):
        a = mock.alloc(j, n, index=i)
        a.deployment_id = d.id
        a.metrics.nodes_evaluated = 40
        a.metrics.nodes_available["dc1"] = 40
        a.task_states["web"].state = "running"
        a.client_description = "running fine"
        a.deployment_status.healthy = True
        allocs.append(a)
    async with app.db.write() as tx:
        tx.put_node(n)
        tx.put_job(j)
        tx.put_job_summary(pb.JobSummary(namespace=j.namespace, job_id=j.id))
        tx.put_eval(mock.eval_for(j))
        tx.put_deployment(d)
        for a in allocs:
            tx.put_alloc(a)
    done = copy_msg(allocs[0])
    done.client_status = ClientStatus.COMPLETE
    async with app.db.write() as tx:
        tx.put_alloc(done)
    async with app.db.write() as tx:
        tx.delete_alloc(allocs[1])
    return tx.index


def _kept(full: StateSnapshot, view: FeedView) -> dict[str, object]:
    """What a replica of `view` must hold, from a full replica's snapshot."""
    return {
        "index": full.index,
        "jobs": dict(full.jobs.items()),
        "nodes": dict(full.nodes.items()),
        "evals": dict(full.evals.items()),
        "deployments": dict(full.deployments.items()),
        "allocs": {k: view.alloc(a) for k, a in full.allocs.items()},
        "job_summaries": dict(full.job_summaries.items())
        if view.wants(topics.JOB_SUMMARY.name)
        else {},
        "scheduler_config": full.scheduler_config,
    }


def _held(snap: StateSnapshot) -> dict[str, object]:
    return {
        "index": snap.index,
        "jobs": dict(snap.jobs.items()),
        "nodes": dict(snap.nodes.items()),
        "evals": dict(snap.evals.items()),
        "deployments": dict(snap.deployments.items()),
        "allocs": dict(snap.allocs.items()),
        "job_summaries": dict(snap.job_summaries.items()),
        "scheduler_config": snap.scheduler_config,
    }


async def test_broker_view_replica_equals_the_full_one_on_what_it_keeps(
    state_app: StateApp, state_addr: str
) -> None:
    await _write_mix(state_app, "before")
    full = Replica(state_addr, name="full", view=FeedView())
    followed = Replica(state_addr, name="broker-followed", view=BROKER_VIEW)
    await full.start()
    await followed.start()
    late: Replica | None = None
    try:
        last = await _write_mix(state_app, "after")
        full_snap = await full.wait_for_index(last, 10)
        followed_snap = await followed.wait_for_index(last, 10)
        late = Replica(state_addr, name="broker-late", view=BROKER_VIEW)
        await late.start()  # bootstraps at `last` from a filtered snapshot
        late_snap = late.snapshot()
        assert late_snap.index == last

        want = _kept(full_snap, BROKER_VIEW)
        assert _held(followed_snap) == want
        assert _held(late_snap) == want
        assert dict(late_snap.table_indexes.items()) == dict(followed_snap.table_indexes.items())
        # the broker's allocs carry what it reads and nothing heavy
        a = next(iter(followed_snap.allocs.values()))
        assert a.deployment_status.healthy and a.client_status and a.node_id and a.job_id
        assert not a.HasField("metrics") and not a.task_states and not a.client_description
        assert not a.HasField("resources")
        # the secondary indexes agree too
        for key, allocs in full_snap.allocs_by_job_map.items():
            assert set(followed_snap.allocs_by_job_map[key].keys()) == set(allocs.keys())
            assert set(late_snap.allocs_by_job_map[key].keys()) == set(allocs.keys())
        # the full replica still sees the summaries the broker does not take
        assert full_snap.job_summaries
    finally:
        for r in (full, followed, late):
            if r is not None:
                await r.stop()


async def test_default_replica_keeps_everything_but_placement_metrics(
    state_app: StateApp, state_addr: str
) -> None:
    full = Replica(state_addr, name="full2", view=FeedView())
    default = Replica(state_addr, name="default")
    await full.start()
    await default.start()
    try:
        last = await _write_mix(state_app, "sched")
        want = _kept(await full.wait_for_index(last, 10), FeedView.of((), feed_view.SCHEDULING))
        assert _held(await default.wait_for_index(last, 10)) == want
        assert any(a.task_states for a in default.snapshot().allocs.values())
    finally:
        await full.stop()
        await default.stop()


async def test_subscribers_of_one_view_get_the_same_bytes(
    state_app: StateApp, state_addr: str
) -> None:
    start = state_app.feed.index
    last = await _write_mix(state_app, "bytes")
    channel = transport.dial(state_addr)
    try:
        stub = state_pb2_grpc.StateStub(channel)
        request = state_pb2.SubscribeRequest(
            from_index=start,
            topics=sorted(BROKER_VIEW.topics),
            alloc_view=feed_view.STATUS,  # type: ignore[arg-type]
        )
        seen: list[list[pb.ChangeBatch]] = []
        for _ in range(2):
            got: list[pb.ChangeBatch] = []
            async for batch in stub.Subscribe(request):
                got.append(batch)
                if batch.index >= last:
                    break
            seen.append(got)
        assert [b.index for b in seen[0]] == list(range(start + 1, last + 1))
        assert seen[0] == seen[1]
        for batch in seen[0]:
            assert all(BROKER_VIEW.wants(e.topic) for e in batch.events)
            assert all(not e.allocation.HasField("metrics") for e in batch.events)
            # encoded once for the view: the same bytes object for every stream
            cached = state_app.feed.encoded(batch, BROKER_VIEW)
            assert state_app.feed.encoded(batch, BROKER_VIEW) is cached
            assert pb.ChangeBatch.FromString(cached) == batch
    finally:
        await channel.close()


async def test_unknown_alloc_view_is_invalid_argument(
    state_stub: state_pb2_grpc.StateAsyncStub,
) -> None:
    for call in (
        lambda: state_stub.Subscribe(state_pb2.SubscribeRequest(alloc_view=9)),  # type: ignore[arg-type]
        lambda: state_stub.Snapshot(state_pb2.SnapshotRequest(alloc_view=9)),  # type: ignore[arg-type]
        lambda: state_stub.Snapshot(state_pb2.SnapshotRequest(topics=["Weather"])),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call():
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "alloc_view" in (err.value.details() or "") or "topics" in (
            err.value.details() or ""
        )
