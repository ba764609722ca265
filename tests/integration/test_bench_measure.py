"""W1L's commit-time figures (bench/measure.py) read from a real, migrated
database: rows written as the state service writes them (one `change_log`
row per index with its ChangeBatch, alloc and job rows stamped with their
indexes), with commit times set by hand so the expected figures are exact."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from bench import measure
from corral.domain import topics
from corral.v1 import structs_pb2 as pb

T0 = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)


def at(ms: float) -> dt.datetime:
    return T0 + dt.timedelta(milliseconds=ms)


def alloc(alloc_id: str, job_id: str, status: str) -> pb.Allocation:
    a = pb.Allocation(id=alloc_id, job_id=job_id, namespace="default", client_status=status)
    a.task_states["main"].state = status
    return a


def log(conn: psycopg.Connection[Any], index: int, ms: float, *allocs: pb.Allocation) -> None:
    batch = pb.ChangeBatch(index=index)
    for a in allocs:
        batch.events.add(topic=topics.ALLOCATION.name, type="AllocationUpdated", allocation=a)
    conn.execute(
        "INSERT INTO change_log (index, created_at, payload) VALUES (%s, %s, %s)",
        (index, at(ms), batch.SerializeToString()),
    )


def job_row(conn: psycopg.Connection[Any], job_id: str, index: int) -> None:
    conn.execute(
        "INSERT INTO jobs (namespace, id, type, status, priority, stop, version, payload, "
        "create_index, modify_index, job_modify_index) "
        "VALUES ('default', %s, 'service', 'running', 50, false, 0, ''::bytea, %s, %s, %s)",
        (job_id, index, index, index),
    )


def alloc_row(conn: psycopg.Connection[Any], a: pb.Allocation, create: int, modify: int) -> None:
    conn.execute(
        "INSERT INTO allocs (id, namespace, job_id, node_id, eval_id, name, task_group, "
        "desired_status, client_status, payload, create_index, modify_index) "
        "VALUES (%s, 'default', %s, 'n1', 'e1', %s, 'g', 'run', %s, %s, %s, %s)",
        (a.id, a.job_id, a.id, a.client_status, a.SerializeToString(), create, modify),
    )


@pytest.fixture
def conn(fresh_pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(fresh_pg_dsn, autocommit=True) as c:
        yield c


def test_placement_to_running_is_plan_commit_to_first_running_commit(
    conn: psycopg.Connection[Any],
) -> None:
    job_row(conn, "w1l50-000000", 100)
    job_row(conn, "w1l50-000001", 101)
    job_row(conn, "w1l80-000000", 102)
    log(conn, 100, 0)  # registrations
    log(conn, 101, 250)
    log(conn, 102, 260)
    a1 = alloc("a1", "w1l50-000000", "pending")
    a2 = alloc("a2", "w1l50-000001", "pending")
    other = alloc("b1", "w1l80-000000", "pending")
    log(conn, 103, 300, a1, a2, other)  # one plan placed all three
    log(
        conn, 104, 600, alloc("a1", "w1l50-000000", "running"), alloc("b1", other.job_id, "running")
    )
    log(conn, 105, 900, alloc("a1", "w1l50-000000", "running"))  # a later update of a1
    alloc_row(conn, alloc("a1", a1.job_id, "running"), 103, 105)
    alloc_row(conn, a2, 103, 103)  # never reported running
    alloc_row(conn, alloc("b1", other.job_id, "running"), 103, 104)

    # a1: plan at 300 ms, first running at 600 ms; the row's last change (900) is not it
    ms, never = measure.placement_to_running_ms(conn, "w1l50-", 99)
    assert ms == [pytest.approx(300.0)]
    assert never == 1
    assert set(measure.running_commits(conn, "w1l", 99)) == {"a1", "b1"}
    # only changes after the window's start index count
    assert measure.running_commits(conn, "w1l50-", 104) == {"a1": at(900)}

    regs = measure.register_commit_times(conn, "w1l50-%", 99)
    assert regs == [at(0), at(250)]
    assert measure.register_commit_times(conn, "w1l50-%", 100) == [at(250)]
