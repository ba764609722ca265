"""Reschedule-policy math and the alloc name index."""

from __future__ import annotations

import pytest

from corral.domain.structs import HOUR, MINUTE, SECOND, ClientStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.reconcile.allocs import (
    AllocNameIndex,
    expired,
    last_event_time,
    last_unknown,
    next_delay,
    next_reschedule_time,
)

NOW = 1_700_000_000 * SECOND


def alloc_with_events(delays: list[int], *, times: list[int] | None = None) -> pb.Allocation:
    a = mock.alloc(mock.job(), mock.node(), client_status=ClientStatus.FAILED)
    times = times or [NOW - (len(delays) - i) * MINUTE for i in range(len(delays))]
    for d, t in zip(delays, times, strict=True):
        a.reschedule_tracker.events.add(reschedule_time=t, delay=d)
    a.task_states["web"].CopyFrom(pb.TaskState(state="dead", failed=True, finished_at=NOW))
    return a


def policy(fn: str, delay: int = 5 * SECOND, max_delay: int = 0) -> pb.ReschedulePolicy:
    return pb.ReschedulePolicy(delay=delay, delay_function=fn, max_delay=max_delay, unlimited=True)


def test_first_delay_is_the_policy_delay():
    for fn in ("constant", "exponential", "fibonacci"):
        assert next_delay(alloc_with_events([]), policy(fn)) == 5 * SECOND


def test_constant_delay():
    assert next_delay(alloc_with_events([5 * SECOND, 5 * SECOND]), policy("constant")) == 5 * SECOND


def test_exponential_delay_doubles_the_last():
    a = alloc_with_events([5 * SECOND, 10 * SECOND])
    assert next_delay(a, policy("exponential", max_delay=HOUR)) == 20 * SECOND


def test_exponential_delay_capped_by_max_delay():
    a = alloc_with_events([40 * SECOND], times=[NOW - 10 * SECOND])
    assert next_delay(a, policy("exponential", max_delay=60 * SECOND)) == 60 * SECOND


def test_delay_resets_after_running_longer_than_the_cap():
    # last reschedule long before the failure: the alloc ran fine for a while
    a = alloc_with_events([40 * SECOND], times=[NOW - 10 * MINUTE])
    assert next_delay(a, policy("exponential", max_delay=60 * SECOND)) == 5 * SECOND


def test_fibonacci_delay_sums_last_two():
    a = alloc_with_events([5 * SECOND, 5 * SECOND, 10 * SECOND])
    assert next_delay(a, policy("fibonacci", max_delay=HOUR)) == 15 * SECOND


def test_fibonacci_with_one_event_stays_at_delay():
    a = alloc_with_events([5 * SECOND])
    assert next_delay(a, policy("fibonacci", max_delay=HOUR)) == 5 * SECOND


def test_fibonacci_restarts_after_reset():
    a = alloc_with_events([60 * SECOND, 5 * SECOND], times=[NOW - 20 * SECOND, NOW - 10 * SECOND])
    assert next_delay(a, policy("fibonacci", max_delay=60 * SECOND)) == 5 * SECOND


def test_next_reschedule_time_counts_from_finish():
    a = alloc_with_events([])
    when, ok = next_reschedule_time(a, policy("constant"), "service")
    assert ok and when == NOW + 5 * SECOND


def test_next_reschedule_time_uses_modify_time_without_task_states():
    a = mock.alloc(mock.job(), mock.node(), client_status=ClientStatus.FAILED)
    a.modify_time = NOW - MINUTE
    assert last_event_time(a) == NOW - MINUTE
    when, ok = next_reschedule_time(a, policy("constant"), "service")
    assert ok and when == NOW - MINUTE + 5 * SECOND


def test_running_alloc_is_not_reschedulable():
    a = alloc_with_events([])
    a.client_status = ClientStatus.RUNNING
    assert next_reschedule_time(a, policy("constant"), "service") == (0, False)


@pytest.mark.parametrize(
    ("attempts", "events", "eligible"), [(2, 1, True), (2, 2, False), (1, 0, True)]
)
def test_attempts_within_interval(attempts, events, eligible):
    a = alloc_with_events([0] * events)
    p = pb.ReschedulePolicy(attempts=attempts, interval=HOUR, delay=0, delay_function="constant")
    assert next_reschedule_time(a, p, "batch")[1] is eligible


def test_delay_longer_than_interval_is_not_eligible():
    a = alloc_with_events([10 * MINUTE])
    p = pb.ReschedulePolicy(
        attempts=5, interval=5 * MINUTE, delay=10 * MINUTE, delay_function="constant"
    )
    assert next_reschedule_time(a, p, "batch")[1] is False


def test_last_unknown_finds_the_latest_transition():
    a = mock.alloc(mock.job(), mock.node())
    for value, t in (("unknown", 1), ("running", 2), ("unknown", 3), ("unknown", 4)):
        a.alloc_states.add(field="client_status", value=value, time=t)
    assert last_unknown(a) == 3


def test_expired_needs_unknown_status_and_elapsed_lost_after():
    job = mock.job()
    tg = job.task_groups[0]
    tg.max_client_disconnect = MINUTE
    a = mock.alloc(job, mock.node(), client_status=ClientStatus.UNKNOWN)
    a.alloc_states.add(field="client_status", value="unknown", time=NOW - 2 * MINUTE)
    assert expired(a, tg, NOW)
    assert not expired(a, tg, NOW - 90 * SECOND)
    a.client_status = ClientStatus.RUNNING
    assert not expired(a, tg, NOW)


def test_name_index_next_and_highest():
    job = mock.job(count=5)
    n = mock.node()
    in_use = {a.id: a for a in (mock.alloc(job, n, index=i) for i in (0, 2, 4))}
    idx = AllocNameIndex(job.id, "web", 5, in_use)
    assert idx.next(3) == [f"{job.id}.web[1]", f"{job.id}.web[3]", f"{job.id}.web[5]"]
    assert idx.highest(2) == {f"{job.id}.web[5]", f"{job.id}.web[4]"}


def test_name_index_duplicates():
    job = mock.job(count=2)
    n = mock.node()
    allocs = [mock.alloc(job, n, index=0), mock.alloc(job, n, index=0)]
    idx = AllocNameIndex(job.id, "web", 2, {a.id: a for a in allocs})
    assert idx.is_duplicate(0) and not idx.is_duplicate(1)
    idx.unset_index(0)
    assert not idx.is_duplicate(0)
