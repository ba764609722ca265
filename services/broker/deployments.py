"""The deployment watcher (Nomad's nomad/deploymentwatcher), run by the
broker leader beside its eval broker: it follows every active deployment
in the broker's replica and

- sends an eval for the job when more of a deployment's allocs became
  healthy, so the scheduler rolls the next `max_parallel` batch;
- marks a deployment successful once every group's allocs are healthy (the
  state then marks the job version stable);
- fails it when an alloc turned unhealthy or a group made no progress by its
  `require_progress_by` (the state then reverts the job to its last stable
  version when a group asked for `auto_revert`);
- promotes the canaries of groups with `auto_promote` once all of them are
  healthy (a group waiting for a manual promotion with healthy canaries is
  not held to its progress deadline).

Decisions are made on the replica and written through the state
(`State.SetDeploymentStatus`, `State.UpsertEvals`, both fenced on this
broker's leadership); the state refuses a status change to a deployment
that is no longer active, so a decision taken on a stale replica cannot
end a deployment twice. A new leader starts from the replica: every active
deployment with healthy allocs gets one eval, in case the old leader died
between a health report and its eval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from corral.domain import deployments, structs, topics
from corral.domain.store import StateSnapshot
from corral.domain.structs import DeploymentStatus
from corral.v1 import deployment_pb2, deployment_pb2_grpc, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb

log = logging.getLogger(__name__)

#: the longest the watcher sleeps without a change in the replica
IDLE_S = 1.0


@dataclass(frozen=True)
class Verdict:
    status: str
    description: str


def decide(d: pb.Deployment, now: int) -> Verdict | None:
    """The end of a running deployment, if it has come (`now` in ns)."""
    if d.status != DeploymentStatus.RUNNING:
        return None  # paused deployments wait for resume; ended ones are done
    if any(s.unhealthy_allocs > 0 for s in d.task_groups.values()):
        return Verdict(DeploymentStatus.FAILED, deployments.DESC_FAILED_ALLOCS)
    if deployments.all_healthy(d):
        return Verdict(DeploymentStatus.SUCCESSFUL, deployments.DESC_SUCCESSFUL)
    for s in d.task_groups.values():
        if _waits_for_promotion(s):
            continue
        if s.healthy_allocs < s.desired_total and 0 < s.require_progress_by < now:
            return Verdict(DeploymentStatus.FAILED, deployments.DESC_PROGRESS_DEADLINE)
    return None


def _waits_for_promotion(s: pb.DeploymentState) -> bool:
    """Healthy canaries wait for their promotion: that is not a lack of
    progress."""
    return bool(s.placed_canaries) and not s.promoted and s.healthy_allocs >= len(s.placed_canaries)


def to_auto_promote(d: pb.Deployment, snap: StateSnapshot) -> bool:
    """Every group waiting for a promotion asked for auto_promote and has
    all its canaries placed and healthy."""
    waiting = deployments.awaiting_promotion(d)
    if d.status != DeploymentStatus.RUNNING or not waiting:
        return False
    job = snap.job_by_version(d.namespace, d.job_id, d.job_version)
    for g in waiting:
        state = d.task_groups[g]
        tg = structs.task_group(job, g) if job is not None else None
        up = deployments.update_strategy(job, tg) if job is not None and tg is not None else None
        if up is None or not up.auto_promote:
            return False
        if not deployments.canaries_healthy(state, up.canary, snap.alloc_by_id):
            return False
    return True


def healthy_total(d: pb.Deployment) -> int:
    return sum(s.healthy_allocs for s in d.task_groups.values())


def next_deadline(d: pb.Deployment) -> int:
    """The earliest progress deadline still to be met (0: none)."""
    times = [
        s.require_progress_by
        for s in d.task_groups.values()
        if s.require_progress_by and s.healthy_allocs < s.desired_total
    ]
    return min(times) if times else 0


SetStatus = Callable[[str, str, str], Awaitable[None]]
WriteEvals = Callable[[list[pb.Evaluation]], Awaitable[int]]
Promote = Callable[[str], Awaitable[None]]


class DeploymentWatcher:
    """One pass per replica change (or per deadline): see `step`."""

    def __init__(
        self,
        snapshot: Callable[[], StateSnapshot],
        set_status: SetStatus,
        write_evals: WriteEvals,
        promote: Promote,
        clock: Callable[[], int] = structs.now_ns,
    ) -> None:
        self._snapshot = snapshot
        self._set_status = set_status
        self._write_evals = write_evals
        self._promote = promote
        #: deployments whose auto-promotion was written (until the replica shows it)
        self._promoted: set[str] = set()
        self._clock = clock
        #: healthy allocs per deployment when its last eval was sent
        self._healthy_seen: dict[str, int] = {}
        #: deployments whose end was written (until the replica shows it)
        self._ended: set[str] = set()
        self.wake = asyncio.Event()

    def on_batch(self, batch: pb.ChangeBatch, snap: StateSnapshot) -> None:
        """Replica listener: a deployment changed."""
        if any(topics.of(e) is topics.DEPLOYMENT for e in batch.events):
            self.wake.set()

    def on_reset(self, snap: StateSnapshot) -> None:
        self.wake.set()

    async def run(self) -> None:
        """Until cancelled (leadership lost). A new term starts from the
        replica alone: nothing is carried over from an earlier one."""
        self._healthy_seen.clear()
        self._ended.clear()
        self._promoted.clear()
        while True:
            self.wake.clear()
            wait = IDLE_S
            try:
                wait = await self.step()
            except grpc.aio.AioRpcError as exc:
                log.warning("deployment watcher: write failed: %s", exc.details())
            try:
                await asyncio.wait_for(self.wake.wait(), wait)
            except TimeoutError:
                pass

    async def step(self) -> float:
        """Act on every active deployment; returns how long to sleep at
        most before the next look (the nearest progress deadline)."""
        snap = self._snapshot()
        now = self._clock()
        wait_ns = int(IDLE_S * 1e9)
        active = [d for d in snap.deployments.values() if deployments.is_active(d)]
        live = {d.id for d in active}
        self._ended &= live
        self._promoted &= live
        for gone in set(self._healthy_seen) - live:
            del self._healthy_seen[gone]
        evals: list[pb.Evaluation] = []
        for d in active:
            if d.id in self._ended:
                continue
            verdict = decide(d, now)
            if verdict is not None:
                await self._end(d, verdict)
                continue
            if d.id not in self._promoted and to_auto_promote(d, snap):
                self._promoted.add(d.id)
                await self._auto_promote(d)
                continue
            deadline = next_deadline(d)
            if deadline:
                wait_ns = min(wait_ns, max(deadline - now, 0) + 1)
            healthy = healthy_total(d)
            seen = self._healthy_seen.get(d.id)
            self._healthy_seen[d.id] = healthy
            if d.status != DeploymentStatus.RUNNING or healthy == 0:
                continue
            if seen is None or healthy > seen:
                job = snap.job_by_id(d.namespace, d.job_id)
                if job is not None and not job.stop:
                    evals.append(deployments.rollout_eval(d, job))
        if evals:
            await self._write_evals(evals)
        return wait_ns / 1e9

    async def _auto_promote(self, d: pb.Deployment) -> None:
        try:
            await self._promote(d.id)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                self._promoted.discard(d.id)
                raise
            log.info("deployment %s not promoted: %s", d.id, exc.details())
            return
        log.info("deployment %s: canaries auto-promoted", d.id, extra={"job_id": d.job_id})

    async def _end(self, d: pb.Deployment, verdict: Verdict) -> None:
        self._ended.add(d.id)
        try:
            await self._set_status(d.id, verdict.status, verdict.description)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                self._ended.discard(d.id)
                raise
            # ended meanwhile (by an operator or a newer version)
            log.info("deployment %s already ended: %s", d.id, exc.details())
            return
        log.info(
            "deployment %s %s: %s",
            d.id,
            verdict.status,
            verdict.description,
            extra={"job_id": d.job_id},
        )


def watcher_over_state(
    snapshot: Callable[[], StateSnapshot],
    state_channel: grpc.aio.Channel,
    leader_id: Callable[[], str],
    write_evals: WriteEvals,
) -> DeploymentWatcher:
    """The watcher writing through the state service: status changes fenced
    on this broker's leadership (`leader_id`), promotions as an operator's."""
    state = state_pb2_grpc.StateStub(state_channel)
    public = deployment_pb2_grpc.DeploymentStub(state_channel)

    async def set_status(deployment_id: str, status: str, description: str) -> None:
        await state.SetDeploymentStatus(
            state_pb2.SetDeploymentStatusRequest(
                deployment_id=deployment_id,
                status=status,
                status_description=description,
                leader_id=leader_id(),
            ),
            timeout=30,
        )

    async def promote(deployment_id: str) -> None:
        await public.Promote(
            deployment_pb2.DeploymentPromoteRequest(deployment_id=deployment_id, all=True),
            timeout=30,
        )

    return DeploymentWatcher(snapshot, set_status, write_evals, promote)
