"""An alloc's deployment health, judged on the client (Nomad's allocrunner
health hook and allochealth tracker; `manual` is not judged here but set
through `Deployment.SetAllocHealth`): healthy once every task has been
running for `min_healthy_time` without a restart and, with `health_check =
"checks"` (the default) and Nomad-provider checks in the group, every
check has passed for `min_healthy_time` as well (a readiness check, with
`on_update = "ignore"`, only needs to have run); unhealthy when a task
fails or `healthy_deadline` passes first. The verdict is reported once per
deployment the alloc is in; the state counts it on the deployment.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from corral.domain import deployments, services
from corral.domain.structs import TaskStateName
from corral.v1 import structs_pb2 as pb

#: how often the task states are looked at while no verdict is reached
POLL_S = 0.1


class HealthJudge:
    """One verdict from successive looks at the task states (times in s)."""

    def __init__(self, up: pb.UpdateStrategy, start: float, states: list[pb.TaskState]) -> None:
        self.deadline = start + up.healthy_deadline / 1e9 if up.healthy_deadline else None
        self.min_healthy = up.min_healthy_time / 1e9
        self.running_since: float | None = None
        self.passing_since: float | None = None
        self.restarts = sum(t.restarts for t in states)

    def observe(
        self,
        states: list[pb.TaskState],
        now: float,
        checks: list[pb.CheckResult] | None = None,
    ) -> bool | None:
        """`checks`: the alloc's check results when they count (health_check
        "checks" and the group has checks), else None."""
        if any(t.failed for t in states):
            return False
        total = sum(t.restarts for t in states)
        if total != self.restarts:  # a restart starts the wait over
            self.restarts, self.running_since = total, None
        tasks_healthy = False
        if states and all(t.state == TaskStateName.RUNNING for t in states):
            if self.running_since is None:
                self.running_since = now
            tasks_healthy = now - self.running_since >= self.min_healthy
        else:
            self.running_since = None
        checks_healthy = True
        if checks is not None:
            if checks_passing(checks):
                if self.passing_since is None:
                    self.passing_since = now
                checks_healthy = now - self.passing_since >= self.min_healthy
            else:
                self.passing_since = None
                checks_healthy = False
        if tasks_healthy and checks_healthy:
            return True
        if self.deadline is not None and now >= self.deadline:
            return False
        return None


def checks_passing(results: list[pb.CheckResult]) -> bool:
    """Nomad's watchNomadEvents: every check succeeded, but a readiness
    check that ran and failed does not count; a check that has not run
    yet (pending) is not passing."""
    for r in results:
        if r.status == services.CHECK_SUCCESS:
            continue
        if r.status == services.CHECK_FAILURE and r.mode == services.READINESS:
            continue
        return False
    return True


class HealthWatch:
    """Watches one alloc while it is part of a deployment."""

    def __init__(
        self,
        alloc: Callable[[], pb.Allocation],
        job: Callable[[], pb.Job],
        tasks: Callable[[], list[pb.TaskState]],
        on_change: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        checks: Callable[[], list[pb.CheckResult] | None] = lambda: None,
    ) -> None:
        """`checks` gives the alloc's check results (None: it has none)."""
        self._alloc = alloc
        self._job = job
        self._tasks = tasks
        self._on_change = on_change
        self._clock = clock
        self._checks = checks
        #: the deployment the verdict is for, and the verdict (None: not yet)
        self.deployment_id = ""
        self.healthy: bool | None = None
        self.timestamp = 0

    def _strategy(self) -> pb.UpdateStrategy | None:
        job, alloc = self._job(), self._alloc()
        for tg in job.task_groups:
            if tg.name == alloc.task_group:
                return deployments.update_strategy(job, tg)
        return None

    async def run(self) -> None:
        """Until cancelled: judge each deployment the alloc joins once."""
        while True:
            alloc = self._alloc()
            up = self._strategy()
            if (
                not alloc.deployment_id
                or up is None
                or up.health_check == "manual"  # set by hand through the Deployment API
                or alloc.deployment_id == self.deployment_id
            ):
                await asyncio.sleep(POLL_S)
                continue
            self.deployment_id = alloc.deployment_id
            self.healthy = None
            verdict = await self._judge(up, alloc.deployment_id)
            if verdict is not None:
                self.healthy = verdict
                self.timestamp = time.time_ns()
                self._on_change()

    async def _judge(self, up: pb.UpdateStrategy, deployment_id: str) -> bool | None:
        judge = HealthJudge(up, self._clock(), self._tasks())
        while self._alloc().deployment_id == deployment_id:
            checks = self._checks() if up.health_check == "checks" else None
            verdict = judge.observe(self._tasks(), self._clock(), checks)
            if verdict is not None:
                return verdict
            await asyncio.sleep(POLL_S)
        return None  # moved to another deployment: judged again for that one

    def report(self, out: pb.Allocation) -> None:
        """Add the verdict (if any) to a client update."""
        if self.healthy is None:
            return
        out.deployment_id = self.deployment_id
        out.deployment_status.healthy = self.healthy
        out.deployment_status.timestamp = self.timestamp
