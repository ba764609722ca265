"""Alloc-set arithmetic for the reconcilers (Nomad's
`scheduler/reconciler/allocs.go` and `filters.go`): the name index, the
classification of allocs by node state, and the reschedule-policy math
(next delay, eligibility, follow-up times).

An `AllocSet` is a plain dict id -> alloc; the allocs are snapshot messages
and are never mutated here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from corral.domain import structs
from corral.domain.structs import ClientStatus, DesiredStatus, JobType, NodeStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.util import (
    DEFAULT_KILL_TIMEOUT,
    LAST_RESCHEDULE_FAILED,
    RESCHEDULE_WINDOW,
)

AllocSet = dict[str, pb.Allocation]
#: the task group of an alloc as of the job version it was placed for
TGOf = Callable[[pb.Allocation], pb.TaskGroup | None]


def union(*sets: Mapping[str, pb.Allocation]) -> AllocSet:
    out: AllocSet = {}
    for s in sets:
        out.update(s)
    return out


def difference(base: Mapping[str, pb.Allocation], *others: Mapping[str, pb.Allocation]) -> AllocSet:
    return {k: v for k, v in base.items() if not any(k in o for o in others)}


def name_order(s: Mapping[str, pb.Allocation]) -> list[pb.Allocation]:
    """Allocs ordered by name index (then id, for determinism)."""
    return sorted(s.values(), key=lambda a: (structs.alloc_name_index(a.name), a.id))


# ----------------------------------------------------------------- name index


class AllocNameIndex:
    """Which `<job>.<group>[i]` names are taken; hands out the lowest free
    ones for placements and the highest taken ones for scale-down."""

    def __init__(
        self, job_id: str, group: str, count: int, in_use: Mapping[str, pb.Allocation]
    ) -> None:
        self.job_id = job_id
        self.group = group
        self.count = count
        self._used: set[int] = set()
        self._duplicates: set[int] = set()
        for a in in_use.values():
            i = structs.alloc_name_index(a.name)
            if i < 0:
                continue
            if i in self._used:
                self._duplicates.add(i)
            self._used.add(i)

    def name(self, i: int) -> str:
        return structs.alloc_name(self.job_id, self.group, i)

    def is_duplicate(self, i: int) -> bool:
        return i in self._duplicates

    def set_index(self, i: int) -> None:
        self._used.add(i)

    def unset_index(self, i: int) -> None:
        self._used.discard(i)
        self._duplicates.discard(i)

    def highest(self, n: int) -> set[str]:
        """The names of the `n` highest used indexes, now unset."""
        out: set[str] = set()
        for i in sorted(self._used, reverse=True)[:n]:
            self._used.discard(i)
            out.add(self.name(i))
        return out

    def next(self, n: int) -> list[str]:
        """The `n` lowest free names, now taken."""
        out: list[str] = []
        i = 0
        while len(out) < n:
            if i not in self._used:
                self._used.add(i)
                out.append(self.name(i))
            i += 1
        return out


# ----------------------------------------------------------------- times and policies


def last_event_time(a: pb.Allocation) -> int:
    """When the alloc last finished (latest task finish), else its last
    modification: the base of the reschedule delay."""
    latest = 0
    for ts in a.task_states.values():
        if ts.finished_at > latest:
            latest = ts.finished_at
    return latest or a.modify_time


def last_unknown(a: pb.Allocation) -> int:
    """When the alloc most recently became `unknown` (0 if never)."""
    t = 0
    found = False
    for st in reversed(a.alloc_states):
        if st.field != "client_status":
            continue
        if st.value == ClientStatus.UNKNOWN:
            t = st.time
            found = True
        elif found:
            break
    return t


def reschedule_policy(tg: pb.TaskGroup | None, job_type: str) -> pb.ReschedulePolicy | None:
    if tg is None:
        return None
    if tg.HasField("reschedule_policy"):
        return tg.reschedule_policy
    if job_type in (JobType.SERVICE, JobType.BATCH):
        return structs.default_reschedule_policy(job_type)
    return None


def _events(a: pb.Allocation) -> list[pb.RescheduleEvent]:
    return list(a.reschedule_tracker.events) if a.HasField("reschedule_tracker") else []


def next_delay(a: pb.Allocation, policy: pb.ReschedulePolicy | None) -> int:
    """The delay before the next reschedule of `a`, following the policy's
    delay function from the alloc's reschedule history."""
    if policy is None:
        return 0
    delay = policy.delay
    events = _events(a)
    if not events:
        return delay
    fn = policy.delay_function or "constant"
    if fn == "exponential":
        delay = events[-1].delay * 2
    elif fn == "fibonacci":
        if len(events) >= 2:
            n1, n2 = events[-1].delay, events[-2].delay
            # a series that hit the ceiling and was reset starts over
            delay = n1 if (n2 == policy.max_delay and n1 == policy.delay) else n1 + n2
    else:
        return delay
    if policy.max_delay > 0 and delay > policy.max_delay:
        delay = policy.max_delay
        # an alloc that ran longer than the ceiling since its last
        # reschedule starts the series again
        if last_event_time(a) - events[-1].reschedule_time > delay:
            delay = policy.delay
    return delay


def reschedule_attempted(
    a: pb.Allocation, policy: pb.ReschedulePolicy, fail_time: int
) -> tuple[int, int]:
    """(reschedules within the policy interval before `fail_time`, allowed)."""
    attempted = 0
    if policy.attempts > 0:
        for ev in _events(a):
            if fail_time - ev.reschedule_time < policy.interval:
                attempted += 1
    return attempted, policy.attempts


def next_reschedule_time_at(
    a: pb.Allocation, policy: pb.ReschedulePolicy, fail_time: int
) -> tuple[int, bool]:
    """(time of the next reschedule counting from `fail_time`, eligible?)."""
    delay = next_delay(a, policy)
    when = fail_time + delay
    events = _events(a)
    eligible = policy.unlimited or (policy.attempts > 0 and not events)
    if policy.attempts > 0 and events:
        attempted, attempts = reschedule_attempted(a, policy, fail_time)
        eligible = attempted < attempts and delay < policy.interval
    return when, eligible


def last_reschedule_failed(a: pb.Allocation) -> bool:
    return (
        a.HasField("reschedule_tracker")
        and a.reschedule_tracker.last_reschedule == LAST_RESCHEDULE_FAILED
    )


def next_reschedule_time(
    a: pb.Allocation, policy: pb.ReschedulePolicy | None, job_type: str
) -> tuple[int, bool]:
    """When a failed (or lost) alloc may be rescheduled, and whether the
    policy still allows it (Nomad's NextRescheduleTime)."""
    if policy is None or (policy.attempts == 0 and not policy.unlimited):
        return 0, False
    rescheduled_batch = job_type == JobType.BATCH and a.desired_transition.reschedule
    fail_time = last_event_time(a)
    if (
        (a.desired_status == DesiredStatus.STOP and not last_reschedule_failed(a))
        or (
            not rescheduled_batch
            and a.client_status not in (ClientStatus.FAILED, ClientStatus.LOST)
        )
        or fail_time == 0
    ):
        return 0, False
    return next_reschedule_time_at(a, policy, fail_time)


def expired(a: pb.Allocation, tg: pb.TaskGroup | None, now: int) -> bool:
    """An unknown alloc whose disconnect window (lost_after) has passed."""
    if tg is None or a.client_status != ClientStatus.UNKNOWN:
        return False
    lu = last_unknown(a)
    if lu == 0:
        return False
    return lu + structs.lost_after(tg) <= now


def disconnect_timeout(tg: pb.TaskGroup | None, now: int) -> int:
    """When an alloc disconnected at `now` becomes lost."""
    if tg is None:
        return now
    return now + structs.lost_after(tg)


def wait_client_stop(a: pb.Allocation, tg: pb.TaskGroup, now: int) -> int:
    """When a lost alloc with stop_on_client_after may be replaced: the first
    time it was marked lost (now, on the first pass), plus that timeout, plus
    the longest kill timeout of its tasks."""
    t = 0
    for st in a.alloc_states:
        if st.field == "client_status" and st.value == ClientStatus.LOST:
            t = st.time
            break
    if t == 0:
        t = now
    kill = DEFAULT_KILL_TIMEOUT
    for task in tg.tasks:
        kill = max(kill, task.kill_timeout)
    return t + structs.stop_on_client_after(tg) + kill


# ----------------------------------------------------------------- classification


@dataclass
class Classified:
    """Allocs of one group by what their node state asks for."""

    untainted: AllocSet
    migrate: AllocSet
    lost: AllocSet
    disconnecting: AllocSet
    reconnecting: AllocSet
    ignore: AllocSet
    expiring: AllocSet


def classify(
    allocs: Mapping[str, pb.Allocation],
    tainted: Mapping[str, pb.Node | None],
    now: int,
    tg_of: TGOf,
    initializing: frozenset[str] = frozenset(),
) -> Classified:
    """Sort allocs into untainted / migrate / lost / disconnecting /
    reconnecting / ignore / expiring; the first matching rule of semantics
    §5.3 "Classification" wins.

    One rule of our own (issue 33): an alloc still `unknown` on a node that
    is back but `initializing` (its `initializing` set) is left as it is,
    as on a node still disconnected. The node heartbeated but has not
    pushed its alloc states yet (it stays initializing until it has, so the
    scheduler learns them first), so whether the alloc still runs is not
    known: reconciling it as a reconnect would weigh an alloc that may have
    failed against its running replacements, keep it, stop them, and place
    new allocs once it reports failed. Its reconnect is decided when the
    client reports it (the `reconnect` eval of Node.UpdateAlloc)."""
    c = Classified({}, {}, {}, {}, {}, {}, {})
    for aid, a in allocs.items():
        reconnect = False
        if a.client_status in (ClientStatus.UNKNOWN, ClientStatus.RUNNING, ClientStatus.FAILED):
            reconnect = structs.needs_reconnect(a)
        node_tainted = a.node_id in tainted
        node = tainted.get(a.node_id)
        server_term = structs.alloc_server_terminal(a)
        terminal = server_term or structs.alloc_client_terminal(a)
        tg = tg_of(a)
        disconnected = node is not None and node.status == NodeStatus.DISCONNECTED

        if (
            reconnect
            and a.desired_status == DesiredStatus.RUN
            and (a.client_status == ClientStatus.FAILED)
        ):
            c.reconnecting[aid] = a
        elif terminal and not reconnect:
            if server_term:
                c.ignore[aid] = a
            elif a.deployment_status.canary and a.desired_transition.migrate:
                c.migrate[aid] = a
            else:
                c.untainted[aid] = a
        elif expired(a, tg, now):
            c.expiring[aid] = a
        elif (
            reconnect
            and a.client_status == ClientStatus.FAILED
            and a.desired_status == DesiredStatus.STOP
        ):
            c.ignore[aid] = a
        elif disconnected and a.client_status == ClientStatus.UNKNOWN:
            c.untainted[aid] = a
        elif a.client_status == ClientStatus.UNKNOWN and a.node_id in initializing:
            c.untainted[aid] = a  # back, but not reported yet
        elif disconnected and reconnect and a.client_status == ClientStatus.RUNNING:
            # alloc update arrived before the node's heartbeat (seed 003):
            # not a new disconnect; the reconnect happens once it is ready
            c.untainted[aid] = a
        elif disconnected and (
            a.client_status == ClientStatus.PENDING or tg is None or structs.lost_after(tg) == 0
        ):
            c.lost[aid] = a
        elif disconnected:
            c.disconnecting[aid] = a
        elif a.desired_transition.migrate:
            c.migrate[aid] = a
        elif (not node_tainted or (node is not None and node.status == NodeStatus.READY)) and (
            reconnect
        ):
            c.reconnecting[aid] = a
        elif not node_tainted or (node is not None and node.status == NodeStatus.READY):
            c.untainted[aid] = a
        elif node is None:
            c.lost[aid] = a
        elif (
            node.status == NodeStatus.DOWN
            and tg is not None
            and not structs.replace_on_disconnect(tg)
            and a.client_status == ClientStatus.UNKNOWN
        ):
            c.untainted[aid] = a
        elif (
            node.status == NodeStatus.DOWN
            and tg is not None
            and not structs.replace_on_disconnect(tg)
            and a.client_status == ClientStatus.RUNNING
        ):
            c.disconnecting[aid] = a
        elif node.status == NodeStatus.DOWN:
            c.lost[aid] = a
        else:
            c.untainted[aid] = a
    return c


def filter_server_terminal(allocs: Iterable[pb.Allocation], is_batch: bool) -> AllocSet:
    """Drop server-terminal allocs, except batch ones not marked for
    rescheduling (so completed batch allocs keep their slot)."""
    return {
        a.id: a
        for a in allocs
        if not structs.alloc_server_terminal(a)
        or (is_batch and not a.desired_transition.reschedule)
    }


def should_filter(a: pb.Allocation, is_batch: bool) -> tuple[bool, bool]:
    """(counts as untainted, ignore entirely) for the reschedule filter."""
    if is_batch:
        if a.desired_transition.reschedule:
            return False, False
        if a.desired_status == DesiredStatus.STOP:
            if structs.alloc_ran_successfully(a):
                return True, False
            if last_reschedule_failed(a):
                return False, False
            return False, True
        if a.desired_status == DesiredStatus.EVICT:
            return False, True
        if a.client_status == ClientStatus.FAILED:
            return False, False
        return True, False
    if a.desired_status in (DesiredStatus.STOP, DesiredStatus.EVICT):
        if last_reschedule_failed(a):
            return False, False
        return False, True
    if a.client_status in (ClientStatus.COMPLETE, ClientStatus.LOST):
        return False, True
    return False, False


@dataclass
class DelayedReschedule:
    alloc: pb.Allocation
    reschedule_time: int


def filter_by_reschedulable(
    allocs: Mapping[str, pb.Allocation],
    *,
    is_batch: bool,
    is_disconnecting: bool,
    now: int,
    eval_id: str,
    tg_of: TGOf,
    job_type: str,
) -> tuple[AllocSet, AllocSet, list[DelayedReschedule]]:
    """(untainted, reschedule now, reschedule later): failed allocs whose
    policy allows another try go to now (due within 1 s, or this eval is
    their follow-up) or later (a follow-up eval will be created)."""
    untainted: AllocSet = {}
    now_set: AllocSet = {}
    later: list[DelayedReschedule] = []
    for aid, a in allocs.items():
        if is_disconnecting and a.client_status == ClientStatus.UNKNOWN:
            continue
        if a.next_allocation and structs.alloc_terminal(a):
            continue
        is_untainted, ignore = should_filter(a, is_batch)
        if is_untainted and not is_disconnecting:
            untainted[aid] = a
            continue
        if ignore:
            continue
        tg = tg_of(a)
        policy = reschedule_policy(tg, job_type)
        eligible_now = False
        eligible_later = False
        when = 0
        if a.desired_transition.force_reschedule and structs.alloc_client_terminal(a):
            eligible_now = True
        if not (is_disconnecting and tg is not None and not structs.replace_on_disconnect(tg)):
            if is_disconnecting:
                if policy is not None:
                    when, eligible = next_reschedule_time_at(a, policy, now)
                else:
                    eligible = False
            elif a.client_status == ClientStatus.UNKNOWN and a.followup_eval_id == eval_id:
                if policy is not None:
                    when, eligible = next_reschedule_time_at(a, policy, last_unknown(a))
                else:
                    eligible = False
            else:
                when, eligible = next_reschedule_time(a, policy, job_type)
            if eligible and (a.followup_eval_id == eval_id or when - now <= RESCHEDULE_WINDOW):
                eligible_now = True
            elif eligible and not a.followup_eval_id:
                eligible_later = True
        if eligible_now:
            now_set[aid] = a
            continue
        untainted[aid] = a
        if eligible_later:
            later.append(DelayedReschedule(a, when))
    return untainted, now_set, later
