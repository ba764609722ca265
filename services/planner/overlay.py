"""The optimistic overlay: plans already applied (or being written) that the
replica has not seen yet.

The applier evaluates plan N+1 while plan N is still being written, and the
replica learns of N's commit only through the change feed a little later.
Evaluating N+1 on the bare replica would let it take capacity N already
took, so every applied result is also applied here, to an in-memory copy of
the replica's snapshot, as a synthetic `ChangeBatch` built by the merge the
state service runs and recorded as the state records it
(`corral.domain.plan_results`: placements created or updated in place, stops
and preemptions as diffs onto the newest copy).
Nomad does the same on its optimistic snapshot (`snap.UpsertPlanResults` in
plan_apply.go).

An entry leaves the overlay once the replica has reached the index it was
committed at. When a write fails, the whole overlay is discarded
(`generation` moves on) and every plan evaluated on it must be failed, never
committed.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.domain.plan_results import merge_on_snapshot, plan_events
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import now_ns
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb


def plan_change_batch(snap: StateSnapshot, plan: state_pb2.AppliedPlan, now: int) -> pb.ChangeBatch:
    """The alloc and deployment changes `plan` makes, merged onto `snap` by
    the state's own merge (`corral.domain.plan_results`), as an unindexed batch
    (index 0: it moves no table index and no snapshot index; the objects'
    indexes are 0 too, the commit index being unknown yet). The eval's
    modify-index bump is left to the commit: evaluating plans never reads it."""
    writes = merge_on_snapshot(plan, snap, ev=None, index=0, now=now)
    batch = pb.ChangeBatch()
    plan_events(writes, into=batch.events)
    return batch


@dataclass(eq=False, slots=True)
class OverlayEntry:
    """One applied plan: its write and, once committed, its index."""

    plan: state_pb2.AppliedPlan
    generation: int
    #: when it was applied here (the merge's time; kept for every replay)
    time: int = 0
    index: int = 0  # 0 while the write is in flight


class Overlay:
    """Replica snapshot + applied-but-not-yet-replicated plans."""

    def __init__(self) -> None:
        self.generation = 0
        self._entries: list[OverlayEntry] = []
        self._base_index = -1
        self._store = StateStore()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> list[OverlayEntry]:
        return list(self._entries)

    def snapshot(self, base: StateSnapshot) -> StateSnapshot:
        """`base` (the replica's newest snapshot) with every entry the
        replica has not reached yet applied on top."""
        if base.index != self._base_index:
            self._rebase(base)
        return self._store.snapshot()

    def _rebase(self, base: StateSnapshot) -> None:
        # An entry committed at or below the replica's index is in `base`.
        # Entries still in flight are re-applied even if the feed already
        # delivered them: re-applying a plan is conservative (it can only
        # hide capacity freed since, never invent capacity).
        self._entries = [e for e in self._entries if e.index == 0 or e.index > base.index]
        self._store = StateStore(base)
        self._base_index = base.index
        for entry in self._entries:
            self._store.apply(
                plan_change_batch(self._store.snapshot(), entry.plan, entry.time),
                stamp_tables=False,
            )

    def add(self, plan: state_pb2.AppliedPlan) -> OverlayEntry:
        """Apply `plan` optimistically (call `snapshot` first so the overlay
        sits on the newest replica state)."""
        entry = OverlayEntry(plan, self.generation, now_ns())
        self._store.apply(
            plan_change_batch(self._store.snapshot(), plan, entry.time), stamp_tables=False
        )
        self._entries.append(entry)
        return entry

    def committed(self, entry: OverlayEntry, index: int) -> None:
        """The entry's write committed at `index`."""
        entry.index = index

    def discard(self) -> None:
        """A write failed: forget every entry (they may depend on it) and
        start a new generation; plans evaluated on the old one are void."""
        self.generation += 1
        self._entries = []
        self._base_index = -1
        self._store = StateStore()
