"""Planner settings and their defaults (docs/planner.md)."""

from __future__ import annotations

from dataclasses import dataclass

#: test-only fault injection (CORRAL_PLANNER_FAULT): "exit-before-apply"
#: makes the process exit right after evaluating a batch, before its write
FAULT_EXIT_BEFORE_APPLY = "exit-before-apply"
FAULTS = ("", FAULT_EXIT_BEFORE_APPLY)


@dataclass
class PlannerSettings:
    state_addr: str
    dsn: str = ""
    broker_addr: str = ""
    listen: str = "127.0.0.1:0"
    # Evaluated batches allowed to wait for or be in their write while the
    # next batch is evaluated (Nomad's plan_apply_pipeline, default 1).
    pipeline_depth: int = 1
    # Most plans evaluated together and written in one ApplyPlans
    # transaction (group commit).
    max_batch: int = 64
    # ... and at most about this many allocs (placed, stopped, preempted)
    # per group commit, so big plans are not piled into one huge
    # transaction; a single bigger plan still goes alone. 0 = no bound.
    max_batch_allocs: int = 5000
    # How long a plan waits for the replica to reach its snapshot index
    # (Nomad's snapshotMinIndex timeout).
    wait_for_index_timeout: float = 10.0
    # Timeout of one ApplyPlans write.
    apply_timeout: float = 30.0
    fault: str = ""

    def validate(self) -> None:
        if self.pipeline_depth < 1:
            raise ValueError("pipeline_depth must be >= 1")
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if self.max_batch_allocs < 0:
            raise ValueError("max_batch_allocs must be >= 0")
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known: {', '.join(FAULTS[1:])}")
