"""Planner metrics, named after Nomad's `nomad.plan.*` series (docs/planner.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from corral.v1 import structs_pb2 as pb

QUEUE_DEPTH = Gauge(
    "corral_plan_queue_depth", "Plans waiting in the plan queue (nomad.plan.queue_depth)"
)
SUBMIT = Histogram(
    "corral_plan_submit_seconds", "Plan.Submit from arrival to answer (nomad.plan.submit)"
)
WAIT_FOR_INDEX = Histogram(
    "corral_plan_wait_for_index_seconds",
    "Waiting for the replica to reach a plan's snapshot index (nomad.plan.wait_for_index)",
)
EVALUATE = Histogram("corral_plan_evaluate_seconds", "Evaluating one plan (nomad.plan.evaluate)")
APPLY = Histogram(
    "corral_plan_apply_seconds",
    "One State.ApplyPlans write of a group commit (nomad.plan.apply)",
)
NODE_REJECTED = Counter(
    "corral_plan_node_rejected_total",
    "Nodes rejected from plans by evaluation (nomad.plan.node_rejected)",
)
GROUP_COMMIT_SIZE = Histogram(
    "corral_plan_group_commit_size",
    "Plans written per State.ApplyPlans transaction",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
OUTSTANDING_APPLY = Gauge(
    "corral_plan_outstanding_apply",
    "Evaluated batches waiting for or in their write (nomad.plan.outstanding_apply)",
)
PLANS = Counter(
    "corral_plan_results_total",
    "Plans answered, by outcome (committed, partial, noop, failed)",
    ["outcome"],
)
ALLOCS_PLACED = Counter(
    "corral_plan_allocs_placed_total",
    "Allocs written by committed plans: placements and in-place updates",
)
ALLOCS_STOPPED = Counter(
    "corral_plan_allocs_stopped_total",
    "Allocs stopped or evicted by committed plans, preemptions included",
)


def count_committed(result: pb.PlanResult) -> None:
    """Count what a committed plan result wrote (placements/s on the
    pipeline dashboard)."""
    placed = sum(len(allocs.allocs) for allocs in result.node_allocation.values())
    stopped = sum(len(s.stops) for s in result.node_update.values()) + sum(
        len(s.stops) for s in result.node_preemptions.values()
    )
    if placed:
        ALLOCS_PLACED.inc(placed)
    if stopped:
        ALLOCS_STOPPED.inc(stopped)
