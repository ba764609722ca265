"""Capacity the other scheduler loops of this worker process have claimed
that an eval's snapshot does not show yet (issue 30: no plan collisions).

Nomad's schedulers each plan against their own snapshot; concurrent evals
that want the same capacity learn of each other only when the plan
applier rejects one of them, which then refreshes and re-plans. With
binpack every eval heads for the fullest feasible nodes, so evals running
side by side on one snapshot collide on exactly those nodes: in the
reference W2 run (20 jobs of 1,000 allocs after W1's 10,000, 16 loops) 55
of 74 plans were partial and 19% of the node-plans rejected. Shuffling the
node order per eval and ranking only ⌈log2 n⌉ candidates, which the stack
does as Nomad does, cannot prevent it: an eval of 200 allocs per group
walks every node of its class several times, so each eval sees, and
picks, every near-full node.

The loops of one worker process share this registry. When an eval has
chosen a node for an alloc it *claims* the alloc's resources there; the
other evals of the process add what is claimed on a node to its usage
(`EvalContext.foreign_usage`, read by the ranker) until their snapshot
holds it: while its plan is in flight, and once committed at index C for
every eval whose snapshot is older than C. The plan result settles an
eval's claims: those on nodes the planner accepted are committed at the
result's index, the others dropped; whatever an eval claimed and did not
commit is dropped when it ends.

A claim names the version of the node's claims the eval ranked the node
with, and fails if another loop claimed on that node since (the
interpreter switched loops in the middle of the select): the eval then
selects again, seeing the new claim. So two loops never both take the
last room on a node, and no loop waits on another.

Only resources are claimed (cpu, cores, memory, disk, one alloc): ports,
devices, distinct_hosts and job anti-affinity still see the snapshot and
the eval's own plan, and the planner still checks every plan, so a stale
claim can cost at worst a less tightly packed node, never an
over-committed one. An eval alone in its process places exactly as
Nomad's. Loops in other worker processes are not seen: across processes
the planner's rejection remains the only arbiter, as in Nomad.

Writes take a lock held for a few dictionary operations; reads (one per
node visit, the select's hot path) take none: a node's claims are an
immutable tuple replaced on change, with a version bumped alongside. A
reader takes the version first and the claims second, so a claim landing
between the two makes the reader's later claim fail its version check
rather than go unseen.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from typing import NamedTuple

__all__ = ["Claim", "InFlightPlacements"]

#: cpu MHz, cores, memory MB, disk MB, allocs
Claim = tuple[int, int, int, int, int]
#: changed nodes kept for `changes_since` (a reader further behind
#: re-reads every node)
_MAX_LOG = 8192


class _Claim(NamedTuple):
    eval_id: str
    usage: Claim
    committed_at: int  # the index its plan committed at; 0 while in flight


class InFlightPlacements:
    """The claims of one worker process's scheduler loops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_node: dict[str, tuple[_Claim, ...]] = {}
        #: node id -> the version of its claims (read it, never write it:
        #: the select's hot path reads it without a call)
        self.versions: dict[str, int] = {}
        self._nodes_of: dict[str, set[str]] = {}  # eval id -> nodes it claimed on
        self._snapshots: dict[str, int] = {}  # running eval id -> its snapshot index
        self._newest = 0  # newest snapshot index begun: later snapshots are at least this
        self._pruned_at = -1  # the floor of the last prune
        self._committed: list[tuple[int, str]] = []  # heap of (committed at, node id)
        self._counter = itertools.count(1)
        # the nodes whose claims changed, in order (`changes_since`); the
        # first `_log_base` entries were dropped
        self._log: list[str] = []
        self._log_base = 0
        #: claims made, refused for a stale version (the eval selected
        #: again) and forced after too many refusals, since the start
        self.outcomes = {"claimed": 0, "conflict": 0, "forced": 0}

    # ------------------------------------------------------------ reads

    def version(self, node_id: str) -> int:
        """Changes whenever the node's claims do (0: never had any)."""
        return self.versions.get(node_id, 0)

    def foreign(self, node_id: str, eval_id: str, snapshot_index: int) -> Claim | None:
        """What other evals claimed on the node that a snapshot at
        `snapshot_index` does not hold (in flight, or committed after it),
        summed; None when nothing."""
        found = self._by_node.get(node_id)
        if not found:
            return None
        cpu = cores = mem = disk = n = 0
        for c in found:
            if c.eval_id != eval_id and (not c.committed_at or c.committed_at > snapshot_index):
                u = c.usage
                cpu += u[0]
                cores += u[1]
                mem += u[2]
                disk += u[3]
                n += u[4]
        return (cpu, cores, mem, disk, n) if n else None

    def changes_since(self, position: int) -> tuple[int, list[str] | None]:
        """(the log's position now, the nodes whose claims changed since
        `position`); None for the nodes when that part of the log was
        dropped: then re-read every node."""
        with self._lock:
            log = self._log
            end = self._log_base + len(log)
            if position < self._log_base:
                return end, None
            return end, log[position - self._log_base :]

    def _changed(self, node_id: str) -> None:
        """The node's claims changed: a new version, logged; lock held."""
        self.versions[node_id] = next(self._counter)
        log = self._log
        log.append(node_id)
        if len(log) > _MAX_LOG:
            drop = len(log) // 2
            del log[:drop]
            self._log_base += drop

    def count(self) -> int:
        """Claims held (in flight, or committed and not yet pruned)."""
        return sum(len(v) for v in self._by_node.values())

    # ------------------------------------------------------------ the eval's life

    def begin(self, eval_id: str, snapshot_index: int) -> None:
        """`eval_id` is scheduled from a snapshot at `snapshot_index` (again
        after a refresh, with the fresher snapshot's index)."""
        with self._lock:
            self._snapshots[eval_id] = snapshot_index
            self._newest = max(self._newest, snapshot_index)
            self._prune()

    def claim(self, eval_id: str, node_id: str, seen_version: int | None, usage: Claim) -> bool:
        """The eval chose the node for an alloc using `usage`, having ranked
        it at `seen_version` of the node's claims. False, claiming nothing,
        when another eval claimed on the node since: rank it again. A
        `seen_version` of None claims whatever happened meanwhile."""
        with self._lock:
            if seen_version is not None and self.versions.get(node_id, 0) != seen_version:
                self.outcomes["conflict"] += 1
                return False
            self.outcomes["claimed" if seen_version is not None else "forced"] += 1
            self._by_node[node_id] = (*self._by_node.get(node_id, ()), _Claim(eval_id, usage, 0))
            self._nodes_of.setdefault(eval_id, set()).add(node_id)
            self._changed(node_id)
            return True

    def settle(self, eval_id: str, accepted: set[str], index: int) -> None:
        """The eval's plan result: its claims on the `accepted` nodes
        committed at `index`; every other claim it has in flight will never
        commit and is dropped."""
        with self._lock:
            for node_id in self._nodes_of.get(eval_id, set()):
                self._settle(node_id, eval_id, index if node_id in accepted else 0)
            self._prune()

    def end(self, eval_id: str) -> None:
        """The eval is done: what it claimed and did not commit is dropped."""
        with self._lock:
            self._snapshots.pop(eval_id, None)
            for node_id in self._nodes_of.pop(eval_id, set()):
                self._settle(node_id, eval_id, 0)
            self._prune()

    # ------------------------------------------------------------ bookkeeping

    def _settle(self, node_id: str, eval_id: str, committed_at: int) -> None:
        """The eval's in-flight claims on the node committed at
        `committed_at`, or dropped when it is 0; lock held."""
        current = self._by_node.get(node_id, ())
        out = []
        touched = False
        for c in current:
            if c.eval_id == eval_id and not c.committed_at:
                touched = True
                if committed_at:
                    out.append(c._replace(committed_at=committed_at))
            else:
                out.append(c)
        if not touched:
            return
        if out:
            self._by_node[node_id] = tuple(out)
        else:
            self._by_node.pop(node_id, None)
        if committed_at:
            heapq.heappush(self._committed, (committed_at, node_id))
        self._changed(node_id)

    def _prune(self) -> None:
        """Drop committed claims that every snapshot in use holds, and every
        later one will (snapshots only move forward); lock held. No eval
        counted them, so no version changes."""
        floor = min([self._newest, *self._snapshots.values()])
        if floor == self._pruned_at:
            return
        self._pruned_at = floor
        committed = self._committed
        while committed and committed[0][0] <= floor:
            _, node_id = heapq.heappop(committed)
            current = self._by_node.get(node_id)
            if current is None:
                continue
            keep = tuple(c for c in current if not c.committed_at or c.committed_at > floor)
            if not keep:
                del self._by_node[node_id]
            elif len(keep) != len(current):
                self._by_node[node_id] = keep
