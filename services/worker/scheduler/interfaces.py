"""The scheduler contract: what a worker hands a scheduler and what a
scheduler may call back (Nomad's `scheduler/scheduler.go`); `factory.py`
builds one.

A scheduler turns one evaluation plus one immutable snapshot into at most a
few plans, submitted through a `Planner`. It never writes state itself and
never stamps index fields: the worker's `Planner` stamps `snapshot_index` on
plans and evals, exactly as Nomad's worker does. Everything here is
synchronous; the worker runs schedulers in a thread or process of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from corral.domain.store import StateSnapshot
from corral.v1 import structs_pb2 as pb


class SchedulerError(Exception):
    """An evaluation could not be processed; the worker nacks it so the
    broker redelivers it later (Nomad returns an error from Process)."""


@runtime_checkable
class Planner(Protocol):
    """The scheduler's only way to change the world (Nomad's `Planner`)."""

    def submit_plan(self, plan: pb.Plan) -> tuple[pb.PlanResult, StateSnapshot | None]:
        """Submit a plan for evaluation and commit. Returns the result and,
        when `result.refresh_index != 0` (part of the plan was rejected), a
        snapshot at an index >= refresh_index so the scheduler can retry on
        fresher state."""
        ...

    def update_eval(self, ev: pb.Evaluation) -> None:
        """Write the final status of the evaluation being processed."""
        ...

    def create_eval(self, ev: pb.Evaluation) -> None:
        """Create a follow-up or blocked evaluation."""
        ...

    def reblock_eval(self, ev: pb.Evaluation) -> None:
        """Put a blocked evaluation that still cannot place back into the
        blocked tracker without changing its status."""
        ...


@runtime_checkable
class CorePlanner(Planner, Protocol):
    """A planner that can also delete garbage (used by the `_core` GC
    scheduler only). Deletions are writes through the state service."""

    def delete_evals(self, eval_ids: Sequence[str], alloc_ids: Sequence[str]) -> None:
        """Delete terminal evals and the terminal allocs that hang off them."""
        ...

    def delete_jobs(self, jobs: Sequence[tuple[str, str]]) -> None:
        """Delete dead jobs by (namespace, job id), with all their versions."""
        ...

    def delete_nodes(self, node_ids: Sequence[str]) -> None:
        """Delete nodes that have been down past the threshold."""
        ...

    def delete_deployments(self, deployment_ids: Sequence[str]) -> None:
        """Delete ended deployments no live alloc refers to."""
        ...


@runtime_checkable
class Scheduler(Protocol):
    def process(self, ev: pb.Evaluation) -> None:
        """Process one evaluation; raises `SchedulerError` to ask for a nack."""
        ...
