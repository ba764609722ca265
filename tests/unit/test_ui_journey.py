"""The eval journey the UI draws (services/gateway/ui/journey.py): which
stages have a committed time and what each says when it has none."""

from __future__ import annotations

from corral.v1 import structs_pb2 as pb
from services.gateway.ui.journey import NOT_RECORDED, journey, trace_id

MS = 1_000_000


def _eval(**kw: object) -> pb.Evaluation:
    base: dict[str, object] = {
        "id": "e1",
        "job_id": "web",
        "triggered_by": "job-register",
        "status": "complete",
        "create_index": 10,
        "create_time": 1_000 * MS,
        "modify_index": 12,
        "modify_time": 1_050 * MS,
    }
    base.update(kw)
    return pb.Evaluation(**base)  # type: ignore[arg-type]


def _alloc(aid: str, *, index: int, started: int = 0, status: str = "pending") -> pb.Allocation:
    a = pb.Allocation(
        id=aid, eval_id="e1", create_index=index, create_time=index * 100 * MS, client_status=status
    )
    if started:
        a.task_states["t"].started_at = started
    return a


def test_a_placed_eval_has_its_commit_and_run_times() -> None:
    allocs = [
        _alloc("b", index=11, started=1_300 * MS, status="running"),
        _alloc("a", index=11, started=1_200 * MS, status="running"),
        pb.Allocation(id="other", eval_id="e0", create_index=5),
    ]
    stages = journey(_eval(), allocs)
    assert [s.name for s in stages] == [
        "created",
        "enqueued",
        "dequeued",
        "plan submitted",
        "committed",
        "allocs running",
    ]
    created, enq, deq, sub, committed, running = stages
    assert (created.time, created.index, created.note) == (1_000 * MS, 10, "job-register")
    assert enq.time is None and enq.note == NOT_RECORDED
    assert deq.time is None and sub.time is None
    assert (committed.time, committed.index) == (1_100 * MS, 11)
    assert committed.note == "plan placed 2 alloc(s)"
    # every alloc running: the journey ends when the last one started
    assert running.time == 1_300 * MS and running.note == "2 of 2 running"
    assert running.to_json() == {
        "Name": "allocs running",
        "Time": 1_300 * MS,
        "Index": None,
        "Note": "2 of 2 running",
    }


def test_partly_running_shows_the_first_start() -> None:
    allocs = [
        _alloc("a", index=11, started=1_200 * MS, status="running"),
        _alloc("b", index=11),
    ]
    running = journey(_eval(), allocs)[-1]
    assert running.time == 1_200 * MS and running.note == "1 of 2 running"


def test_an_eval_that_placed_nothing_commits_at_its_completion() -> None:
    stages = journey(_eval(status_description="no changes"), [])
    committed = stages[4]
    assert (committed.time, committed.index) == (1_050 * MS, 12)
    assert committed.note == "eval complete, no allocs placed: no changes"
    assert stages[5].time is None and stages[5].note == ""


def test_a_pending_eval_has_no_commit_yet() -> None:
    stages = journey(_eval(status="pending", modify_time=0, modify_index=0), [])
    assert stages[4].time is None and stages[4].note == "eval pending"


def test_trace_id_of_a_traceparent() -> None:
    tid = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id(f"00-{tid}-00f067aa0ba902b7-01") == tid
    assert trace_id(f"00-{tid.upper()}-00f067aa0ba902b7-01") == tid
    assert trace_id("") == ""
    assert trace_id("00-" + "0" * 32 + "-00f067aa0ba902b7-01") == ""
    assert trace_id("00-zz-00f067aa0ba902b7-01") == ""
