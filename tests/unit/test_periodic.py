"""Cron specs of periodic jobs (corral/domain/periodic.py): the next launch over
several crons, in a time zone, across daylight-saving changes, Nomad's
field layouts, and the child a launch derives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from corral.domain import periodic
from corral.v1 import structs_pb2 as pb


def cfg(*crons: str, tz: str = "") -> pb.PeriodicConfig:
    if len(crons) == 1:
        return pb.PeriodicConfig(enabled=True, spec=crons[0], time_zone=tz)
    return pb.PeriodicConfig(enabled=True, crons=list(crons), time_zone=tz)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


def launches(c: pb.PeriodicConfig, start: datetime, n: int) -> list[datetime]:
    out: list[datetime] = []
    at = start
    for _ in range(n):
        nxt = periodic.next_launch(c, at)
        assert nxt is not None
        out.append(nxt.astimezone(UTC))
        at = nxt
    return out


def test_several_crons_launch_at_the_earliest_match() -> None:
    c = cfg("0 3 * * *", "30 1 * * *", "*/20 2 * * *")
    assert launches(c, utc(2026, 5, 1, 0, 0), 6) == [
        utc(2026, 5, 1, 1, 30),
        utc(2026, 5, 1, 2, 0),
        utc(2026, 5, 1, 2, 20),
        utc(2026, 5, 1, 2, 40),
        utc(2026, 5, 1, 3, 0),
        utc(2026, 5, 2, 1, 30),
    ]


def test_next_launch_is_strictly_after_the_given_time() -> None:
    c = cfg("0 * * * *")
    assert periodic.next_launch(c, utc(2026, 5, 1, 10, 0)) == utc(2026, 5, 1, 11, 0)
    assert periodic.next_launch(c, utc(2026, 5, 1, 9, 59, 59)) == utc(2026, 5, 1, 10, 0)


def test_time_zone_reads_the_spec_in_local_time() -> None:
    nine = "0 9 * * *"
    start = utc(2026, 1, 10, 0, 0)
    assert launches(cfg(nine, tz="America/New_York"), start, 1) == [utc(2026, 1, 10, 14, 0)]
    assert launches(cfg(nine, tz="Asia/Tokyo"), start, 1) == [utc(2026, 1, 11, 0, 0)]
    assert launches(cfg(nine), start, 1) == [utc(2026, 1, 10, 9, 0)]
    # summer time moves the UTC launch by an hour
    assert launches(cfg(nine, tz="America/New_York"), utc(2026, 7, 1), 1) == [
        utc(2026, 7, 1, 13, 0)
    ]


def test_dst_spring_forward_runs_a_skipped_time_once() -> None:
    # 2026-03-08 02:00 EST jumps to 03:00 EDT in New York: 02:30 never exists
    c = cfg("30 2 * * *", tz="America/New_York")
    assert launches(c, utc(2026, 3, 7, 12, 0), 3) == [
        utc(2026, 3, 8, 7, 0),  # 03:00 EDT, right after the gap
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
        utc(2026, 3, 10, 6, 30),
    ]


def test_dst_fall_back_runs_a_repeated_time_once() -> None:
    # 2026-11-01 01:00-02:00 happens twice in New York: one launch, not two
    c = cfg("30 1 * * *", tz="America/New_York")
    assert launches(c, utc(2026, 10, 31, 12, 0), 3) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
        utc(2026, 11, 3, 6, 30),
    ]


def test_dst_fall_back_intervals_keep_running_through_the_repeated_hour() -> None:
    c = cfg("*/30 * * * *", tz="America/New_York")
    got = launches(c, utc(2026, 11, 1, 4, 50), 5)
    assert [b - a for a, b in zip(got, got[1:], strict=False)] == [timedelta(minutes=30)] * 4


def test_nomad_field_layouts_and_macros() -> None:
    start = utc(2026, 1, 1, 0, 0)
    # 7 fields: seconds first, year last
    assert launches(cfg("*/5 * * * * * *"), start, 2) == [
        utc(2026, 1, 1, 0, 0, 5),
        utc(2026, 1, 1, 0, 0, 10),
    ]
    # 6 fields: a year after the 5 usual ones
    assert launches(cfg("15 4 * * * *"), start, 1) == [utc(2026, 1, 1, 4, 15)]
    assert launches(cfg("@hourly"), start, 1) == [utc(2026, 1, 1, 1, 0)]
    assert launches(cfg("@weekly"), start, 1) == [utc(2026, 1, 4, 0, 0)]  # a Sunday


@pytest.mark.parametrize(
    ("c", "field"),
    [
        (cfg("61 * * * *"), "job.periodic.spec"),
        (cfg("* * * *"), "job.periodic.spec"),
        (cfg("0 0 1 1 * 2030"), "job.periodic.spec"),
        (cfg("@often"), "job.periodic.spec"),
        (cfg("* * * * *", "0 0 31 2 *"), "job.periodic.crons[1]"),
        (cfg("* * * * *", tz="Nowhere/Town"), "job.periodic.time_zone"),
        (pb.PeriodicConfig(enabled=True), "job.periodic.spec"),
        (pb.PeriodicConfig(spec="* * * * *", crons=["* * * * *"]), "job.periodic.crons"),
    ],
)
def test_invalid_specs_name_the_field(c: pb.PeriodicConfig, field: str) -> None:
    with pytest.raises(periodic.PeriodicError) as err:
        periodic.validate(c)
    assert err.value.field == field


def test_child_is_a_copy_named_after_its_launch() -> None:
    parent = pb.Job(
        id="report",
        namespace="default",
        type="batch",
        periodic=cfg("0 * * * *"),
        status="running",
        version=4,
        job_modify_index=17,
        task_groups=[pb.TaskGroup(name="g", count=2)],
    )
    at = utc(2026, 5, 1, 10, 0)
    child = periodic.derive_child(parent, at)
    assert child.id == child.name == f"report/periodic-{int(at.timestamp())}"
    assert child.parent_id == "report" and not child.HasField("periodic")
    assert child.status == "" and child.version == 0 and child.job_modify_index == 0
    assert child.task_groups[0].count == 2 and parent.HasField("periodic")
    assert periodic.launch_of(child.id, "report") == periodic.to_unix_ns(at)
    assert periodic.launch_of(child.id, "other") is None
    assert periodic.launch_of("report/dispatch-1", "report") is None
