"""The periodic dispatcher (Nomad's nomad/periodic.go and the periodic part
of leader.go), run by the broker leader beside the eval broker.

Every periodic parent in the replica is tracked with its next launch. When
a launch is due the dispatcher registers the child job
`<parent>/periodic-<unix seconds>` through the state's public
`Job.Register`, create-only (`enforce_index` with index 0): the tick names
the child, so the same launch made twice — by a leader that was just
deposed and its successor — is one job, and the second is refused. That
registration writes the child, its eval and the parent's launch record in
one transaction.

On taking over, the tracked set is rebuilt from the replica and the launch
records are read from the state. A job whose next launch after its last
recorded one is already past missed at least one tick while no leader ran
it: it is launched once, now, not once per missed tick (Nomad's rule), and
then follows its cron spec from now.

`PeriodicTracker` is the pure part (which jobs, when next) and takes the
time as an argument; `PeriodicDispatcher` adds the replica, the clock and
the RPCs.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc

from corral.domain import periodic, topics
from corral.domain.errors import FailedPrecondition, NotFound
from corral.domain.store import StateSnapshot
from corral.domain.structs import DEFAULT_NAMESPACE, alloc_terminal, eval_terminal
from corral.runtime.replica import Replica
from corral.v1 import job_pb2, job_pb2_grpc, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb

log = logging.getLogger(__name__)

JobKey = tuple[str, str]
Clock = Callable[[], datetime]
RegisterChild = Callable[[pb.Job], Awaitable[job_pb2.JobRegisterResponse]]
ReadLaunches = Callable[[], Awaitable[tuple[dict[JobKey, int], int]]]
# the longest the loop sleeps without looking at the clock again (a wall
# clock that jumps, or a suspended host, is noticed within this)
MAX_SLEEP_S = 30.0


def key_of(job: pb.Job) -> JobKey:
    return (job.namespace or DEFAULT_NAMESPACE, job.id)


def utc_now() -> datetime:
    return datetime.now(UTC)


class PeriodicTracker:
    """The tracked parents and the next launch of each, ordered in a heap
    (stale heap entries are skipped when popped)."""

    def __init__(self) -> None:
        self._jobs: dict[JobKey, pb.Job] = {}
        self._next: dict[JobKey, datetime] = {}
        self._heap: list[tuple[datetime, JobKey]] = []

    def __len__(self) -> int:
        return len(self._jobs)

    def tracked_keys(self) -> list[JobKey]:
        return list(self._jobs)

    def job(self, key: JobKey) -> pb.Job | None:
        return self._jobs.get(key)

    def next_launch(self, key: JobKey) -> datetime | None:
        return self._next.get(key)

    def clear(self) -> None:
        self._jobs.clear()
        self._next.clear()
        self._heap.clear()

    def _schedule(self, key: JobKey, after: datetime) -> None:
        job = self._jobs[key]
        upcoming = periodic.next_launch(job.periodic, after)
        if upcoming is None:
            self._next.pop(key, None)
            return
        self._next[key] = upcoming
        heapq.heappush(self._heap, (upcoming, key))

    def update(self, job: pb.Job, now: datetime) -> None:
        """Track a changed job: an active parent whose periodic block is new
        or changed is (re)scheduled from `now`; anything else is dropped."""
        key = key_of(job)
        if not periodic.is_active(job):
            self.remove(key)
            return
        old = self._jobs.get(key)
        self._jobs[key] = job
        if old is None or old.periodic != job.periodic:
            self._schedule(key, now)

    def remove(self, key: JobKey) -> None:
        self._jobs.pop(key, None)
        self._next.pop(key, None)

    def next_wake(self) -> datetime | None:
        while self._heap:
            at, key = self._heap[0]
            if self._next.get(key) == at:
                return at
            heapq.heappop(self._heap)
        return None

    def pop_due(self, now: datetime) -> list[tuple[pb.Job, datetime]]:
        """Every job whose launch is due at `now`, with its launch time;
        each is rescheduled after that launch time (a job late by several
        ticks comes up again at once, one tick at a time, as in Nomad)."""
        due: list[tuple[pb.Job, datetime]] = []
        while (at := self.next_wake()) is not None and at <= now:
            _, key = heapq.heappop(self._heap)
            due.append((self._jobs[key], at))
            self._schedule(key, at)
        return due


def missed_launch(job: pb.Job, last_launch_ns: int | None, now: datetime) -> bool:
    """Nomad's rule on taking over: a job missed a launch if the next launch
    after its last recorded one (or its registration) is already past. It is
    then launched once, now, however many ticks went by."""
    if last_launch_ns is None:
        return False
    upcoming = periodic.next_launch(job.periodic, periodic.from_unix_ns(last_launch_ns))
    return upcoming is not None and upcoming < now


def children_of(snap: StateSnapshot, parent: pb.Job) -> list[pb.Job]:
    """The parent's periodic children in the snapshot."""
    prefix = parent.id + periodic.LAUNCH_SUFFIX
    ns = parent.namespace or DEFAULT_NAMESPACE
    return [
        j
        for j in snap.iter_jobs()
        if (j.namespace or DEFAULT_NAMESPACE) == ns
        and j.parent_id == parent.id
        and j.id.startswith(prefix)
    ]


def has_running_child(snap: StateSnapshot, parent: pb.Job) -> bool:
    """Whether a child is still pending or running: it has an eval that is
    not terminal or an alloc that is not (Nomad's RunningChildren)."""
    for child in children_of(snap, parent):
        if any(not eval_terminal(e) for e in snap.evals_by_job(child.namespace, child.id)):
            return True
        if any(not alloc_terminal(a) for a in snap.allocs_by_job(child.namespace, child.id)):
            return True
    return False


def last_child_launch(snap: StateSnapshot, parent: pb.Job) -> int | None:
    """The newest launch (unix ns) encoded in a child id in the snapshot."""
    times = (periodic.launch_of(c.id, parent.id) for c in children_of(snap, parent))
    return max((t for t in times if t is not None), default=None)


@dataclass
class Launched:
    child_id: str
    response: job_pb2.JobRegisterResponse


class PeriodicDispatcher:
    """Launches children of the tracked parents while enabled (the broker
    leader). The replica listener keeps the tracked set current; `restore`
    rebuilds it on takeover; `run` launches; `force` launches now."""

    def __init__(
        self,
        snapshot: Callable[[], StateSnapshot],
        register_child: RegisterChild,
        read_launches: ReadLaunches,
        *,
        catch_up: Callable[[int], Awaitable[StateSnapshot]],
        clock: Clock = utc_now,
    ) -> None:
        self.snapshot = snapshot
        self.register_child = register_child
        self.read_launches = read_launches
        self.catch_up = catch_up
        self.clock = clock
        self.tracker = PeriodicTracker()
        self.enabled = False
        self._wake = asyncio.Event()

    # ------------------------------------------------------------ feed

    def on_batch(self, batch: pb.ChangeBatch, snap: StateSnapshot) -> None:
        if not self.enabled:
            return
        now = self.clock()
        for event in batch.events:
            if topics.of(event) is not topics.JOB:
                continue
            if event.deleted:
                self.tracker.remove(key_of(event.job))
            else:
                self.tracker.update(event.job, now)
        self._wake.set()

    def on_reset(self, snap: StateSnapshot) -> None:
        """The replica re-bootstrapped: keep what is still active (with its
        next launch), add new parents, drop the gone."""
        if not self.enabled:
            return
        self._sync(snap.iter_jobs(), self.clock())

    def _sync(self, jobs: Iterable[pb.Job], now: datetime) -> list[pb.Job]:
        active = {key_of(j): j for j in jobs if periodic.is_active(j)}
        for key in [k for k in self.tracker.tracked_keys() if k not in active]:
            self.tracker.remove(key)
        for job in active.values():
            self.tracker.update(job, now)
        self._wake.set()
        return list(active.values())

    # ------------------------------------------------------------ leadership

    async def restore(self) -> int:
        """Take over: track every active parent of the replica and launch
        once each job that missed a launch. Returns how many were launched."""
        launches, index = await self.read_launches()
        snap = await self.catch_up(index)
        # no await between the snapshot and enabling: later job changes
        # reach on_batch, earlier ones are in the snapshot
        snap = self.snapshot()
        self.tracker.clear()
        now = self.clock()
        self.enabled = True
        active = self._sync(snap.iter_jobs(), now)
        launched = 0
        for job in active:
            recorded = launches.get(key_of(job))
            newest_child = last_child_launch(snap, job)
            last = max((t for t in (recorded, newest_child) if t is not None), default=None)
            if not missed_launch(job, last, now):
                continue
            if job.periodic.prohibit_overlap and has_running_child(snap, job):
                log.info("periodic job %s missed a launch but a child still runs", job.id)
                continue
            log.info("periodic job %s missed a launch while no leader ran it", job.id)
            if await self._dispatch(job, now, overlap_checked=True):
                launched += 1
        return launched

    def disable(self) -> None:
        self.enabled = False
        self.tracker.clear()
        self._wake.set()

    # ------------------------------------------------------------ launching

    async def run(self) -> None:
        """Launch what is due, then sleep until the next launch or a change,
        until `disable`. The loop checks the flag itself: on Python 3.11 a
        cancel that arrives as the wake-up fires can be swallowed by
        `asyncio.wait_for`, and the loop must still end when leadership does."""
        while self.enabled:
            await self.launch_due()
            self._wake.clear()
            wake = self.tracker.next_wake() if self.enabled else None
            timeout = MAX_SLEEP_S
            if wake is not None:
                timeout = min(timeout, max(0.0, (wake - self.clock()).total_seconds()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def launch_due(self) -> int:
        """Launch every job due by the clock; returns how many were due."""
        if not self.enabled:
            return 0
        due = self.tracker.pop_due(self.clock())
        for job, at in due:
            await self._dispatch(job, at)
        return len(due)

    async def _dispatch(self, job: pb.Job, at: datetime, *, overlap_checked: bool = False) -> bool:
        """Launch one tick unless prohibit_overlap says no. A failed launch
        is logged, not raised: one job's trouble must not stop the others
        (nor the broker's other leader tasks), and the tick is not retried —
        the next one follows the cron spec."""
        if (
            not overlap_checked
            and job.periodic.prohibit_overlap
            and has_running_child(self.snapshot(), job)
        ):
            log.info("periodic job %s: launch at %s skipped, a child still runs", job.id, at)
            return False
        try:
            return await self._launch(job, at) is not None
        except grpc.aio.AioRpcError as exc:
            log.error("periodic job %s: launch at %s failed: %s", job.id, at, exc.details())
        except Exception:
            log.exception("periodic job %s: launch at %s failed", job.id, at)
        return False

    async def _launch(self, job: pb.Job, at: datetime) -> Launched | None:
        """Register the child of this tick; None if it already exists."""
        child = periodic.derive_child(job, at)
        try:
            resp = await self.register_child(child)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                log.info("periodic job %s: %s already launched", job.id, child.id)
                return None
            raise
        log.info("periodic job %s launched %s (eval %s)", job.id, child.id, resp.eval_id)
        return Launched(child.id, resp)

    async def force(self, namespace: str, job_id: str) -> Launched:
        """Launch a child now whatever the cron spec and prohibit_overlap
        say (Nomad's Periodic.Force)."""
        key = (namespace or DEFAULT_NAMESPACE, job_id)
        job = self.tracker.job(key)
        if job is None:
            # a job registered a moment ago may not have reached the replica
            snap = await self.catch_up(0)
            current = snap.job_by_id(*key)
            if current is None:
                raise NotFound(f"job {job_id!r} not found")
            if not periodic.is_active(current):
                state = "stopped" if current.stop else "not periodic"
                raise FailedPrecondition(f"job {job_id!r} is {state}")
            job = current
        launched = await self._launch(job, self.clock())
        if launched is None:
            raise FailedPrecondition(f"job {job_id!r} was already launched this second")
        return launched


def state_dispatcher(replica: Replica, state_channel: grpc.aio.Channel) -> PeriodicDispatcher:
    """A dispatcher that reads the broker's replica and writes through the
    state service: children by the public Job.Register, create-only."""
    jobs = job_pb2_grpc.JobStub(state_channel)
    state = state_pb2_grpc.StateStub(state_channel)

    async def register_child(child: pb.Job) -> job_pb2.JobRegisterResponse:
        request = job_pb2.JobRegisterRequest(job=child, enforce_index=True, job_modify_index=0)
        resp: job_pb2.JobRegisterResponse = await jobs.Register(request, timeout=30)
        return resp

    async def read_launches() -> tuple[dict[JobKey, int], int]:
        resp = await state.PeriodicLaunches(state_pb2.PeriodicLaunchesRequest(), timeout=30)
        return {(p.namespace, p.job_id): p.launch for p in resp.launches}, int(resp.index)

    async def catch_up(min_index: int) -> StateSnapshot:
        latest = await state.GetIndex(state_pb2.GetIndexRequest(), timeout=30)
        return await replica.wait_for_index(max(min_index, latest.index), timeout=60)

    return PeriodicDispatcher(replica.snapshot, register_child, read_launches, catch_up=catch_up)
