"""The cluster reconciler for service and batch jobs (Nomad's
`scheduler/reconciler/reconcile_cluster.go`): pure alloc-set arithmetic that
compares a job with its existing allocs and the state of their nodes, and
says per task group what to place, stop, update in place or destructively,
migrate, mark lost/unknown, reconnect, and reschedule now or later.

It reads nothing but its inputs and writes nothing: the generic scheduler
turns the result into a plan. A service group with an update block rolls
out under a deployment: the first eval of a job version that places or
updates allocs creates it, at most `max_parallel` of the deployment's allocs
are pending or unhealthy at once, a paused or failed deployment replaces
nothing more, and the broker's deployment watcher sends the eval that rolls
the next batch. With `canary = N` a destructive update first places N
canaries of the new version beside the old allocs and replaces nothing
until the deployment is promoted; then each canary takes the place of the
old alloc of its name and the rest roll as usual. Other groups with
`max_parallel` (batch jobs) are continued with a `rolling-update` eval
after `stagger`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from corral.domain import deployments, structs
from corral.domain.structs import ClientStatus, DeploymentStatus, DesiredStatus, NodeStatus, Trigger
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from services.worker.scheduler.reconcile.allocs import (
    AllocNameIndex,
    AllocSet,
    DelayedReschedule,
    classify,
    difference,
    disconnect_timeout,
    filter_by_reschedulable,
    filter_server_terminal,
    name_order,
    union,
    wait_client_stop,
)

#: (existing alloc, new job, new group) -> (ignore, destructive, in-place alloc)
AllocUpdateFn = Callable[
    [pb.Allocation, pb.Job, pb.TaskGroup], tuple[bool, bool, pb.Allocation | None]
]


@dataclass
class PlaceResult:
    """One alloc to place: a new name, a replacement or a reschedule."""

    name: str
    task_group: pb.TaskGroup
    previous_alloc: pb.Allocation | None = None
    reschedule: bool = False
    lost: bool = False
    #: destructive updates stop the previous alloc as part of the placement
    stop_previous: bool = False
    stop_description: str = ""
    #: a canary of the deployment (placed beside the alloc it will replace)
    canary: bool = False


@dataclass
class StopResult:
    alloc: pb.Allocation
    description: str
    client_status: str = ""
    followup_eval_id: str = ""


@dataclass
class ReconcileResults:
    place: list[PlaceResult] = field(default_factory=list)
    destructive_update: list[PlaceResult] = field(default_factory=list)
    inplace_update: list[pb.Allocation] = field(default_factory=list)
    stop: list[StopResult] = field(default_factory=list)
    attribute_updates: dict[str, pb.Allocation] = field(default_factory=dict)
    disconnect_updates: dict[str, pb.Allocation] = field(default_factory=dict)
    reconnect_updates: dict[str, pb.Allocation] = field(default_factory=dict)
    desired_tg_updates: dict[str, pb.DesiredUpdates] = field(default_factory=dict)
    desired_followup_evals: dict[str, list[pb.Evaluation]] = field(default_factory=dict)
    name_indexes: dict[str, AllocNameIndex] = field(default_factory=dict)
    #: groups without a deployment whose destructive updates were held
    #: back by max_parallel (continued after `stagger`)
    rolling_limited: list[str] = field(default_factory=list)
    #: the deployment this eval creates for the job's current version
    deployment: pb.Deployment | None = None
    #: status changes of existing deployments (cancelled by a newer version)
    deployment_updates: list[pb.DeploymentStatusUpdate] = field(default_factory=list)
    #: the deployment that placements and updates of the current version join
    deployment_id: str = ""

    def followup_evals(self) -> list[pb.Evaluation]:
        return [e for evs in self.desired_followup_evals.values() for e in evs]


def _stops(allocs: Iterable[pb.Allocation], desc: str, client_status: str = "") -> list[StopResult]:
    return [StopResult(a, desc, client_status) for a in allocs]


def _score(a: pb.Allocation) -> float | None:
    scores = [m.norm_score for m in a.metrics.score_meta_data]
    return max(scores) if scores else None


def _start_time(a: pb.Allocation, tg: pb.TaskGroup | None) -> int:
    """When the leader task (else the oldest task) of the alloc started."""
    if tg is None or not tg.tasks:
        return 0
    oldest = 0
    for task in tg.tasks:
        ts = a.task_states.get(task.name)
        started = ts.started_at if ts is not None else 0
        if task.leader:
            return started
        if started and (oldest == 0 or started < oldest):
            oldest = started
    return oldest


def pick_reconnecting(
    tg: pb.TaskGroup, original: pb.Allocation, replacement: pb.Allocation
) -> pb.Allocation:
    """Which of a reconnecting alloc and one of its replacements to keep,
    per the group's `disconnect.reconcile` strategy; a replacement of a newer
    job version always wins."""
    if replacement.job_version > original.job_version:
        return replacement
    strategy = structs.reconcile_strategy(tg)
    if strategy == "keep_original":
        return original
    if strategy == "keep_replacement":
        return replacement
    if strategy == "longest_running":
        o, r = _start_time(original, tg), _start_time(replacement, tg)
        if o == 0 and r != 0:
            return replacement
        if o != 0 and r == 0:
            return original
        if o != 0 and r != 0:
            return original if o <= r else replacement
    # best_score
    so, sr = _score(original), _score(replacement)
    better = (so is None and sr is not None) or (so is not None and sr is not None and sr > so)
    if better and (
        replacement.client_status == ClientStatus.RUNNING
        or original.client_status != ClientStatus.RUNNING
    ):
        return replacement
    return original


class AllocReconciler:
    """Computes the changes that converge one job's allocs on its spec."""

    def __init__(
        self,
        *,
        job: pb.Job | None,
        job_id: str,
        is_batch: bool,
        eval_id: str,
        eval_priority: int,
        existing: Iterable[pb.Allocation],
        tainted: dict[str, pb.Node | None],
        now: int,
        alloc_update_fn: AllocUpdateFn,
        job_of: Callable[[pb.Allocation], pb.Job | None] | None = None,
        initializing: frozenset[str] = frozenset(),
        deployment: pb.Deployment | None = None,
    ) -> None:
        self.job = job
        self.job_id = job_id
        self.is_batch = is_batch
        self.eval_id = eval_id
        self.eval_priority = eval_priority
        self.existing = list(existing)
        self.tainted = tainted
        self.now = now
        self.alloc_update_fn = alloc_update_fn
        self.initializing = initializing
        self._job_of = job_of or (lambda a: job)
        self.job_type = job.type if job is not None else ""
        self.result = ReconcileResults()
        #: the job's latest deployment; kept only if it follows the current version
        self.deployment = deployment

    # ------------------------------------------------------------ helpers

    def _tg_of(self, a: pb.Allocation) -> pb.TaskGroup | None:
        j = self._job_of(a)
        if j is None:
            j = self.job
        if j is None:
            return None
        tg = structs.task_group(j, a.task_group)
        if tg is None and self.job is not None and j is not self.job:
            tg = structs.task_group(self.job, a.task_group)
        return tg

    def _older(self, a: pb.Allocation) -> bool:
        """Placed for an older version of the job, or for an earlier job of
        the same id that was purged and registered again."""
        job = self.job
        assert job is not None
        return a.job_version < job.version or a.job_modify_index < job.create_index

    def _desired(self, group: str) -> pb.DesiredUpdates:
        d = self.result.desired_tg_updates.get(group)
        if d is None:
            d = self.result.desired_tg_updates[group] = pb.DesiredUpdates()
        return d

    def _awaiting_heartbeat(self, a: pb.Allocation) -> bool:
        """Running again on a node still marked disconnected (the client
        pushed alloc updates before its heartbeat): the reconnect is handled
        when the node turns ready; until then it neither counts nor is
        replaced."""
        node = self.tainted.get(a.node_id)
        return (
            node is not None
            and node.status == NodeStatus.DISCONNECTED
            and a.client_status == ClientStatus.RUNNING
            and structs.needs_reconnect(a)
        )

    def _later_evals(
        self, later: list[DelayedReschedule], trigger: str, desc: str, rest_trigger: str
    ) -> tuple[dict[str, str], list[pb.Evaluation]]:
        """Batch delayed allocs into follow-up evals (5 s batching window)."""
        assert self.job is not None
        return util.batch_followup_evals(
            self.job,
            self.eval_priority,
            ((d.alloc.id, d.reschedule_time) for d in later),
            trigger,
            desc,
            rest_trigger,
        )

    # ------------------------------------------------------------ compute

    def compute(self) -> ReconcileResults:
        by_group: dict[str, AllocSet] = {}
        for a in self.existing:
            by_group.setdefault(a.task_group, {})[a.id] = a
        job = self.job
        if job is None or job.stop:
            self._cancel_deployment(deployments.DESC_STOPPED_JOB)
            self._handle_stop(by_group)
            return self.result
        if self.deployment is not None and not deployments.for_job_version(self.deployment, job):
            self._cancel_deployment(deployments.DESC_NEWER_JOB)
        if self.deployment is not None:
            self.result.deployment_id = self.deployment.id
        for tg in job.task_groups:
            by_group.setdefault(tg.name, {})
        for group, allocs in by_group.items():
            self._compute_group(group, allocs)
        if self.result.deployment is not None:
            # a deployment created now says what it will wait for
            d = self.result.deployment
            d.status_description = deployments.running_description(d)
        return self.result

    # ------------------------------------------------------------ deployments

    def _cancel_deployment(self, description: str) -> None:
        """The latest deployment no longer follows the job's current version
        (a newer version or a stopped job): cancel it if still active."""
        d = self.deployment
        self.deployment = None
        if d is not None and deployments.is_active(d):
            self.result.deployment_updates.append(
                pb.DeploymentStatusUpdate(
                    deployment_id=d.id,
                    status=DeploymentStatus.CANCELLED,
                    status_description=description,
                )
            )

    def _rolling_limit(self, up: pb.UpdateStrategy, untainted: AllocSet) -> int:
        """How many more allocs of the group may be replaced now: none while
        the deployment is paused or failed or one of its allocs is
        unhealthy; else `max_parallel` less its allocs not yet healthy."""
        d = self.deployment
        if d is None:
            return up.max_parallel
        if d.status in (DeploymentStatus.PAUSED, DeploymentStatus.FAILED):
            return 0
        limit = up.max_parallel
        for a in untainted.values():
            if a.deployment_id != d.id:
                continue
            if a.deployment_status.HasField("healthy"):
                if not a.deployment_status.healthy:
                    return 0
                continue
            limit -= 1
        return max(limit, 0)

    def _canaries(self, group: str, untainted: AllocSet) -> tuple[AllocSet, bool]:
        """The current deployment's canaries of the group, and whether the
        group was promoted."""
        d = self.deployment
        if d is None:
            return {}, False
        canaries = {
            k: a
            for k, a in untainted.items()
            if a.deployment_id == d.id and a.deployment_status.canary
        }
        state = d.task_groups.get(group)
        return canaries, state is not None and state.promoted

    def _place_canaries(
        self, tg: pb.TaskGroup, up: pb.UpdateStrategy, canaries: AllocSet, destructive: AllocSet
    ) -> list[PlaceResult]:
        """The canaries still missing, named after the allocs they will
        replace (lowest names first)."""
        d = self.deployment
        if d is not None and d.status in (DeploymentStatus.PAUSED, DeploymentStatus.FAILED):
            return []
        used = {a.name for a in canaries.values()}
        names = [a.name for a in name_order(destructive) if a.name not in used]
        want = max(up.canary - len(canaries), 0)
        return [PlaceResult(name=n, task_group=tg, canary=True) for n in names[:want]]

    def _retire_replaced_by_canaries(
        self, group: str, untainted: AllocSet, canaries: AllocSet
    ) -> AllocSet:
        """Once promoted, each canary takes the place of the older alloc of
        its name: those are stopped."""
        names = {a.name for a in canaries.values()}
        retired: AllocSet = {}
        for a in name_order(untainted):
            if a.id not in canaries and a.name in names and self._older(a):
                names.discard(a.name)
                retired[a.id] = a
        self.result.stop.extend(_stops(retired.values(), util.ALLOC_NOT_NEEDED))
        self._desired(group).stop += len(retired)
        return difference(untainted, retired)

    def _had_allocs(self) -> bool:
        """Allocs of the current job version exist: placing more of them
        (a reschedule, a scale-up of the same version) starts no deployment."""
        job = self.job
        assert job is not None
        return any(
            a.job_version == job.version and a.job_modify_index >= job.create_index
            for a in self.existing
        )

    def _join_deployment(self, tg: pb.TaskGroup) -> None:
        """A group that updates allocs to the current version, or places
        the version's first allocs, needs a deployment; the first such group
        of a version creates it (with every group the update block governs)."""
        job = self.job
        assert job is not None
        if self.deployment is not None:
            return
        d = deployments.new_deployment(job, self.now)
        for g in job.task_groups:
            up = deployments.update_strategy(job, g)
            if up is not None:
                d.task_groups[g.name].CopyFrom(deployments.group_state(up, g))
        self.deployment = d
        self.result.deployment = d
        self.result.deployment_id = d.id

    def _stop_all(self, group: str, allocs: AllocSet) -> None:
        c = classify(allocs, self.tainted, self.now, self._tg_of, self.initializing)
        stops = (
            _stops(c.untainted.values(), util.ALLOC_NOT_NEEDED)
            + _stops(c.migrate.values(), util.ALLOC_NOT_NEEDED)
            + _stops(c.lost.values(), util.ALLOC_LOST, ClientStatus.LOST)
            + _stops(c.disconnecting.values(), util.ALLOC_NOT_NEEDED)
            + _stops(c.reconnecting.values(), util.ALLOC_NOT_NEEDED)
            + _stops(
                (a for a in c.ignore.values() if a.client_status == ClientStatus.UNKNOWN),
                util.ALLOC_NOT_NEEDED,
            )
            + _stops(
                (a for a in c.expiring.values() if a.client_status == ClientStatus.UNKNOWN),
                util.ALLOC_NOT_NEEDED,
            )
        )
        self.result.stop.extend(stops)
        self._desired(group).stop += len(allocs)

    def _handle_stop(self, by_group: dict[str, AllocSet]) -> None:
        for group, allocs in by_group.items():
            live = {k: a for k, a in allocs.items() if not structs.alloc_terminal(a)}
            self._stop_all(group, live)

    def _compute_group(self, group: str, all_allocs: AllocSet) -> None:
        job = self.job
        assert job is not None
        res = self.result
        desired = self._desired(group)
        tg = structs.task_group(job, group)
        allocs = filter_server_terminal(all_allocs.values(), self.is_batch)

        if tg is None or tg.count == 0:
            self._stop_all(group, allocs)
            return

        # terminal batch allocs of an older job version are history
        if self.is_batch:
            old = {k: a for k, a in allocs.items() if self._older(a) and structs.alloc_terminal(a)}
            if old:
                allocs = difference(allocs, old)
                desired.ignore += len(old)

        c = classify(allocs, self.tainted, self.now, self._tg_of, self.initializing)
        desired.ignore += len(c.ignore)

        untainted, reschedule_now, reschedule_later = self._reschedulable(c.untainted)
        _, mig_now, mig_later = self._reschedulable(c.migrate)
        reschedule_now = union(reschedule_now, mig_now)
        reschedule_later = reschedule_later + mig_later
        migrate = dict(c.migrate)
        lost = dict(c.lost)
        disconnecting = dict(c.disconnecting)

        if c.reconnecting:
            untainted, migrate, lost, disconnecting = self._compute_reconnecting(
                tg, c.reconnecting, all_allocs, untainted, migrate, lost, disconnecting
            )

        lost = union(lost, c.expiring)
        followups = res.desired_followup_evals.setdefault(group, [])

        up = deployments.update_strategy(job, tg)
        canaries, promoted = self._canaries(group, untainted)
        if canaries and not promoted:
            # canaries run beside the allocs they will replace: neither
            # counted against the group's count nor replaced until promoted
            untainted = difference(untainted, canaries)
            desired.ignore += len(canaries)
        elif canaries:
            untainted = self._retire_replaced_by_canaries(group, untainted, canaries)

        timeout_evals: dict[str, str] = {}
        if disconnecting:
            untainted, reschedule_now, reschedule_later, timeout_evals = (
                self._compute_disconnecting(
                    tg, disconnecting, untainted, reschedule_now, reschedule_later
                )
            )

        # lost allocs whose group wants the client to stop them first delay
        # every placement of the group until that time has passed
        lost_later = [
            DelayedReschedule(a, wait_client_stop(a, tg, self.now))
            for a in lost.values()
            if structs.stop_on_client_after(tg) > 0 and wait_client_stop(a, tg, self.now) > self.now
        ]
        lost_later_evals: dict[str, str] = {}
        if lost_later:
            lost_later_evals, evs = self._later_evals(
                lost_later, Trigger.ALLOC_FAILURE, util.RESCHEDULING_FOLLOWUP, Trigger.ALLOC_FAILURE
            )
            followups.extend(evs)
        lost_later_evals.update(timeout_evals)

        if reschedule_later:
            self._reschedule_later(group, reschedule_later, all_allocs, migrate)

        name_index = AllocNameIndex(
            job.id, group, tg.count, union(untainted, migrate, reschedule_now, lost)
        )
        res.name_indexes[group] = name_index

        untainted = self._compute_stop(tg, name_index, untainted, migrate, lost, lost_later_evals)

        inplace, destructive = self._compute_updates(tg, untainted)

        max_parallel = util.max_parallel_of(job, tg)
        canarying = up is not None and up.canary > 0 and bool(destructive) and not promoted
        canary_places: list[PlaceResult] = []
        if canarying:
            assert up is not None
            canary_places = self._place_canaries(tg, up, canaries, destructive)
            under = 0  # nothing is replaced before the promotion
        elif up is not None:
            under = self._rolling_limit(up, untainted)
        elif max_parallel == 0 or len(destructive) + len(migrate) == 0:
            under = tg.count
        else:
            under = max_parallel

        place: list[PlaceResult] = []
        if not lost_later:
            place = self._compute_placements(
                tg, name_index, untainted, migrate, reschedule_now, lost
            )

        # apply the placements; failed allocs being rescheduled are stopped
        desired.place += len(place)
        res.place.extend(place)
        failed = [
            a
            for aid, a in reschedule_now.items()
            if aid not in res.disconnect_updates
            and aid not in migrate
            and a.client_status != ClientStatus.UNKNOWN
        ]
        res.stop.extend(_stops(failed, util.ALLOC_RESCHEDULED))
        desired.stop += len(failed)
        under -= min(len(place), under)

        n = min(len(destructive), under)
        desired.destructive_update += n
        desired.ignore += len(destructive) - n
        if len(destructive) > n and max_parallel > 0 and up is None:
            res.rolling_limited.append(group)
        if (
            up is not None
            and tg.count > 0
            and ((place and not self._had_allocs()) or destructive or inplace or canary_places)
        ):
            self._join_deployment(tg)
        if canary_places and up is not None:
            desired.canary += len(canary_places)
            if self.result.deployment is not None:
                self.result.deployment.task_groups[group].desired_canaries = up.canary
        for a in name_order(destructive)[:n]:
            res.destructive_update.append(
                PlaceResult(
                    name=a.name,
                    task_group=tg,
                    previous_alloc=a,
                    stop_previous=True,
                    stop_description=util.ALLOC_UPDATING,
                )
            )

        desired.migrate += len(migrate)
        for a in name_order(migrate):
            res.stop.append(StopResult(a, util.ALLOC_MIGRATING, "", a.followup_eval_id))
            if self.is_batch and a.desired_transition.reschedule:
                continue
            res.place.append(PlaceResult(name=a.name, task_group=tg, previous_alloc=a))

        # never more placements of a group than its count (canaries aside)
        group_places = [p for p in res.place if p.task_group.name == group]
        if len(group_places) > tg.count:
            drop = {id(p) for p in group_places[tg.count :]}
            res.place = [p for p in res.place if id(p) not in drop]
            desired.place = tg.count
        res.place.extend(canary_places)

    # ------------------------------------------------------------ pieces

    def _compute_reconnecting(
        self,
        tg: pb.TaskGroup,
        reconnecting: AllocSet,
        all_allocs: AllocSet,
        untainted: AllocSet,
        migrate: AllocSet,
        lost: AllocSet,
        disconnecting: AllocSet,
    ) -> tuple[AllocSet, AllocSet, AllocSet, AllocSet]:
        """Decide, for allocs coming back from a disconnected node, which of
        them and their replacements keep running."""
        stop: AllocSet = {}
        stops: list[StopResult] = []
        reconnect: AllocSet = {}

        def add_stop(a: pb.Allocation, desc: str, client_status: str = "") -> None:
            if a.id not in stop:
                stop[a.id] = a
                stops.append(StopResult(a, desc, client_status))

        for r in reconnecting.values():
            if not structs.alloc_server_terminal(r) and r.client_status == ClientStatus.FAILED:
                add_stop(r, util.ALLOC_RESCHEDULED, ClientStatus.FAILED)
                continue
            t = r.desired_transition
            if (
                r.desired_status != DesiredStatus.RUN
                or t.migrate
                or t.reschedule
                or t.force_reschedule
                or self._older(r)
            ):
                add_stop(r, util.ALLOC_NOT_NEEDED)
                continue
            replacements: list[str] = []
            nxt = r.next_allocation
            while nxt in all_allocs and nxt not in replacements:
                replacements.append(nxt)
                nxt = all_allocs[nxt].next_allocation
            for rid in replacements:
                rep = all_allocs[rid]
                if structs.alloc_server_terminal(rep):
                    continue
                if pick_reconnecting(tg, r, rep) is rep:
                    add_stop(r, util.ALLOC_NOT_NEEDED)
                else:
                    add_stop(rep, util.ALLOC_RECONNECTED)
        for r in reconnecting.values():
            if r.id not in stop:
                reconnect[r.id] = r

        self.result.stop.extend(stops)
        self._desired(tg.name).stop += len(stop)
        untainted = difference(untainted, stop)
        migrate = difference(migrate, stop)
        lost = difference(lost, stop)
        disconnecting = difference(disconnecting, stop)

        if reconnect:
            updates = self._reconnecting_updates(reconnect)
            self.result.reconnect_updates.update(updates)
            self._desired(tg.name).reconnect_updates += len(updates)
            untainted = union(untainted, reconnect)
        return untainted, migrate, lost, disconnecting

    def _reconnecting_updates(self, reconnect: AllocSet) -> AllocSet:
        """Kept running allocs record their reconnect as a new AllocState so
        later evals do not treat them as reconnecting again.

        Not yet on a node that is still initializing (it heartbeated, then
        pushed its allocs, and is ready only from its next heartbeat on):
        the planner takes no alloc update for a node that is not ready, so
        the eval would be rejected until it failed. The alloc is kept all
        the same (its replacements are stopped now, stops fit anywhere) and
        the node's eval when it turns ready records the reconnect."""
        out: AllocSet = {}
        for a in reconnect.values():
            if a.node_id in self.initializing:
                continue
            t = a.desired_transition
            if t.migrate or t.reschedule or t.force_reschedule or self._older(a):
                continue
            if a.desired_status != DesiredStatus.RUN or a.client_status != ClientStatus.RUNNING:
                continue
            u = structs.copy_msg(a)
            u.alloc_states.add(field="client_status", value=a.client_status, time=self.now)
            out[u.id] = u
        return out

    def _reschedulable(
        self, allocs: AllocSet, *, disconnecting: bool = False
    ) -> tuple[AllocSet, AllocSet, list[DelayedReschedule]]:
        return filter_by_reschedulable(
            allocs,
            is_batch=self.is_batch,
            is_disconnecting=disconnecting,
            now=self.now,
            eval_id=self.eval_id,
            tg_of=self._tg_of,
            job_type=self.job_type,
        )

    def _compute_disconnecting(
        self,
        tg: pb.TaskGroup,
        disconnecting: AllocSet,
        untainted: AllocSet,
        reschedule_now: AllocSet,
        reschedule_later: list[DelayedReschedule],
    ) -> tuple[AllocSet, AllocSet, list[DelayedReschedule], dict[str, str]]:
        """Mark allocs of a disconnected node unknown, schedule the
        disconnect-timeout follow-up, and queue their replacements."""
        u, now_set, later = self._reschedulable(disconnecting, disconnecting=True)
        reschedule_now = union(reschedule_now, now_set)
        untainted = union(untainted, u)
        reschedule_later = reschedule_later + later

        timeouts = [
            DelayedReschedule(a, disconnect_timeout(self._tg_of(a) or tg, self.now))
            for a in disconnecting.values()
        ]
        timeout_ids, evs = self._later_evals(
            timeouts,
            Trigger.MAX_DISCONNECT_TIMEOUT,
            util.DISCONNECT_TIMEOUT_FOLLOWUP,
            Trigger.MAX_DISCONNECT_TIMEOUT,
        )
        self.result.desired_followup_evals.setdefault(tg.name, []).extend(evs)

        updates: AllocSet = {}
        for aid, a in disconnecting.items():
            d = structs.copy_msg(a)
            d.client_status = ClientStatus.UNKNOWN
            d.alloc_states.add(field="client_status", value=ClientStatus.UNKNOWN, time=self.now)
            d.client_description = util.ALLOC_UNKNOWN
            d.followup_eval_id = timeout_ids.get(aid, "")
            updates[aid] = d
        reschedule_now = {k: updates.get(k, v) for k, v in reschedule_now.items()}
        self.result.disconnect_updates.update(updates)
        desired = self._desired(tg.name)
        desired.disconnect_updates = len(self.result.disconnect_updates)
        desired.reschedule_now = len(reschedule_now)
        desired.reschedule_later = len(reschedule_later)
        return untainted, reschedule_now, reschedule_later, timeout_ids

    def _reschedule_later(
        self,
        group: str,
        later: list[DelayedReschedule],
        all_allocs: AllocSet,
        migrate: AllocSet,
    ) -> None:
        """Create batched follow-up evals for allocs to reschedule later and
        record each eval on its alloc (an attribute-only update)."""
        ids, evs = self._later_evals(
            later, Trigger.RETRY_FAILED_ALLOC, util.RESCHEDULING_FOLLOWUP, Trigger.ALLOC_FAILURE
        )
        res = self.result
        for d in later:
            aid = d.alloc.id
            eval_id = ids[aid]
            if aid in res.disconnect_updates:
                res.disconnect_updates[aid].followup_eval_id = eval_id
            elif aid in migrate:
                m = structs.copy_msg(migrate[aid])
                m.followup_eval_id = eval_id
                migrate[aid] = m
            else:
                u = structs.copy_msg(all_allocs.get(aid, d.alloc))
                u.followup_eval_id = eval_id
                res.attribute_updates[aid] = u
        res.desired_followup_evals.setdefault(group, []).extend(evs)
        self._desired(group).reschedule_later = len(later)

    def _compute_stop(
        self,
        tg: pb.TaskGroup,
        name_index: AllocNameIndex,
        untainted: AllocSet,
        migrate: AllocSet,
        lost: AllocSet,
        followup_evals: dict[str, str],
    ) -> AllocSet:
        """Stop lost allocs and, on scale-down, the highest-named extras
        (migrating ones first). Returns the untainted set without them."""
        res = self.result
        stop: AllocSet = dict(lost)
        for a in lost.values():
            res.stop.append(
                StopResult(a, util.ALLOC_LOST, ClientStatus.LOST, followup_evals.get(a.id, ""))
            )

        def finish() -> AllocSet:
            self._desired(tg.name).stop += len(stop)
            return difference(untainted, stop)

        known = [
            a
            for a in untainted.values()
            if a.client_status != ClientStatus.UNKNOWN and not self._awaiting_heartbeat(a)
        ]
        remove = len(known) + len(migrate) - tg.count
        if remove <= 0:
            return finish()
        working = {k: a for k, a in untainted.items() if not structs.alloc_server_terminal(a)}

        if migrate:
            mig_index = AllocNameIndex(self.job_id, tg.name, tg.count, migrate)
            names = mig_index.highest(remove)
            for aid, a in list(migrate.items()):
                if a.name not in names:
                    continue
                res.stop.append(StopResult(a, util.ALLOC_NOT_NEEDED))
                del migrate[aid]
                stop[aid] = a
                name_index.unset_index(structs.alloc_name_index(a.name))
                remove -= 1
                if remove == 0:
                    return finish()

        names = name_index.highest(remove)
        for a in name_order(working):
            if a.name in names:
                stop[a.id] = a
                res.stop.append(StopResult(a, util.ALLOC_NOT_NEEDED))
                del working[a.id]
                remove -= 1
                if remove == 0:
                    return finish()
        # duplicate names can leave extras behind
        for a in name_order(working):
            stop[a.id] = a
            res.stop.append(StopResult(a, util.ALLOC_NOT_NEEDED))
            remove -= 1
            if remove == 0:
                break
        return finish()

    def _compute_updates(self, tg: pb.TaskGroup, untainted: AllocSet) -> tuple[AllocSet, AllocSet]:
        job = self.job
        assert job is not None
        inplace: AllocSet = {}
        destructive: AllocSet = {}
        ignore = 0
        for aid, a in untainted.items():
            ign, destroy, updated = self.alloc_update_fn(a, job, tg)
            if ign:
                ignore += 1
            elif destroy:
                destructive[aid] = a
            elif updated is not None:
                inplace[aid] = updated
        self.result.inplace_update.extend(inplace.values())
        d = self._desired(tg.name)
        d.ignore += ignore
        d.in_place_update += len(inplace)
        return inplace, destructive

    def _compute_placements(
        self,
        tg: pb.TaskGroup,
        name_index: AllocNameIndex,
        untainted: AllocSet,
        migrate: AllocSet,
        reschedule: AllocSet,
        lost: AllocSet,
    ) -> list[PlaceResult]:
        place = [
            PlaceResult(name=a.name, task_group=tg, previous_alloc=a, reschedule=True)
            for a in name_order(reschedule)
        ]
        existing = len(untainted) + len(migrate) + len(reschedule)
        for a in name_order(lost):
            if existing >= tg.count:
                break
            existing += 1
            place.append(PlaceResult(name=a.name, task_group=tg, previous_alloc=a, lost=True))
        if existing < tg.count:
            for name in name_index.next(tg.count - existing):
                place.append(PlaceResult(name=name, task_group=tg))
        return place
