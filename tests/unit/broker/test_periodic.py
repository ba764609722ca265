"""The periodic dispatcher on an injected clock (no real waiting): launches
on each tick of several crons, prohibit_overlap, the missed-launch rule on
takeover (launch once, not once per missed tick), force, and tracking
through the feed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from corral.domain import periodic
from corral.domain.errors import FailedPrecondition, NotFound
from corral.domain.store import StateSnapshot, StateStore
from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb
from services.broker.periodic import JobKey, PeriodicDispatcher, PeriodicTracker, has_running_child

T0 = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **kw: float) -> None:
        self.at += timedelta(**kw)


class _Refused(grpc.aio.AioRpcError):
    def __init__(
        self, details: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION
    ) -> None:
        super().__init__(
            code,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details=details,
        )


class Cluster:
    """What the dispatcher sees of the state: a snapshot it reads, launch
    records, and a create-only Job.Register that records each child."""

    def __init__(self, *jobs: pb.Job) -> None:
        self.jobs = {(j.namespace, j.id): j for j in jobs}
        self.evals: list[pb.Evaluation] = []
        self.allocs: list[pb.Allocation] = []
        self.launches: dict[JobKey, int] = {}
        self.children: list[str] = []
        self.unavailable_for: set[str] = set()  # parents whose launches fail

    def snapshot(self) -> StateSnapshot:
        return StateStore.build(
            len(self.children) + 1,
            jobs=list(self.jobs.values()),
            evals=self.evals,
            allocs=self.allocs,
        )

    async def register(self, child: pb.Job) -> job_pb2.JobRegisterResponse:
        if child.parent_id in self.unavailable_for:
            raise _Refused("state unavailable", grpc.StatusCode.UNAVAILABLE)
        if (child.namespace, child.id) in self.jobs:
            raise _Refused(f"job {child.id!r} already exists")
        self.jobs[(child.namespace, child.id)] = child
        self.children.append(child.id)
        ev = pb.Evaluation(id=f"eval-{child.id}", job_id=child.id, namespace="default")
        ev.status = "pending"
        self.evals.append(ev)
        return job_pb2.JobRegisterResponse(eval_id=ev.id, index=len(self.children))

    async def read_launches(self) -> tuple[dict[JobKey, int], int]:
        return dict(self.launches), len(self.children)

    async def catch_up(self, index: int) -> StateSnapshot:
        return self.snapshot()

    def finish(self, child_id: str) -> None:
        for ev in self.evals:
            if ev.job_id == child_id:
                ev.status = "complete"

    def dispatcher(self, clock: Clock) -> PeriodicDispatcher:
        return PeriodicDispatcher(
            self.snapshot, self.register, self.read_launches, catch_up=self.catch_up, clock=clock
        )


def parent(job_id: str = "report", *crons: str, overlap: bool = False, tz: str = "") -> pb.Job:
    specs = list(crons) or ["*/15 * * * *"]
    return pb.Job(
        id=job_id,
        namespace="default",
        type="batch",
        periodic=pb.PeriodicConfig(
            enabled=True, crons=specs, prohibit_overlap=overlap, time_zone=tz
        ),
        task_groups=[pb.TaskGroup(name="g", count=1)],
    )


def child_at(job_id: str, at: datetime) -> str:
    return periodic.child_id(job_id, at)


def test_tracker_pops_each_tick_of_several_crons_in_order() -> None:
    tracker = PeriodicTracker()
    tracker.update(parent("a", "0 * * * *", "30 10 * * *"), T0)
    tracker.update(parent("b", "*/20 * * * *"), T0)
    assert tracker.next_wake() == T0 + timedelta(minutes=20)
    due = tracker.pop_due(T0 + timedelta(minutes=59))
    assert [(j.id, at - T0) for j, at in due] == [
        ("b", timedelta(minutes=20)),
        ("a", timedelta(minutes=30)),
        ("b", timedelta(minutes=40)),
    ]
    assert tracker.next_wake() == T0 + timedelta(hours=1)
    assert tracker.pop_due(T0 + timedelta(minutes=59)) == []


def test_tracker_reschedules_a_changed_spec_and_drops_a_stopped_job() -> None:
    tracker = PeriodicTracker()
    job = parent("a", "0 * * * *")
    tracker.update(job, T0)
    same = pb.Job()
    same.CopyFrom(job)
    same.status = "running"  # not a spec change: the next launch stays
    tracker.update(same, T0 + timedelta(minutes=50))
    assert tracker.next_launch(("default", "a")) == T0 + timedelta(hours=1)
    changed = parent("a", "*/5 * * * *")
    tracker.update(changed, T0 + timedelta(minutes=50))
    assert tracker.next_launch(("default", "a")) == T0 + timedelta(minutes=55)
    changed.stop = True
    tracker.update(changed, T0 + timedelta(minutes=51))
    assert len(tracker) == 0 and tracker.next_wake() is None


async def test_dispatcher_launches_on_each_tick_by_the_clock() -> None:
    job = parent("report", "*/15 * * * *")
    c = Cluster(job)
    c.launches[("default", "report")] = periodic.to_unix_ns(T0)
    clock = Clock(T0 + timedelta(minutes=1))
    d = c.dispatcher(clock)
    assert await d.restore() == 0  # registered a minute ago: nothing missed
    assert await d.launch_due() == 0
    clock.advance(minutes=14)
    assert await d.launch_due() == 1
    clock.advance(minutes=15)
    assert await d.launch_due() == 1
    assert c.children == [
        child_at("report", T0 + timedelta(minutes=15)),
        child_at("report", T0 + timedelta(minutes=30)),
    ]


async def test_prohibit_overlap_skips_while_a_child_is_pending_or_running() -> None:
    job = parent("report", "*/15 * * * *", overlap=True)
    c = Cluster(job)
    c.launches[("default", "report")] = periodic.to_unix_ns(T0)
    clock = Clock(T0)
    d = c.dispatcher(clock)
    await d.restore()
    clock.advance(minutes=15)
    await d.launch_due()
    first = c.children[0]
    assert has_running_child(c.snapshot(), job)  # its eval is still pending
    clock.advance(minutes=15)
    await d.launch_due()
    assert c.children == [first]  # skipped
    # the eval completes but an alloc still runs: still skipped
    c.finish(first)
    alloc = pb.Allocation(id="a1", job_id=first, namespace="default", eval_id=f"eval-{first}")
    alloc.desired_status, alloc.client_status = "run", "running"
    c.allocs.append(alloc)
    clock.advance(minutes=15)
    await d.launch_due()
    assert c.children == [first]
    # dead: the next tick launches
    alloc.client_status = "complete"
    assert not has_running_child(c.snapshot(), job)
    clock.advance(minutes=15)
    await d.launch_due()
    assert c.children == [first, child_at("report", T0 + timedelta(hours=1))]


async def test_missed_ticks_after_a_leader_change_launch_once() -> None:
    job = parent("report", "*/15 * * * *")
    c = Cluster(job)
    last = T0 + timedelta(minutes=15)
    c.launches[("default", "report")] = periodic.to_unix_ns(last)
    # no leader for ten ticks
    takeover = last + timedelta(minutes=150, seconds=7)
    clock = Clock(takeover)
    d = c.dispatcher(clock)
    assert await d.restore() == 1
    assert c.children == [child_at("report", takeover)]
    # then the cron spec again, from now on: nothing until the next tick
    assert await d.launch_due() == 0
    assert d.tracker.next_launch(("default", "report")) == last + timedelta(minutes=165)
    clock.at = last + timedelta(minutes=165)
    assert await d.launch_due() == 1
    assert len(c.children) == 2
    # another takeover straight after launches nothing
    d.disable()
    assert await c.dispatcher(clock).restore() == 0
    assert len(c.children) == 2


async def test_takeover_before_the_next_tick_launches_nothing() -> None:
    job = parent("report", "0 * * * *")
    c = Cluster(job)
    c.launches[("default", "report")] = periodic.to_unix_ns(T0 + timedelta(minutes=5))
    d = c.dispatcher(Clock(T0 + timedelta(minutes=59)))
    assert await d.restore() == 0 and c.children == []


async def test_missed_launch_uses_the_newest_child_when_it_is_newer_than_the_record() -> None:
    job = parent("report", "0 * * * *")
    c = Cluster(job)
    c.launches[("default", "report")] = periodic.to_unix_ns(T0 - timedelta(hours=5))
    # a child launched at T0 committed after the records were read
    await c.register(periodic.derive_child(job, T0))
    d = c.dispatcher(Clock(T0 + timedelta(minutes=30)))
    assert await d.restore() == 0 and len(c.children) == 1


async def test_missed_launch_respects_prohibit_overlap() -> None:
    job = parent("report", "0 * * * *", overlap=True)
    c = Cluster(job)
    await c.register(periodic.derive_child(job, T0))  # still pending
    c.launches[("default", "report")] = periodic.to_unix_ns(T0)
    d = c.dispatcher(Clock(T0 + timedelta(hours=3)))
    assert await d.restore() == 0 and len(c.children) == 1


async def test_force_launches_now_whatever_the_spec_and_overlap() -> None:
    job = parent("report", "0 0 1 1 *", overlap=True)
    c = Cluster(job, pb.Job(id="plain", namespace="default", type="batch"))
    c.launches[("default", "report")] = periodic.to_unix_ns(T0)
    clock = Clock(T0 + timedelta(seconds=30))
    d = c.dispatcher(clock)
    await d.restore()
    first = await d.force("", "report")
    assert first.child_id == child_at("report", clock.at) and first.response.eval_id
    with pytest.raises(FailedPrecondition):
        await d.force("default", "report")  # the same second
    clock.advance(seconds=1)
    await d.force("default", "report")  # a child still pending does not stop a force
    assert len(c.children) == 2
    with pytest.raises(NotFound):
        await d.force("default", "nope")
    with pytest.raises(FailedPrecondition):
        await d.force("default", "plain")


async def test_feed_tracks_new_changed_and_stopped_parents() -> None:
    c = Cluster()
    clock = Clock(T0)
    d = c.dispatcher(clock)
    await d.restore()
    job = parent("late", "*/10 * * * *")
    snap = c.snapshot()
    batch = pb.ChangeBatch(index=2)
    batch.events.add(topic="Job", type="JobRegistered", key=job.id, job=job)
    d.on_batch(batch, snap)
    assert d.tracker.next_launch(("default", "late")) == T0 + timedelta(minutes=10)
    stopped = pb.Job()
    stopped.CopyFrom(job)
    stopped.stop = True
    batch = pb.ChangeBatch(index=3)
    batch.events.add(topic="Job", type="JobDeregistered", key=job.id, job=stopped)
    d.on_batch(batch, snap)
    assert len(d.tracker) == 0
    # a standby ignores the feed; a new leader rebuilds from its snapshot
    d.disable()
    batch.events[0].job.CopyFrom(job)
    d.on_batch(batch, snap)
    assert len(d.tracker) == 0


async def test_a_failed_launch_neither_stops_the_others_nor_is_retried() -> None:
    broken, fine = parent("broken", "*/15 * * * *"), parent("fine", "*/15 * * * *")
    c = Cluster(broken, fine)
    c.unavailable_for.add("broken")
    for j in (broken, fine):
        c.launches[("default", j.id)] = periodic.to_unix_ns(T0)
    clock = Clock(T0)
    d = c.dispatcher(clock)
    await d.restore()
    clock.advance(minutes=15)
    assert await d.launch_due() == 2
    assert c.children == [child_at("fine", T0 + timedelta(minutes=15))]
    c.unavailable_for.clear()
    assert await d.launch_due() == 0  # the failed tick is gone
    clock.advance(minutes=15)
    assert await d.launch_due() == 2 and len(c.children) == 3
