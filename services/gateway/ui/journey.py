"""An evaluation's journey through the control plane, as the UI's timeline
draws it: created → enqueued → dequeued → plan submitted → committed →
allocs running.

Only what the state committed has a time here: the eval's creation (its
create index and time), the plan's commit (the create index and time of the
allocs the eval placed), the eval's completion (its modify time once it is
terminal) and the first task start of those allocs. Enqueue, dequeue and plan
submission happen inside the broker, a worker and the planner and are not
written to the state (writing them would cost a state write per step of
every eval); their stage says so and the trace id links to the spans that
record them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from corral.v1 import structs_pb2 as types

#: eval statuses after which the scheduler is done with it
TERMINAL_EVAL = frozenset({"complete", "failed", "canceled"})

NOT_RECORDED = "not recorded by the state: see the trace"


@dataclass(frozen=True)
class Stage:
    """One step of the journey: when (Unix ns) and at which state index it
    was committed, or why it has no time."""

    name: str
    time: int | None = None
    index: int | None = None
    note: str = ""

    def to_json(self) -> dict[str, object]:
        return {k.capitalize(): v for k, v in asdict(self).items()}


def trace_id(traceparent: str) -> str:
    """The trace id of a W3C traceparent (`00-<32 hex>-<16 hex>-<2 hex>`), or
    '' when the header is absent or malformed."""
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return ""
    tid = parts[1].lower()
    if tid == "0" * 32 or any(c not in "0123456789abcdef" for c in tid):
        return ""
    return tid


def _first_start(alloc: types.Allocation) -> int:
    starts = [s.started_at for s in alloc.task_states.values() if s.started_at]
    return min(starts) if starts else 0


def journey(ev: types.Evaluation, allocs: Iterable[types.Allocation]) -> list[Stage]:
    """The stages of `ev`, given the allocs it placed (`Evals.Get` with
    include_related answers both)."""
    placed = sorted((a for a in allocs if a.eval_id == ev.id), key=lambda a: (a.create_index, a.id))
    stages = [
        Stage("created", ev.create_time or None, ev.create_index or None, ev.triggered_by),
        Stage("enqueued", note=NOT_RECORDED),
        Stage("dequeued", note=NOT_RECORDED),
        Stage("plan submitted", note=NOT_RECORDED),
    ]
    if placed:
        first = placed[0]
        stages.append(
            Stage(
                "committed",
                first.create_time or None,
                first.create_index or None,
                f"plan placed {len(placed)} alloc(s)",
            )
        )
    elif ev.status in TERMINAL_EVAL:
        stages.append(
            Stage(
                "committed",
                ev.modify_time or None,
                ev.modify_index or None,
                f"eval {ev.status}, no allocs placed"
                + (f": {ev.status_description}" if ev.status_description else ""),
            )
        )
    else:
        stages.append(Stage("committed", note=f"eval {ev.status or 'pending'}"))
    starts = [t for t in (_first_start(a) for a in placed) if t]
    running = sum(1 for a in placed if a.client_status == "running")
    if starts:
        stages.append(
            Stage(
                "allocs running",
                max(starts) if running == len(placed) else min(starts),
                note=f"{running} of {len(placed)} running",
            )
        )
    else:
        stages.append(
            Stage("allocs running", note=f"{running} of {len(placed)} running" if placed else "")
        )
    return stages
