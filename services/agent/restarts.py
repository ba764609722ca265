"""Whether and when a task runs again after it stopped (Nomad's
taskrunner/restarts): the restart policy's `attempts` within each
`interval`, `delay` apart (plus up to a quarter of jitter), then mode
`fail` gives up and mode `delay` waits for the next interval.

Which exits count: a batch task that succeeded is done; so is a
non-sidecar prestart or poststart task and a poststop task; a service
task, and a sidecar, is restarted even after a clean exit. A kill is
never followed by a restart; a restart someone asked for (`alloc
restart`) is not counted against the policy, one a check asked for is.

The tracker's counters are part of the client state (services/agent/
state_db.py): a restarted agent goes on counting in the same interval.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from corral.domain.jobspec.duration import format_duration
from corral.domain.structs import JobType
from corral.v1 import structs_pb2 as pb
from services.agent.drivers.base import ExitResult

#: share of the delay added at random (Nomad's jitter)
JITTER = 0.25

REASON_NO_RESTARTS = "Policy allows no restarts"
REASON_UNRECOVERABLE = "Error was unrecoverable"
REASON_WITHIN_POLICY = "Restart within policy"
REASON_DELAY = "Exceeded allowed attempts, applying a delay"
REASON_SUCCESS = "Restart unnecessary as task terminated successfully"

#: the outcomes (Nomad's task event types)
RESTARTING = "Restarting"
NOT_RESTARTING = "Not Restarting"
TERMINATED = "Terminated"
KILLED = "Killed"


@dataclass(frozen=True)
class Decision:
    """What comes after a run: `kind` is one of the outcomes above; `delay`
    (seconds) before the next start when restarting; `reason` for people."""

    kind: str
    delay: float = 0.0
    reason: str = ""


def restarts_on_success(job_type: str, lifecycle: pb.TaskLifecycleConfig | None) -> bool:
    """Whether a clean exit is followed by a restart (Nomad's onSuccess)."""
    on_success = job_type not in (JobType.BATCH, JobType.SYSBATCH)
    if lifecycle is not None and lifecycle.hook in ("prestart", "poststart"):
        on_success = lifecycle.sidecar
    if lifecycle is not None and lifecycle.hook == "poststop":
        on_success = False
    return on_success


class RestartTracker:
    def __init__(
        self,
        policy: pb.RestartPolicy,
        on_success: bool,
        *,
        clock: Any = time.time,
        rng: random.Random | None = None,
    ) -> None:
        """`clock` is wall time: the interval outlives an agent restart."""
        self.policy = policy
        self.on_success = on_success
        self._clock = clock
        self._rng = rng or random.Random()
        self.count = 0
        self.interval_start = clock()
        self._exit: ExitResult | None = None
        self._start_error: str | None = None
        self._recoverable = True
        self._killed = False
        self._restart_asked = False
        self._failure = False

    # ---------------------------------------------------------------- persisted

    def dump(self) -> dict[str, Any]:
        return {"count": self.count, "interval_start": self.interval_start}

    def load(self, data: dict[str, Any]) -> None:
        self.count = int(data.get("count", 0))
        self.interval_start = float(data.get("interval_start", self._clock()))

    # ---------------------------------------------------------------- what happened

    def exited(self, result: ExitResult) -> None:
        self._exit = result
        self._failure = True

    def start_failed(self, error: str, *, recoverable: bool = True) -> None:
        self._start_error = error
        self._recoverable = recoverable
        self._failure = True

    def killed(self) -> None:
        self._killed = True

    def restart_asked(self, *, failure: bool) -> None:
        """A restart was asked for: by a person (`failure` False: not
        counted), or by a failing check (counted as a failure)."""
        if failure:
            self._failure = True
        else:
            self._restart_asked = True

    # ---------------------------------------------------------------- deciding

    def decide(self) -> Decision:
        """The outcome of the last run; clears what was recorded."""
        try:
            return self._decide()
        finally:
            self._exit = None
            self._start_error = None
            self._recoverable = True
            self._killed = False
            self._restart_asked = False
            self._failure = False

    def _decide(self) -> Decision:
        if self._killed:
            return Decision(KILLED)
        if self._restart_asked:
            return Decision(RESTARTING, 0.0)
        succeeded = self._exit is not None and self._exit.successful
        if self.policy.attempts == 0:
            if not self.on_success and succeeded:
                return Decision(TERMINATED, reason=REASON_NO_RESTARTS)
            return Decision(NOT_RESTARTING, reason=REASON_NO_RESTARTS)
        now = self._clock()
        interval = self.policy.interval / 1e9
        if now > self.interval_start + interval:
            self.count = 0
            self.interval_start = now
        self.count += 1
        if self._start_error is not None:
            if not self._recoverable:
                return Decision(NOT_RESTARTING, reason=REASON_UNRECOVERABLE)
        elif succeeded and not self.on_success:
            return Decision(TERMINATED, reason=REASON_SUCCESS)
        if self.count > self.policy.attempts:
            if self.policy.mode == "fail":
                return Decision(
                    NOT_RESTARTING,
                    reason=(
                        f"Exceeded allowed attempts {self.policy.attempts} in interval "
                        f'{format_duration(self.policy.interval)} and mode is "fail"'
                    ),
                )
            return Decision(
                RESTARTING, max(0.0, self.interval_start + interval - now), REASON_DELAY
            )
        return Decision(RESTARTING, self._jitter(), REASON_WITHIN_POLICY)

    def _jitter(self) -> float:
        delay = max(1, self.policy.delay)
        return (delay + self._rng.randrange(delay) * JITTER) / 1e9


def restarting_message(decision: Decision) -> str:
    """Nomad's display message of a Restarting event."""
    when = f"Task restarting in {format_duration(int(decision.delay * 1e9))}"
    if decision.reason and decision.reason != REASON_WITHIN_POLICY:
        return f"{decision.reason} - {when}"
    return when
