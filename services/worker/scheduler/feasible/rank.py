"""Ranking: how good a feasible node is for one placement (Nomad's
`scheduler/feasible/rank.go`).

For each candidate the `Ranker`:

1. takes the node's proposed allocs (snapshot − plan stops/preemptions +
   plan placements) and sums what they use (`corral.domain.fit`);
2. checks the group's ports are free (static ports unused, enough room in
   the node's dynamic range) and assigns device instances; failure exhausts
   the node ("network: …", "devices: …"); dynamic ports are only picked for
   the chosen node;
3. checks the group fits next to them (cores, cpu, memory, disk, max allocs);
   if not, and preemption is on, asks `preemption` for lower-priority allocs
   to evict, else exhausts the node with the failing dimension;
4. scores it: bin-packing fit (or the "spread" algorithm) normalised to
   [0, 1]; job anti-affinity −(collisions+1)/count when the node already runs
   allocs of this job and group; −1 reschedule penalty for the previous
   node(s) of a rescheduled alloc; node affinity Σ matching weights / Σ|w|;
   the spread boost. The final score is the mean of the appended scores.

Only the chosen node's allocated resources are built as protobufs
(`finalize`), so the per-node loop stays cheap.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from corral.domain import node_pools
from corral.domain.fit import (
    MAX_VALID_PORT,
    Capacity,
    DeviceAccounter,
    NetworkIndex,
    Usage,
    node_capacity,
    usage_of,
)
from corral.domain.structs import SchedulerAlgorithm
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.constraints import (
    MatchCache,
    check_constraint,
    resolve_target,
)
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.devices import device_matches
from services.worker.scheduler.feasible.inflight import Claim
from services.worker.scheduler.feasible.preemption import preempt_for_task_group
from services.worker.scheduler.feasible.spread import SCORER_NAME as SPREAD_SCORER
from services.worker.scheduler.feasible.spread import SpreadScorer

#: the best raw fit score (20 − (10^0 + 10^0))
BINPACK_MAX_FIT_SCORE = 18.0


#: placeholder until `finalize` builds the chosen node's resources (never
#: handed out: only finalized options leave a select)
_PENDING = pb.Resources()


@dataclass(slots=True)
class RankedNode:
    """A scored candidate node; for the chosen one, the resources to put
    in the new alloc (`alloc_resources` are totals including assigned ports
    and devices; `task_resources` per task)."""

    node: pb.Node
    final_score: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
    alloc_resources: pb.Resources = field(default_factory=lambda: _PENDING)
    task_resources: dict[str, pb.Resources] = field(default_factory=dict)
    preempted_allocs: list[pb.Allocation] = field(default_factory=list)
    # assignments made while ranking/finalizing (None until needed)
    group_network: pb.NetworkResource | None = None
    task_networks: dict[str, pb.NetworkResource] | None = None
    task_devices: dict[str, list[pb.AllocatedDevice]] | None = None


def free_percentages(cap: Capacity, used: Usage) -> tuple[float, float]:
    """Free share of cpu and memory after `used` (over capacity net of
    reserved resources)."""
    cpu = 1.0 - used.cpu / cap.cpu if cap.cpu > 0 else 0.0
    mem = 1.0 - used.memory_mb / cap.memory_mb if cap.memory_mb > 0 else 0.0
    return cpu, mem


def score_fit_binpack(cap: Capacity, used: Usage) -> float:
    """20 − (10^free_cpu + 10^free_mem), clamped to [0, 18]: fuller is better."""
    fc, fm = free_percentages(cap, used)
    score: float = 20.0 - (math.pow(10.0, fc) + math.pow(10.0, fm))
    return min(max(score, 0.0), BINPACK_MAX_FIT_SCORE)


def score_fit_spread(cap: Capacity, used: Usage) -> float:
    """(10^free_cpu + 10^free_mem) − 2, clamped to [0, 18]: emptier is better."""
    fc, fm = free_percentages(cap, used)
    score: float = (math.pow(10.0, fc) + math.pow(10.0, fm)) - 2.0
    return min(max(score, 0.0), BINPACK_MAX_FIT_SCORE)


def _with_claims(used: Usage, claims: Claim, mhz_per_core: int) -> Usage:
    """`used` plus what the worker's other loops claimed on the node."""
    cpu, cores, mem, disk, n = claims
    return Usage(
        used.cpu + cpu + cores * mhz_per_core,
        used.cores + cores,
        used.memory_mb + mem,
        used.disk_mb + disk,
        used.allocs + n,
    )


def job_collisions(proposed: list[pb.Allocation], job_id: str, task_group: str) -> int:
    """Allocs of the job and group among `proposed` (the job anti-affinity
    score's collisions)."""
    n = 0
    for a in proposed:
        if a.job_id == job_id and a.task_group == task_group:
            n += 1
    return n


def affinity_score(affinities: list[pb.Affinity], node: pb.Node, cache: MatchCache) -> float:
    """Σ weights of matching affinities / Σ |weights|."""
    total_w = sum(abs(a.weight) for a in affinities)
    if total_w == 0:
        return 0.0
    score = 0.0
    for a in affinities:
        lval, lok = resolve_target(a.l_target, node)
        rval, rok = resolve_target(a.r_target, node)
        if check_constraint(a.operand, lval, rval, lok, rok, cache):
            score += a.weight
    return score / total_w


class Ranker:
    """Fits and scores candidate nodes for one task group at a time."""

    def __init__(
        self,
        ctx: EvalContext,
        rng: random.Random,
        *,
        spread: SpreadScorer | None = None,
        generic: bool = True,
    ) -> None:
        self.ctx = ctx
        self.rng = rng
        self.spread = spread
        self.generic = generic  # job anti-affinity, penalties, affinities
        cfg = ctx.snapshot.scheduler_config
        self.spread_algorithm = cfg.scheduler_algorithm == SchedulerAlgorithm.SPREAD
        self.memory_oversubscription = cfg.memory_oversubscription_enabled
        self.job: pb.Job | None = None
        self.tg: pb.TaskGroup | None = None
        self.evict = False
        self.penalty_node_ids: set[str] = set()
        self.affinities: list[pb.Affinity] = []
        self._caps: dict[str, Capacity] = {}
        self._used: dict[str, tuple[list[pb.Allocation], Usage]] = {}
        self._ports: dict[str, tuple[list[pb.Allocation], NetworkIndex, str, int]] = {}
        self._static_ports: list[tuple[str, int]] = []
        self._dynamic_ports = 0
        # the group's ask, precomputed per select
        self._cpu = self._cores = self._mem = self._disk = 0
        self._needs_network = False
        self._needs_devices = False
        self._preempted_counts: dict[tuple[str, str, str], int] | None = None
        # node id -> (its proposed allocs, ask key, exhausted dimension, fit,
        # collisions, the other loops' claims on it) at its last visit; the
        # key names the job, group and ask, so a group with another ask never
        # reuses another's fit
        self._ask_key: tuple[str, str, int, int, int, int] = ("", "", 0, 0, 0, 0)
        self._fit_memo: dict[
            str,
            tuple[
                list[pb.Allocation],
                tuple[str, str, int, int, int, int],
                str,
                float,
                int,
                Claim | None,
            ],
        ] = {}
        self._foreign: Claim | None = None  # the node being ranked's

    def set_job(self, job: pb.Job) -> None:
        """The job to rank for, with the scheduler configuration of its node
        pool (the pool's algorithm and memory oversubscription over the
        cluster's, Nomad's SchedulerConfiguration.WithNodePool)."""
        self.job = job
        snap = self.ctx.snapshot
        cfg = node_pools.effective_config(
            snap.scheduler_config, snap.node_pool_by_name(job.node_pool)
        )
        self.spread_algorithm = cfg.scheduler_algorithm == SchedulerAlgorithm.SPREAD
        self.memory_oversubscription = cfg.memory_oversubscription_enabled

    def set_task_group(
        self, tg: pb.TaskGroup, *, evict: bool = False, penalty_node_ids: set[str] | None = None
    ) -> None:
        job = self.job
        assert job is not None, "set_job first"
        self.tg = tg
        self.evict = evict
        self.penalty_node_ids = penalty_node_ids or set()
        cpu = cores = mem = 0
        needs_net = len(tg.networks) > 0
        needs_dev = False
        asks = list(tg.networks[:1])
        affinities = list(job.affinities) + list(tg.affinities)
        for t in tg.tasks:
            r = t.resources
            cpu += r.cpu
            cores += r.cores
            mem += r.memory_mb
            if len(r.networks):
                needs_net = True
                asks.append(r.networks[0])
            if len(r.devices):
                needs_dev = True
            affinities.extend(t.affinities)
        self._cpu, self._cores, self._mem = cpu, cores, mem
        self._disk = tg.ephemeral_disk.size_mb
        self._ask_key = (job.id, tg.name, cpu, cores, mem, self._disk)
        self._needs_network = needs_net
        self._static_ports = [(p.label, p.value) for a in asks for p in a.reserved_ports]
        self._dynamic_ports = sum(len(a.dynamic_ports) for a in asks)
        self._needs_devices = needs_dev
        self.affinities = affinities if self.generic else []
        self._preempted_counts = None

    def has_affinities(self) -> bool:
        return bool(self.affinities)

    # ------------------------------------------------------------ helpers

    def capacity(self, node: pb.Node) -> Capacity:
        cap = self._caps.get(node.id)
        if cap is None:
            cap = node_capacity(node)
            self._caps[node.id] = cap
        return cap

    def class_scorable(self) -> bool:
        """Does the current ask depend on nothing but the node's class, its
        summed usage and its free dynamic ports (no static ports, no
        devices, no eviction)? Then nodes of one class in the same state
        fit and score alike (`ClassIndex`)."""
        return self.generic and not (self.evict or self._static_ports or self._needs_devices)

    @property
    def needs_network(self) -> bool:
        return self._needs_network

    def dynamic_room(self, node: pb.Node, proposed: list[pb.Allocation]) -> int:
        """Free ports in the node's dynamic range next to `proposed`; -1
        when their ports already collide."""
        idx, reason, in_range = self._port_index(node, proposed)
        if reason:
            return -1
        return (idx.max_dynamic_port - idx.min_dynamic_port + 1) - in_range

    def _dynamic_ports_dim(self, room: int) -> str:
        """Why the group's dynamic ports do not fit in `room` free ones."""
        if self._dynamic_ports and room < self._dynamic_ports:
            return "network: dynamic port selection failed"
        return ""

    def exceeded_dimension(self, cap: Capacity, used: Usage, cpu: int, mem: int) -> str:
        """The first dimension the ask exceeds next to `used` ("" if it
        fits); `cpu` and `mem` are the totals with the ask (the same order
        as `corral.domain.fit.exceeded_dimension`)."""
        if cap.max_allocs and used.allocs + 1 > cap.max_allocs:
            return "max allocation exceeded"
        if used.cores + self._cores > cap.cores:
            return "cores"
        if cpu > cap.cpu:
            return "cpu"
        if mem > cap.memory_mb:
            return "memory"
        if used.disk_mb + self._disk > cap.disk_mb:
            return "disk"
        return ""

    def fit_outcome(self, cap: Capacity, used: Usage, room: int) -> tuple[str, float]:
        """(exceeded dimension, normalised fit score) of the ask on a node
        with capacity `cap` already using `used` (claims included) and
        `room` free dynamic ports (-1: its ports collide; read only when
        the ask has networks); the fit is -1 when a dimension is exceeded."""
        if self._needs_network:
            if room < 0:
                return "network: port collision", -1.0
            if dim := self._dynamic_ports_dim(room):
                return dim, -1.0
        cpu = used.cpu + self._cpu + self._cores * cap.mhz_per_core
        mem = used.memory_mb + self._mem
        dim = self.exceeded_dimension(cap, used, cpu, mem)
        if dim:
            return dim, -1.0
        return "", self._fit_score(cap, cpu, mem)

    def _fit_score(self, cap: Capacity, cpu: int, mem: int) -> float:
        """Bin-packing (or spread-algorithm) fit over the free share of cpu
        and memory once `cpu` and `mem` are used, normalised to [0, 1]."""
        free_cpu = 1.0 - cpu / cap.cpu if cap.cpu > 0 else 0.0
        free_mem = 1.0 - mem / cap.memory_mb if cap.memory_mb > 0 else 0.0
        if self.spread_algorithm:
            fit = (math.pow(10.0, free_cpu) + math.pow(10.0, free_mem)) - 2.0
        else:
            fit = 20.0 - (math.pow(10.0, free_cpu) + math.pow(10.0, free_mem))
        return min(max(fit, 0.0), BINPACK_MAX_FIT_SCORE) / BINPACK_MAX_FIT_SCORE

    @property
    def ask_key(self) -> tuple[object, ...]:
        """Names the current ask and everything its fit score depends on."""
        return (*self._ask_key, self.spread_algorithm, self._needs_network, self._dynamic_ports)

    def usage(self, node: pb.Node, proposed: list[pb.Allocation], foreign: Claim | None) -> Usage:
        """What the node's proposed allocs and the other loops' claims use."""
        cap = self.capacity(node)
        used = self._usage(node.id, proposed, cap.mhz_per_core)
        if foreign is not None:
            used = _with_claims(used, foreign, cap.mhz_per_core)
        return used

    def _usage(self, node_id: str, proposed: list[pb.Allocation], mhz: int) -> Usage:
        hit = self._used.get(node_id)
        if hit is not None and hit[0] is proposed:
            return hit[1]
        used = usage_of(proposed, mhz)
        self._used[node_id] = (proposed, used)
        return used

    def _port_index(
        self, node: pb.Node, proposed: list[pb.Allocation]
    ) -> tuple[NetworkIndex, str, int]:
        """The node's used ports (cached while its proposed allocs are
        unchanged), a collision reason if its state is already invalid, and
        how many used ports fall in its dynamic range."""
        hit = self._ports.get(node.id)
        if hit is not None and hit[0] is proposed:
            return hit[1], hit[2], hit[3]
        idx, reason = NetworkIndex.for_node(node, proposed)
        lo, hi = idx.min_dynamic_port, idx.max_dynamic_port
        in_range = sum(1 for p in idx.used if lo <= p <= hi)
        self._ports[node.id] = (proposed, idx, reason, in_range)
        return idx, reason, in_range

    def _ports_available(self, node: pb.Node, proposed: list[pb.Allocation]) -> bool:
        """Can the group's ports be had on the node? Only checked here; the
        dynamic ports are picked for the chosen node alone (`finalize`)."""
        idx, reason, in_range = self._port_index(node, proposed)
        if reason:
            self.ctx.exhausted_node(node, "network: port collision")
            return False
        used = idx.used
        lo, hi = idx.min_dynamic_port, idx.max_dynamic_port
        seen: set[int] = set()
        for label, v in self._static_ports:
            if v <= 0 or v >= MAX_VALID_PORT:
                self.ctx.exhausted_node(node, f"network: invalid port {v} (out of range)")
                return False
            if v in used or v in seen:
                self.ctx.exhausted_node(node, f"network: reserved port collision {label}={v}")
                return False
            seen.add(v)
            if lo <= v <= hi:
                in_range += 1
        if dim := self._dynamic_ports_dim((hi - lo + 1) - in_range):
            self.ctx.exhausted_node(node, dim)
            return False
        return True

    def _assign_networks(self, option: RankedNode) -> None:
        """Pick the chosen node's ports (static as asked, dynamic at random
        from the free part of its range)."""
        tg = self.tg
        assert tg is not None
        node = option.node
        idx = self._port_index(node, self.ctx.proposed_allocs(node.id))[0].copy()
        if len(tg.networks):
            option.group_network = idx.assign(tg.networks[0], self.rng)
        for t in tg.tasks:
            if len(t.resources.networks):
                if option.task_networks is None:
                    option.task_networks = {}
                option.task_networks[t.name] = idx.assign(t.resources.networks[0], self.rng)

    def _assign_devices(
        self, node: pb.Node, proposed: list[pb.Allocation]
    ) -> dict[str, list[pb.AllocatedDevice]] | None:
        """Free device instances for each task's requests, or None (node
        exhausted)."""
        tg = self.tg
        assert tg is not None
        acct = DeviceAccounter(node)
        acct.add_allocs(proposed)
        devices = node.node_resources.devices
        out: dict[str, list[pb.AllocatedDevice]] = {}
        for t in tg.tasks:
            for req in t.resources.devices:
                want = req.count or 1
                for dev in devices:
                    if not device_matches(req, dev, self.ctx.match_cache):
                        continue
                    key = (dev.vendor, dev.type, dev.name)
                    free = acct.free_instances(key)
                    if len(free) < want:
                        continue
                    ids = free[:want]
                    for iid in ids:
                        acct.instances[key][iid] += 1
                    out.setdefault(t.name, []).append(
                        pb.AllocatedDevice(
                            vendor=dev.vendor, type=dev.type, name=dev.name, device_ids=ids
                        )
                    )
                    break
                else:
                    self.ctx.exhausted_node(node, "devices: no devices match request")
                    return None
        return out

    def _already_preempted(self) -> dict[tuple[str, str, str], int]:
        if self._preempted_counts is None:
            counts: dict[tuple[str, str, str], int] = {}
            snap = self.ctx.snapshot
            for lst in self.ctx.plan.node_preemptions.values():
                for s in lst.stops:
                    a = snap.alloc_by_id(s.alloc_id)
                    if a is not None:
                        key = (a.namespace or "default", a.job_id, a.task_group)
                        counts[key] = counts.get(key, 0) + 1
            self._preempted_counts = counts
        return self._preempted_counts

    def _preempt(
        self, cap: Capacity, proposed: list[pb.Allocation], ask: Usage, foreign: Claim | None
    ) -> list[pb.Allocation] | None:
        job = self.job
        assert job is not None
        snap = self.ctx.snapshot
        max_parallel: dict[tuple[str, str, str], int] = {}
        priority_of: dict[str, int] = {}
        for a in proposed:
            key = (a.namespace or "default", a.job_id, a.task_group)
            if key in max_parallel:
                continue
            vj = snap.job_by_id(a.namespace, a.job_id)
            mp = 0
            if vj is not None:
                priority_of[a.job_id] = vj.priority
                for g in vj.task_groups:
                    if g.name == a.task_group:
                        mp = g.migrate.max_parallel
            max_parallel[key] = mp
        return preempt_for_task_group(
            capacity=cap,
            current=proposed,
            ask=ask,
            priority=job.priority,
            namespace=job.namespace,
            job_id=job.id,
            max_parallel_of=max_parallel,
            already_preempted=self._already_preempted(),
            priority_of=priority_of,
            claimed=foreign,
        )

    # ------------------------------------------------------------ rank

    def rank(self, node: pb.Node) -> RankedNode | None:
        """Fit and score `node`, or None (recorded as exhausted).

        The hot loop of every select: plain ints and dicts only, no
        protobufs built here."""
        ctx = self.ctx
        tg = self.tg
        job = self.job
        assert tg is not None and job is not None
        proposed = ctx.proposed_allocs(node.id)
        # capacity the worker's other loops claimed here (feasible/inflight.py)
        foreign = self._foreign = ctx.foreign_usage(node.id) if ctx.inflight is not None else None
        memo = self._fit_memo.get(node.id)
        if (
            memo is not None
            and memo[0] is proposed
            and memo[1] == self._ask_key
            and memo[5] == foreign
            and not memo[2]
            and not self._needs_network
            and not self._needs_devices
        ):
            # the node's proposed allocs and the ask are what they were at
            # its last visit, when the group fit: so do the fit score and
            # the collisions
            return self._score(node, proposed, memo[3], memo[4], None, [])
        cap = self.capacity(node)
        used = self._usage(node.id, proposed, cap.mhz_per_core)
        if foreign is not None:
            used = _with_claims(used, foreign, cap.mhz_per_core)
        if self._needs_network and not self._ports_available(node, proposed):
            return None
        devices: dict[str, list[pb.AllocatedDevice]] | None = None
        if self._needs_devices:
            devices = self._assign_devices(node, proposed)
            if devices is None:
                return None
        ask_cpu = self._cpu + self._cores * cap.mhz_per_core
        cpu = used.cpu + ask_cpu
        mem = used.memory_mb + self._mem
        if (
            memo is not None
            and memo[0] is proposed
            and memo[1] == self._ask_key
            and memo[5] == foreign
        ):
            dim, fit, collisions = memo[2], memo[3], memo[4]
        else:
            fit = -1.0
            collisions = -1
            dim = self.exceeded_dimension(cap, used, cpu, mem)
        victims: list[pb.Allocation] = []
        if dim:
            self._fit_memo[node.id] = (proposed, self._ask_key, dim, -1.0, -1, foreign)
            ask = Usage(ask_cpu, self._cores, self._mem, self._disk, 1)
            found = self._preempt(cap, proposed, ask, foreign) if self.evict else None
            if not found:
                ctx.exhausted_node(node, dim)
                return None
            victims = found
            for v in victims:
                vr = v.resources
                cpu -= vr.cpu + vr.cores * cap.mhz_per_core
                mem -= vr.memory_mb

        if victims or fit < 0.0:
            # fit score over the free share of cpu and memory after placing
            fit = self._fit_score(cap, cpu, mem)
            collisions = -1
        return self._score(node, proposed, fit, collisions, devices, victims)

    def _score(
        self,
        node: pb.Node,
        proposed: list[pb.Allocation],
        fit: float,
        collisions: int,
        devices: dict[str, list[pb.AllocatedDevice]] | None,
        victims: list[pb.Allocation],
    ) -> RankedNode:
        """The node's scores given its fit (and collisions, -1 = not
        counted yet); records them in the context's top scores."""
        tg = self.tg
        job = self.job
        assert tg is not None and job is not None
        scores = {"binpack": fit}
        total = fit
        if self.generic:
            if collisions < 0:
                collisions = job_collisions(proposed, job.id, tg.name)
                if not victims:
                    self._fit_memo[node.id] = (
                        proposed,
                        self._ask_key,
                        "",
                        fit,
                        collisions,
                        self._foreign,
                    )
            if collisions:
                s = -(collisions + 1) / max(tg.count, 1)
                scores["job-anti-affinity"] = s
                total += s
            if node.id in self.penalty_node_ids:
                scores["node-reschedule-penalty"] = -1.0
                total -= 1.0
            if self.affinities:
                s = affinity_score(self.affinities, node, self.ctx.match_cache)
                scores["node-affinity"] = s
                total += s
            spread = self.spread
            if spread is not None and spread.active:
                s = spread.score(node)
                if s != 0.0:
                    scores[SPREAD_SCORER] = s
                    total += s
            final = total / len(scores)
            ctx = self.ctx
            if ctx.keeps_score(final):
                # the metric also lists the scorers that had nothing to say
                # (built only for the few nodes that enter the top scores)
                meta = {
                    "binpack": fit,
                    "job-anti-affinity": 0.0,
                    "node-reschedule-penalty": 0.0,
                    "node-affinity": 0.0,
                }
                meta.update(scores)
                ctx.record_node_scores(node.id, meta, final)
        else:
            final = total / len(scores)
            self.ctx.record_node_scores(node.id, dict(scores), final)
        return RankedNode(
            node,
            final,
            scores,
            task_devices=devices,
            preempted_allocs=victims,
        )

    # ------------------------------------------------------------ result

    def finalize(self, option: RankedNode) -> RankedNode:
        """Build the chosen node's task and alloc resources."""
        tg = self.tg
        assert tg is not None
        if self._needs_network:
            self._assign_networks(option)
        total = pb.Resources(disk_mb=tg.ephemeral_disk.size_mb)
        if option.group_network is not None:
            total.networks.append(option.group_network)
        for t in tg.tasks:
            r = t.resources
            tr = pb.Resources(
                cpu=r.cpu,
                cores=r.cores,
                memory_mb=r.memory_mb,
                memory_max_mb=r.memory_max_mb if self.memory_oversubscription else 0,
                devices=r.devices,
            )
            net = option.task_networks.get(t.name) if option.task_networks else None
            if net is not None:
                tr.networks.append(net)
                total.networks.append(net)
            devs = option.task_devices.get(t.name) if option.task_devices else None
            if devs:
                tr.allocated_devices.extend(devs)
                total.allocated_devices.extend(devs)
            option.task_resources[t.name] = tr
            total.cpu += tr.cpu
            total.cores += tr.cores
            total.memory_mb += tr.memory_mb
            total.memory_max_mb += tr.memory_max_mb if tr.memory_max_mb > 0 else tr.memory_mb
            total.devices.extend(r.devices)
        option.alloc_resources = total
        return option
