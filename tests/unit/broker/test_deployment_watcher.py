"""The deployment watcher's decisions, over an in-memory replica and an
injected clock, with the state writes recorded: an eval per health
progress, success once all are healthy, failure on an unhealthy alloc or a
missed progress deadline, nothing while paused, one write per end, and a
fresh start on a new term."""

from __future__ import annotations

import grpc
import pytest

from corral.domain import deployments, topics
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import SECOND, DeploymentStatus, Trigger
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.broker.deployments import DeploymentWatcher, decide

T0 = 1_700_000_000 * SECOND


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class StateWrites:
    """What the watcher asked the state to write."""

    def __init__(self) -> None:
        self.statuses: list[tuple[str, str, str]] = []
        self.evals: list[pb.Evaluation] = []
        self.promoted: list[str] = []
        self.refuse = False

    async def promote(self, deployment_id: str) -> None:
        self.promoted.append(deployment_id)

    async def set_status(self, deployment_id: str, status: str, desc: str) -> None:
        if self.refuse:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="no longer active",
            )
        self.statuses.append((deployment_id, status, desc))

    async def write_evals(self, evals: list[pb.Evaluation]) -> int:
        self.evals.extend(evals)
        return len(self.evals)


class Replica:
    def __init__(self) -> None:
        self.store = StateStore()
        self.index = 10
        self.job = mock.job(count=4)
        self._write([pb.Event(topic=topics.JOB.name, type="JobRegistered", job=self.job)])

    def _write(self, events: list[pb.Event]) -> None:
        self.index += 1
        self.store.apply(pb.ChangeBatch(index=self.index, events=events))

    def put_allocs(self, *allocs: pb.Allocation) -> None:
        self._write(
            [pb.Event(topic=topics.ALLOCATION.name, key=a.id, allocation=a) for a in allocs]
        )

    def put(self, d: pb.Deployment) -> None:
        d.create_index = d.create_index or self.index + 1
        self._write([pb.Event(topic=topics.DEPLOYMENT.name, key=d.id, deployment=d)])

    def snapshot(self) -> StateSnapshot:
        return self.store.snapshot()


def _deployment(
    job: pb.Job, *, healthy: int = 0, unhealthy: int = 0, progress_by: int = 0
) -> pb.Deployment:
    d = deployments.new_deployment(job, T0)
    d.task_groups["web"].CopyFrom(
        pb.DeploymentState(
            desired_total=4,
            placed_allocs=4,
            healthy_allocs=healthy,
            unhealthy_allocs=unhealthy,
            progress_deadline=60 * SECOND,
            require_progress_by=progress_by,
        )
    )
    return d


def _watcher() -> tuple[DeploymentWatcher, Replica, StateWrites, Clock]:
    replica, writes, clock = Replica(), StateWrites(), Clock()
    w = DeploymentWatcher(
        replica.snapshot, writes.set_status, writes.write_evals, writes.promote, clock
    )
    return w, replica, writes, clock


def test_decide() -> None:
    job = mock.job(count=4)
    assert decide(_deployment(job, healthy=2, progress_by=T0 + SECOND), T0) is None
    assert decide(_deployment(job, healthy=4), T0) == (
        decide(_deployment(job, healthy=4), T0 + 100 * SECOND)
    )
    ok = decide(_deployment(job, healthy=4), T0)
    assert ok is not None and ok.status == DeploymentStatus.SUCCESSFUL
    bad = decide(_deployment(job, healthy=3, unhealthy=1), T0)
    assert bad is not None
    assert (bad.status, bad.description) == (
        DeploymentStatus.FAILED,
        deployments.DESC_FAILED_ALLOCS,
    )
    late = decide(_deployment(job, healthy=1, progress_by=T0 - 1), T0)
    assert late is not None and late.description == deployments.DESC_PROGRESS_DEADLINE
    paused = _deployment(job, unhealthy=1)
    paused.status = DeploymentStatus.PAUSED
    assert decide(paused, T0) is None


async def test_an_eval_each_time_more_allocs_are_healthy() -> None:
    w, replica, writes, _ = _watcher()
    d = _deployment(replica.job, progress_by=T0 + 60 * SECOND)
    replica.put(d)
    await w.step()
    assert writes.evals == []  # nothing healthy yet: nothing to roll
    d.task_groups["web"].healthy_allocs = 2
    replica.put(d)
    await w.step()
    await w.step()  # the same count again: no second eval
    (ev,) = writes.evals
    assert ev.triggered_by == Trigger.DEPLOYMENT_WATCHER
    assert ev.deployment_id == d.id and ev.job_id == replica.job.id
    assert ev.job_modify_index == replica.job.job_modify_index
    d.task_groups["web"].healthy_allocs = 3
    replica.put(d)
    await w.step()
    assert len(writes.evals) == 2
    assert writes.statuses == []


async def test_success_is_written_once() -> None:
    w, replica, writes, _ = _watcher()
    d = _deployment(replica.job, healthy=4)
    replica.put(d)
    await w.step()
    await w.step()  # the replica has not caught up yet: not written twice
    assert writes.statuses == [(d.id, DeploymentStatus.SUCCESSFUL, deployments.DESC_SUCCESSFUL)]


async def test_progress_deadline_by_the_injected_clock() -> None:
    w, replica, writes, clock = _watcher()
    d = _deployment(replica.job, healthy=1, progress_by=T0 + 30 * SECOND)
    replica.put(d)
    wait = await w.step()
    assert wait <= 1.0
    assert writes.statuses == []
    clock.now = T0 + 31 * SECOND
    await w.step()
    assert writes.statuses == [(d.id, DeploymentStatus.FAILED, deployments.DESC_PROGRESS_DEADLINE)]


async def test_unhealthy_alloc_fails_and_a_refused_write_is_not_retried() -> None:
    w, replica, writes, _ = _watcher()
    d = _deployment(replica.job, healthy=1, unhealthy=1)
    replica.put(d)
    writes.refuse = True  # an operator ended it first
    await w.step()
    await w.step()
    assert writes.statuses == []
    writes.refuse = False
    await w.step()
    assert writes.statuses == []


async def test_ended_and_paused_deployments_are_left_alone() -> None:
    w, replica, writes, clock = _watcher()
    done = _deployment(replica.job, healthy=4)
    done.status = DeploymentStatus.SUCCESSFUL
    paused = _deployment(replica.job, healthy=2, progress_by=T0 + SECOND)
    paused.status = DeploymentStatus.PAUSED
    replica.put(done)
    replica.put(paused)
    clock.now = T0 + 100 * SECOND
    await w.step()
    assert writes.statuses == [] and writes.evals == []


@pytest.mark.parametrize("healthy", [0, 2])
async def test_a_new_term_sends_one_eval_per_deployment_with_healthy_allocs(
    healthy: int,
) -> None:
    w, replica, writes, _ = _watcher()
    replica.put(_deployment(replica.job, healthy=healthy, progress_by=T0 + 60 * SECOND))
    await w.step()
    assert len(writes.evals) == (1 if healthy else 0)


def _canary_deployment(
    replica: Replica, *, auto_promote: bool, healthy: bool
) -> tuple[pb.Deployment, pb.Allocation]:
    replica.job.update.CopyFrom(
        pb.UpdateStrategy(max_parallel=2, canary=1, auto_promote=auto_promote)
    )
    replica._write([pb.Event(topic=topics.JOB.name, type="JobRegistered", job=replica.job)])
    canary = mock.alloc(replica.job, mock.node())
    canary.deployment_status.canary = True
    if healthy:
        canary.deployment_status.healthy = True
    d = _deployment(replica.job, healthy=1 if healthy else 0, progress_by=T0 + SECOND)
    canary.deployment_id = d.id
    d.task_groups["web"].placed_canaries.append(canary.id)
    d.task_groups["web"].desired_canaries = 1
    replica.put_allocs(canary)
    replica.put(d)
    return d, canary


async def test_auto_promote_once_every_canary_is_healthy() -> None:
    w, replica, writes, _ = _watcher()
    d, _ = _canary_deployment(replica, auto_promote=True, healthy=False)
    await w.step()
    assert writes.promoted == []
    d, _ = _canary_deployment(replica, auto_promote=True, healthy=True)
    await w.step()
    await w.step()
    assert writes.promoted == [d.id]
    assert writes.statuses == []  # not successful before the promotion


async def test_healthy_canaries_wait_for_a_manual_promotion_past_the_deadline() -> None:
    w, replica, writes, clock = _watcher()
    _canary_deployment(replica, auto_promote=False, healthy=True)
    clock.now = T0 + 100 * SECOND
    await w.step()
    assert writes.promoted == [] and writes.statuses == []
