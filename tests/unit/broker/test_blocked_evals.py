"""Blocked evals: per-job dedupe, class capture, escaped, per-node system
evals, missed unblocks (nomad/blocked_evals_test.go)."""

from __future__ import annotations

from corral.domain.structs import new_id
from corral.v1 import structs_pb2 as pb
from services.broker.blocked_evals import BlockedEvals


def blocked(
    job: str = "", *, classes: dict[str, bool] | None = None, escaped: bool = False, **kw: object
) -> pb.Evaluation:
    e = pb.Evaluation(
        id=new_id(),
        namespace="default",
        job_id=job or new_id(),
        type="service",
        status="blocked",
        triggered_by="queued-allocs",
        escaped_computed_class=escaped,
        class_eligibility=classes or {},
    )
    for k, v in kw.items():
        setattr(e, k, v)
    return e


def tracker() -> tuple[BlockedEvals, list[tuple[list[str], int]]]:
    released: list[tuple[list[str], int]] = []
    b = BlockedEvals(lambda evs, index: released.append(([e.id for e in evs], index)))
    b.set_enabled(True)
    return b, released


def test_unblocked_by_a_matching_class_and_not_by_another() -> None:
    b, released = tracker()
    e = blocked(classes={"v1:gpu": True, "v1:small": False})
    b.block(e)
    b.unblock("v1:small", 10)
    assert released == [] and b.total_blocked == 1
    b.unblock("v1:gpu", 11)
    assert released == [([e.id], 11)] and b.total_blocked == 0


def test_unseen_class_releases_captured_evals() -> None:
    b, released = tracker()
    e = blocked(classes={"v1:a": False})
    b.block(e)
    b.unblock("v1:brand-new", 5)
    assert released == [([e.id], 5)]


def test_escaped_evals_unblock_on_any_node() -> None:
    b, released = tracker()
    e = blocked(escaped=True, classes={"v1:a": False})
    b.block(e)
    assert b.total_escaped == 1
    b.unblock("v1:a", 7)
    assert released == [([e.id], 7)]


def test_one_blocked_eval_per_job_newest_wins() -> None:
    b, _ = tracker()
    old = blocked("web", create_index=5)
    new = blocked("web", create_index=9)
    b.block(old)
    b.block(new)
    assert b.total_blocked == 1
    assert [d.id for d in b.take_duplicates()] == [old.id]
    stale = blocked("web", create_index=3)
    b.block(stale)
    assert [d.id for d in b.take_duplicates()] == [stale.id]


def test_system_evals_are_released_by_their_node() -> None:
    b, released = tracker()
    e = blocked("sys", type="system", node_id="n1", classes={"v1:a": False})
    b.block(e)
    b.unblock_node("n2", 3)
    assert released == []
    b.unblock_node("n1", 4)
    assert released == [([e.id], 4)]


def test_missed_unblock_releases_at_once() -> None:
    b, released = tracker()
    b.unblock("v1:a", 20)
    e = blocked(classes={"v1:a": True}, snapshot_index=15)
    b.block(e)
    assert released == [([e.id], 20)] and b.total_blocked == 0
    fresh = blocked(classes={"v1:a": True}, snapshot_index=25)
    b.block(fresh)
    assert b.total_blocked == 1


def test_untrack_and_max_plan_attempts_release() -> None:
    b, released = tracker()
    e = blocked("web")
    b.block(e)
    b.untrack("default", "web")
    assert b.total_blocked == 0
    conflict = blocked("api", triggered_by="max-plan-attempts")
    b.block(conflict)
    b.unblock_failed()
    assert released and released[-1][0] == [conflict.id]
