"""An alloc's deployment health, judged on the client (Nomad's allocrunner
health hook with `health_check = "task_states"`; `checks` is judged the same
way until service checks exist; `manual` is not judged here but set through
`Deployment.SetAllocHealth`): healthy once every task has been running
for `min_healthy_time` without a restart; unhealthy when a task fails or
`healthy_deadline` passes first. The verdict is reported once per
deployment the alloc is in; the state counts it on the deployment.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from corral.domain import deployments
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
        self.restarts = sum(t.restarts for t in states)

    def observe(self, states: list[pb.TaskState], now: float) -> bool | None:
        if any(t.failed for t in states):
            return False
        total = sum(t.restarts for t in states)
        if total != self.restarts:  # a restart starts the wait over
            self.restarts, self.running_since = total, None
        if states and all(t.state == TaskStateName.RUNNING for t in states):
            if self.running_since is None:
                self.running_since = now
            if now - self.running_since >= self.min_healthy:
                return True
        else:
            self.running_since = None
        if self.deadline is not None and now >= self.deadline:
            return False
        return None


class HealthWatch:
    """Watches one alloc while it is part of a deployment."""

    def __init__(
        self,
        alloc: Callable[[], pb.Allocation],
        job: Callable[[], pb.Job],
        tasks: Callable[[], list[pb.TaskState]],
        on_change: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._alloc = alloc
        self._job = job
        self._tasks = tasks
        self._on_change = on_change
        self._clock = clock
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
            verdict = judge.observe(self._tasks(), self._clock())
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
