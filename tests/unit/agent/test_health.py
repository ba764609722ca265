"""The client's deployment health verdict: the judge over successive looks
at the task states with times given by the test (healthy after
min_healthy_time of every task running, a restart or a stopped task starts
the wait over, unhealthy on a failed task or past healthy_deadline), and the
watch around it (reported once, judged again in a new deployment, nothing
for manual health)."""

from __future__ import annotations

import asyncio

from corral.domain.structs import SECOND, TaskStateName
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.agent.health import HealthJudge, HealthWatch
from tests.wait import until

UP = pb.UpdateStrategy(
    max_parallel=1,
    health_check="task_states",
    min_healthy_time=2 * SECOND,
    healthy_deadline=10 * SECOND,
)
PENDING = [pb.TaskState(state=TaskStateName.PENDING)]


def running(restarts: int = 0) -> list[pb.TaskState]:
    return [
        pb.TaskState(state=TaskStateName.RUNNING),
        pb.TaskState(state=TaskStateName.RUNNING, restarts=restarts),
    ]


def test_healthy_after_min_healthy_time_of_every_task_running() -> None:
    j = HealthJudge(UP, 100.0, PENDING)
    assert j.observe(PENDING, 101.0) is None
    assert j.observe(running(), 102.0) is None  # the wait starts here
    assert j.observe(running(), 103.9) is None
    assert j.observe(running(), 104.0) is True


def test_a_restart_or_a_stopped_task_starts_the_wait_over() -> None:
    j = HealthJudge(UP, 100.0, PENDING)
    assert j.observe(running(), 100.0) is None
    assert j.observe(running(restarts=1), 101.5) is None
    assert j.observe(running(restarts=1), 103.0) is None  # 1.5 s since the restart
    assert j.observe(running(restarts=1), 103.5) is True
    k = HealthJudge(UP, 100.0, PENDING)
    k.observe(running(), 100.0)
    k.observe(PENDING, 101.0)
    assert k.observe(running(), 102.5) is None
    assert k.observe(running(), 104.5) is True


def test_unhealthy_on_a_failed_task_or_past_the_deadline() -> None:
    j = HealthJudge(UP, 100.0, PENDING)
    assert j.observe([pb.TaskState(state=TaskStateName.DEAD, failed=True)], 100.1) is False
    k = HealthJudge(UP, 100.0, PENDING)
    assert k.observe(PENDING, 109.9) is None
    assert k.observe(PENDING, 110.0) is False


async def test_the_watch_reports_once_per_deployment() -> None:
    job = mock.job(count=1)
    job.update.CopyFrom(pb.UpdateStrategy(max_parallel=1, min_healthy_time=0))
    alloc = mock.alloc(job, mock.node())
    states = running()
    changes: list[bool | None] = []
    watch = HealthWatch(
        lambda: alloc, lambda: job, lambda: states, lambda: changes.append(watch.healthy)
    )
    task = asyncio.create_task(watch.run())
    try:
        alloc.deployment_id = "d1"
        await until(lambda: changes == [True], what="healthy in d1")
        out = pb.Allocation()
        watch.report(out)
        assert out.deployment_id == "d1" and out.deployment_status.healthy
        alloc.deployment_id = "d2"  # an in-place update into a newer deployment
        await until(lambda: changes == [True, True], what="judged again in d2")
        assert watch.deployment_id == "d2"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
