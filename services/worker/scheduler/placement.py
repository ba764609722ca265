"""Placing allocations through the feasibility/ranking stack, shared by
the generic and the system schedulers (Nomad's `computePlacements` /
`selectNextOption` seam): choose a node for one alloc, build the alloc in
the plan, check in-place fits, and report metrics and class eligibility for
blocked evals."""

from __future__ import annotations

import logging

from corral.domain import structs
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, DesiredStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.inflight import InFlightPlacements
from services.worker.scheduler.feasible.rank import RankedNode
from services.worker.scheduler.feasible.stack import GenericStack, SelectOptions, SystemStack

#: selects one placement may take when other loops keep claiming the
#: chosen node first; the last choice is then claimed regardless
MAX_CLAIM_ATTEMPTS = 4


class Placer:
    """The schedulers' seam onto the feasibility/ranking stack: choose a
    node for one alloc, build the alloc in the plan, check in-place fits,
    and report metrics and class eligibility for blocked evals."""

    def __init__(
        self,
        snap: StateSnapshot,
        plan: pb.Plan,
        log: logging.Logger,
        batch: bool,
        job: pb.Job | None,
        *,
        system: bool = False,
        sysbatch: bool = False,
        inflight: InFlightPlacements | None = None,
    ) -> None:

        self.snap = snap
        self.plan = plan
        self.log = log
        #: the worker process's claims (feasible/inflight.py); None: Nomad's view
        self.inflight = inflight
        self.ctx = EvalContext(snap, plan, log, inflight)
        self.stack: GenericStack | SystemStack
        if system:
            self.stack = SystemStack(sysbatch, self.ctx)
        else:
            self.stack = GenericStack(batch, self.ctx)
        self.nodes: list[pb.Node] = []
        self.nodes_by_dc: dict[str, int] = {}
        if job is not None and not job.stop:
            self.stack.set_job(job)

    def set_nodes(self, nodes: list[pb.Node]) -> None:
        self.stack.set_nodes(nodes)

    def set_nodes_for_job(self, job: pb.Job) -> None:
        self.nodes, _, self.nodes_by_dc = util.ready_nodes_in_dcs(
            self.snap, job.datacenters, job.node_pool
        )
        self.stack.set_nodes(self.nodes)

    def begin_placements(self, selects: int) -> None:
        """The placement loop of about `selects` placements starts: from
        here on every plan edit goes through `new_alloc` or is reported with
        `plan_edited`, so the stack's counts follow the plan by journal
        (`track_plan_edits`); the count tells the stack whether the class
        index will pay for itself (`GenericStack.expect_selects`)."""
        self.ctx.track_plan_edits()
        if isinstance(self.stack, GenericStack):
            self.stack.expect_selects(selects)

    def plan_edited(self, node_id: str) -> None:
        """The caller changed the plan's entries for `node_id`."""
        self.ctx.invalidate(node_id)

    def select(
        self,
        tg: pb.TaskGroup,
        *,
        alloc_name: str,
        penalty_node_ids: set[str] | None = None,
        preferred_node: pb.Node | None = None,
        claim: bool = True,
    ) -> RankedNode | None:
        """The node for one alloc of `tg`; in a worker process its resources
        are claimed there for the other loops (`claim`: the caller puts the
        alloc in the plan). When another loop claimed on the chosen node
        while this one ranked it, the node is ranked again, by selecting
        again."""
        opts = SelectOptions(
            alloc_name=alloc_name,
            penalty_node_ids=penalty_node_ids or set(),
            preferred_nodes=[preferred_node] if preferred_node is not None else [],
        )
        option = self.stack.select(tg, opts)
        inflight = self.inflight
        if inflight is None or not claim:
            return option
        ev = self.plan.eval_id
        for attempt in range(1, MAX_CLAIM_ATTEMPTS + 1):
            if option is None:
                return None
            node_id = option.node.id
            r = option.alloc_resources
            usage = (r.cpu, r.cores, r.memory_mb, r.disk_mb or tg.ephemeral_disk.size_mb, 1)
            seen = self.ctx.claims_seen(node_id) if attempt < MAX_CLAIM_ATTEMPTS else None
            if inflight.claim(ev, node_id, seen, usage):
                return option
            option = self.stack.select(tg, opts)
        return option

    def nodes_filtered(self) -> int:
        return int(self.ctx.metrics.nodes_filtered)

    def failure_metrics(
        self, tg: pb.TaskGroup, nodes_by_dc: dict[str, int] | None = None
    ) -> pb.AllocMetric:
        m = structs.copy_msg(self.ctx.metrics)
        for dc, n in (nodes_by_dc if nodes_by_dc is not None else self.nodes_by_dc).items():
            m.nodes_available[dc] = n
        m.nodes_in_pool = len(self.nodes) if nodes_by_dc is None else sum(nodes_by_dc.values())
        if self.stack.job is not None:
            m.node_pool = self.stack.job.node_pool
        return m

    def eligibility(self) -> tuple[dict[str, bool], bool, bool]:
        e = self.ctx.eligibility
        return dict(e.get_classes()), bool(e.has_escaped()), bool(e.quota_limit_reached())

    def fits_in_place(self, existing: pb.Allocation, node: pb.Node, tg: pb.TaskGroup) -> bool:
        """Would the updated group still be feasible and fit on the alloc's
        own node, counting the alloc's own resources as free?"""
        util.append_stopped_alloc(self.plan, existing, util.ALLOC_IN_PLACE)
        try:
            self.stack.set_nodes([node])
            option = self.select(tg, alloc_name=existing.name, claim=False)
        finally:
            util.pop_update(self.plan, existing)
            if self.nodes:
                self.stack.set_nodes(self.nodes)
        return option is not None

    def new_alloc(
        self, ev: pb.Evaluation, job: pb.Job, tg: pb.TaskGroup, name: str, option: RankedNode
    ) -> pb.Allocation:
        """Build the new alloc directly inside the plan (no extra copy)."""
        node = option.node
        a = self.plan.node_allocation[node.id].allocs.add(
            id=structs.new_id(),
            namespace=job.namespace,
            eval_id=ev.id,
            name=name,
            node_id=node.id,
            node_name=node.name,
            job_id=job.id,
            job_version=job.version,
            job_modify_index=job.job_modify_index,
            task_group=tg.name,
            desired_status=DesiredStatus.RUN,
            client_status=ClientStatus.PENDING,
            job_type=job.type,
            job_priority=job.priority,
        )
        # totals include the assigned ports and devices
        a.resources.CopyFrom(option.alloc_resources)
        if not a.resources.disk_mb:
            a.resources.disk_mb = tg.ephemeral_disk.size_mb
        for task_name, r in option.task_resources.items():
            a.task_resources[task_name].CopyFrom(r)
        m = a.metrics
        m.CopyFrom(self.ctx.metrics)
        for dc, n in self.nodes_by_dc.items():
            m.nodes_available[dc] = n
        m.nodes_in_pool = len(self.nodes)
        m.node_pool = job.node_pool
        for victim in option.preempted_allocs:
            util.append_preempted_alloc(self.plan, victim, a.id)
            a.preempted_allocations.append(victim.id)
            self.ctx.invalidate(victim.node_id)
        self.ctx.invalidate(node.id)
        return a
