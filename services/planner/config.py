"""Planner settings and their defaults (docs/planner.md)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from corral.runtime.runner import LeaderSettings
from corral.runtime.settings import Option, SettingsGroup

#: test-only fault injection (CORRAL_PLANNER_FAULT): "exit-before-apply"
#: makes the process exit right after evaluating a batch, before its write
FAULT_EXIT_BEFORE_APPLY = "exit-before-apply"


class PlannerSettings(SettingsGroup):
    """The plan applier's settings."""

    pipeline_depth: int = Field(
        1,
        ge=1,
        description="evaluated batches that may wait for or be in their write while the next "
        "is evaluated (Nomad's plan_apply_pipeline)",
    )
    max_batch: int = Field(
        64, ge=1, description="most plans evaluated together and written in one group commit"
    )
    max_batch_allocs: int = Field(
        5000,
        ge=0,
        description="most allocs (placed, stopped, preempted) per group commit, so big plans "
        "are not piled into one huge transaction (a bigger plan goes alone); 0 = no bound",
    )
    wait_for_index_timeout: float = Field(
        10.0,
        gt=0,
        description="seconds a plan waits for the replica to reach its snapshot index "
        "(Nomad's snapshotMinIndex timeout)",
    )
    apply_timeout: float = Field(30.0, gt=0, description="timeout (s) of one ApplyPlans write")
    fault: Literal["", "exit-before-apply"] = Field(
        "",
        description="test-only fault injection: exit-before-apply exits (status 75) after "
        "evaluating a batch, before writing it",
    )


class PlannerProcessSettings(LeaderSettings):
    """A plan applier process: the leader evaluates and commits plans, standbys wait."""

    ROLE: ClassVar[str] = "planner"

    broker_addr: Annotated[str, Option(env="CORRAL_BROKER_ADDR")] = Field(
        min_length=1,
        description="broker host:port[,host:port] (the eval token check before a plan is queued)",
    )
    planner: PlannerSettings = Field(default_factory=PlannerSettings)
