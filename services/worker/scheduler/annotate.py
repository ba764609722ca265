"""Plan annotations for dry runs (`job plan`, Nomad's `annotate.go` and
`desiredUpdates`): what the scheduler would do per task group — place,
stop, in-place and destructive updates, migrations, canaries, preemptions,
disconnects and reconnects — attached to the plan when the eval asks for
`annotate_plan`.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.reconcile.node import AllocTuple, NodeDiff
from services.worker.scheduler.reconcile.reconciler import ReconcileResults


def from_reconcile(result: ReconcileResults) -> pb.PlanAnnotations:
    """The generic scheduler's annotations: the reconciler's per-group
    counts as they stand before placement."""
    out = pb.PlanAnnotations()
    for group, du in result.desired_tg_updates.items():
        out.desired_tg_updates[group].CopyFrom(du)
    return out


def _group(t: AllocTuple) -> str:
    if t.task_group is not None:
        return t.task_group.name
    return t.alloc.task_group if t.alloc is not None else ""


def desired_updates_from_node_diff(
    diff: NodeDiff, inplace: Iterable[AllocTuple], destructive: Iterable[AllocTuple]
) -> pb.PlanAnnotations:
    """The system schedulers' annotations, counted from the node diff."""
    out = pb.PlanAnnotations()
    tgs = out.desired_tg_updates

    def count(tuples: Iterable[AllocTuple], fieldname: str) -> None:
        for t in tuples:
            du = tgs[_group(t)]
            setattr(du, fieldname, getattr(du, fieldname) + 1)

    count(diff.stop, "stop")
    count(diff.place, "place")
    count(diff.ignore, "ignore")
    count(diff.migrate, "migrate")
    count(diff.lost, "stop")
    count(diff.disconnecting, "disconnect_updates")
    count(diff.reconnecting, "reconnect_updates")
    count(inplace, "in_place_update")
    count(destructive, "destructive_update")
    return out


def add_preemptions(
    annotations: pb.PlanAnnotations, group: str, preempted: Iterable[pb.Allocation]
) -> None:
    """Record allocs a placement of `group` would preempt."""
    du = annotations.desired_tg_updates[group]
    for a in preempted:
        du.preemptions += 1
        annotations.preempted_allocs.append(a)
