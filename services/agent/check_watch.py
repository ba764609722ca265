"""`check_restart`: restart a task whose check stays unhealthy (Nomad's
serviceregistration/watcher.go). A watched check that is failing (or has
not passed yet) past its `grace` for `interval × (limit − 1)` restarts its
task; the restart counts as a failure against the task's restart policy.
The watch ends with the restart and starts again, with a fresh grace, when
the task's services are registered again after it runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.domain import services
from corral.v1 import structs_pb2 as pb

#: how often watched results are looked at (Nomad's pollFrequency)
POLL_S = 1.0


@dataclass
class Watch:
    check_id: str
    check_name: str
    #: the task to restart; "" restarts every task of the alloc (a group
    #: service's check, whose workload is the whole alloc)
    task: str
    grace_until: float
    time_limit: float
    unhealthy_since: float | None = None

    def apply(self, now: float, status: str) -> bool:
        """Whether the task must restart now (restarter.apply)."""
        if status == services.CHECK_SUCCESS:
            self.unhealthy_since = None
            return False
        if now < self.grace_until:
            return False
        if self.unhealthy_since is None:
            self.unhealthy_since = now
        return now >= self.unhealthy_since + self.time_limit


def watch_for(
    check_id: str, check: pb.ServiceCheck, task: str, now: float | None = None
) -> Watch | None:
    """The watch of a check with a check_restart limit, else None."""
    cr = check.check_restart
    if not check.HasField("check_restart") or cr.limit <= 0:
        return None
    start = time.monotonic() if now is None else now
    return Watch(
        check_id=check_id,
        check_name=check.name,
        task=task,
        grace_until=start + cr.grace / 1e9,
        time_limit=check.interval / 1e9 * (cr.limit - 1),
    )


class CheckWatcher:
    """The watches of one alloc; `poll` restarts through `restart(task,
    reason)` and drops every watch of the task it restarted."""

    def __init__(self, restart: Callable[[str, str], None]) -> None:
        self.restart = restart
        self.watches: dict[str, Watch] = {}

    def watch(self, w: Watch) -> None:
        self.watches[w.check_id] = w

    def unwatch_task(self, task: str) -> None:
        for check_id in [k for k, w in self.watches.items() if w.task == task]:
            del self.watches[check_id]

    def clear(self) -> None:
        self.watches.clear()

    def poll(self, results: dict[str, pb.CheckResult], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        restarted: set[str] = set()
        for check_id, w in list(self.watches.items()):
            if w.task in restarted:
                continue
            result = results.get(check_id)
            if result is None:
                continue
            if w.apply(now, result.status):
                restarted.add(w.task)
                self.restart(w.task, f'healthcheck: check "{w.check_name}" unhealthy')
        for task in restarted:
            self.unwatch_task(task)
