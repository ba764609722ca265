"""What the generic and the system schedulers share (Nomad's
`GenericScheduler` and `SystemScheduler` hold the same fields and run an
eval through the same steps): the snapshot, the planner and the plan being
built, the eval's outcome (follow-up, failed groups, queued allocs), and
the run itself:

1. refuse a trigger the scheduler does not handle (the eval fails);
2. refuse an eval that would materialise more placements than one eval may
   (services/worker/scheduler/limits.py; the eval fails, saying why);
3. attempt to schedule until an attempt commits in full or the attempts run
   out (an attempt that made progress resets the count); when they run out
   the eval ends with the error's status.

Each scheduler says how many attempts it has (its batch variant: batch
jobs for the generic scheduler, sysbatch for the system one), what it
handles and counts, what more it keeps (`_start`) and how an attempt goes.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from corral.domain import structs
from corral.domain.store import StateSnapshot
from corral.domain.structs import EvalStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import limits, util
from services.worker.scheduler.feasible.inflight import InFlightPlacements
from services.worker.scheduler.interfaces import Planner
from services.worker.scheduler.placement import Placer


class EvalScheduler(ABC):
    """The skeleton of a scheduler of one job's evals (see the module
    docstring); `process` runs the eval."""

    #: attempts before the eval ends with the planner's error, for the
    #: scheduler's jobs and for its batch variant's
    max_attempts = 1
    batch_attempts = 1

    def __init__(
        self,
        snapshot: StateSnapshot,
        planner: Planner,
        log: logging.Logger,
        *,
        batch: bool,
        max_placements: int | None = None,
        inflight: InFlightPlacements | None = None,
    ) -> None:
        self.batch = batch
        self.attempts = self.batch_attempts if batch else self.max_attempts
        self.snap = snapshot
        #: sibling scheduler loops' placements (feasible/inflight.py)
        self.inflight = inflight
        #: placements one eval may materialise (services/worker/scheduler/limits.py)
        self.max_placements = limits.max_placements() if max_placements is None else max_placements
        self.planner = planner
        self.log = log
        self.eval = pb.Evaluation()
        self.job: pb.Job | None = None
        self.plan = pb.Plan()
        self.plan_result: pb.PlanResult | None = None
        self.next_eval: pb.Evaluation | None = None
        self.failed_tg_allocs: dict[str, pb.AllocMetric] = {}
        self.queued: dict[str, int] = {}
        self.followups: list[pb.Evaluation] = []
        self.annotations: pb.PlanAnnotations | None = None
        self.placer: Placer | None = None
        self._start()

    # -- what a scheduler fills in

    def _start(self) -> None:
        """Set up what else the scheduler keeps (called by the constructor);
        a hook: nothing by default."""
        return

    @abstractmethod
    def _can_handle(self, trigger: str) -> bool: ...

    @abstractmethod
    def _over_limit(self) -> str:
        """Why this eval would materialise too many placements, or ''."""
        ...

    @abstractmethod
    def _attempt(self) -> bool:
        """One try at scheduling the eval: True when it committed in full."""
        ...

    @abstractmethod
    def _set_status(self, status: str, desc: str) -> None: ...

    def _attempts_ran_out(self) -> None:
        """Before the eval ends with the planner's error; a hook: nothing by
        default."""
        return

    # -- the skeleton

    def _run(self, ev: pb.Evaluation) -> bool:
        """Steps 1-3 of the module docstring; False when the eval already
        ended (its status set), True when an attempt committed in full."""
        self.eval = structs.copy_msg(ev)
        if not self._can_handle(ev.triggered_by):
            self._set_status(
                EvalStatus.FAILED,
                f"scheduler cannot handle '{ev.triggered_by}' evaluation reason",
            )
            return False
        problem = self._over_limit()
        if problem:
            self.log.warning(problem, extra={"eval_id": ev.id, "job_id": ev.job_id})
            self._set_status(EvalStatus.FAILED, problem)
            return False
        try:
            util.retry_max(
                self.attempts, self._attempt, lambda: util.progress_made(self.plan_result)
            )
        except util.SetStatusError as err:
            self._attempts_ran_out()
            self._set_status(err.eval_status, str(err))
            return False
        return True
