"""Blocked evals (Nomad's nomad/blocked_evals.go): evals that could not
place everything wait here until the cluster gains capacity they can use.

* one blocked eval per job: the newer (by max(create index, snapshot
  index)) wins, the other becomes a duplicate to cancel;
* captured by computed node class eligibility, or *escaped* when the
  scheduler could not trust class caching (constraints on unique data);
* system-job evals are also keyed by node and released by that node;
* a capacity change (node ready/eligible, allocs finishing) releases the
  escaped evals and every captured eval whose class eligibility does not
  explicitly rule the class out;
* an eval blocked on a snapshot older than an unblock it would have matched
  is released at once (the missed-unblock check).

Released evals are handed to `on_release(evals, index)`; the broker service
writes them back as pending so workers wait for the state that unblocked them.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.domain.structs import JobType, Trigger, job_key
from corral.v1 import structs_pb2 as pb

JobKey = tuple[str, str]
Release = Callable[[list[pb.Evaluation], int], None]


class BlockedEvals:
    def __init__(self, on_release: Release) -> None:
        self.on_release = on_release
        self.enabled = False
        self._reset()

    def _reset(self) -> None:
        self._captured: dict[str, pb.Evaluation] = {}
        self._escaped: dict[str, pb.Evaluation] = {}
        self._by_job: dict[JobKey, str] = {}
        self._system: dict[tuple[JobKey, str], str] = {}  # (job, node) -> eval id
        self._unblock_index: dict[str, int] = {}  # computed class -> last unblock index
        self._any_unblock_index = 0
        self.duplicates: list[pb.Evaluation] = []

    def set_enabled(self, enabled: bool) -> None:
        if self.enabled == enabled:
            return
        self.enabled = enabled
        if not enabled:
            self._reset()

    # ------------------------------------------------------------ block

    def block(self, ev: pb.Evaluation) -> None:
        """Track a blocked eval (new, or reblocked by its worker's decision)."""
        if not self.enabled:
            return
        key = job_key(ev.namespace, ev.job_id)
        existing_id = self._by_job.get(key)
        if existing_id == ev.id:
            self._remove(ev.id)
        elif existing_id is not None:
            existing = self._get(existing_id)
            if existing is not None:
                if _age(existing) <= _age(ev):
                    self._remove(existing_id)
                    self.duplicates.append(existing)
                else:
                    self.duplicates.append(ev)
                    return
        if self._missed_unblock(ev):
            self.on_release([ev], max(self._any_unblock_index, ev.snapshot_index))
            return
        if ev.escaped_computed_class:
            self._escaped[ev.id] = ev
        else:
            self._captured[ev.id] = ev
        self._by_job[key] = ev.id
        if ev.type == JobType.SYSTEM and ev.node_id:
            self._system[(key, ev.node_id)] = ev.id

    def _missed_unblock(self, ev: pb.Evaluation) -> bool:
        if ev.escaped_computed_class:
            return self._any_unblock_index > ev.snapshot_index
        for klass, index in self._unblock_index.items():
            if index <= ev.snapshot_index:
                continue
            eligible = ev.class_eligibility.get(klass)
            if eligible is None or eligible:
                return True
        return False

    def _get(self, eval_id: str) -> pb.Evaluation | None:
        return self._captured.get(eval_id) or self._escaped.get(eval_id)

    def _remove(self, eval_id: str) -> pb.Evaluation | None:
        ev = self._captured.pop(eval_id, None) or self._escaped.pop(eval_id, None)
        if ev is None:
            return None
        key = job_key(ev.namespace, ev.job_id)
        if self._by_job.get(key) == eval_id:
            del self._by_job[key]
        for k in [k for k, v in self._system.items() if v == eval_id]:
            del self._system[k]
        return ev

    def untrack(self, namespace: str, job_id: str) -> None:
        """The job's eval completed with everything placed."""
        eval_id = self._by_job.get(job_key(namespace, job_id))
        if eval_id is not None:
            self._remove(eval_id)

    def retain(self, keep: Callable[[pb.Evaluation], bool]) -> None:
        """Drop the tracked evals `keep` rejects (after a replica reset)."""
        for ev in [*self._captured.values(), *self._escaped.values()]:
            if not keep(ev):
                self._remove(ev.id)

    def tracked(self, eval_id: str) -> bool:
        return self._get(eval_id) is not None

    # ------------------------------------------------------------ unblock

    def unblock(self, computed_class: str, index: int) -> None:
        """Capacity appeared on nodes of `computed_class` at `index`."""
        if not self.enabled:
            return
        self._unblock_index[computed_class] = max(index, self._unblock_index.get(computed_class, 0))
        self._any_unblock_index = max(self._any_unblock_index, index)
        released = list(self._escaped.values())
        for ev in self._captured.values():
            if ev.class_eligibility.get(computed_class, True):
                released.append(ev)
        self._release(released, index)

    def unblock_node(self, node_id: str, index: int) -> None:
        """A node gained capacity: release system evals blocked on it."""
        if not self.enabled:
            return
        ids = {v for (_, node), v in self._system.items() if node == node_id}
        released = [e for i in ids if (e := self._get(i)) is not None]
        self._release(released, index)

    def unblock_failed(self) -> None:
        """Retry evals blocked after max plan attempts (plan conflicts)."""
        released = [
            e
            for e in [*self._captured.values(), *self._escaped.values()]
            if e.triggered_by == Trigger.MAX_PLAN_ATTEMPTS
        ]
        self._release(released, self._any_unblock_index)

    def _release(self, evals: list[pb.Evaluation], index: int) -> None:
        if not evals:
            return
        for ev in evals:
            self._remove(ev.id)
        self.on_release(evals, index)

    # ------------------------------------------------------------ stats

    def take_duplicates(self) -> list[pb.Evaluation]:
        out, self.duplicates = self.duplicates, []
        return out

    @property
    def total_blocked(self) -> int:
        return len(self._captured) + len(self._escaped)

    def by_scheduler(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in [*self._captured.values(), *self._escaped.values()]:
            out[e.type] = out.get(e.type, 0) + 1
        return out

    @property
    def total_escaped(self) -> int:
        return len(self._escaped)


def _age(ev: pb.Evaluation) -> int:
    return max(ev.create_index, ev.snapshot_index)
