"""Nomad's Job.Statuses page (services/state/job_statuses.py) on a
snapshot: newest change first, tokens of modify indexes, children left out
unless asked for, a parent's children's statuses, named jobs only."""

from __future__ import annotations

from corral.domain.store import StateStore
from corral.testing import mock
from corral.v1 import job_pb2, query_pb2
from corral.v1 import structs_pb2 as pb
from services.state import job_statuses


def _job(job_id: str, modify_index: int, **fields: object) -> pb.Job:
    j = mock.batch_job(job_id=job_id, count=2)
    j.modify_index = modify_index
    for name, value in fields.items():
        setattr(j, name, value)
    return j


def _snapshot() -> StateStore:
    parent = _job("nightly", 5)
    parent.periodic.enabled = True
    jobs = [
        _job("a", 10),
        _job("b", 30),
        _job("c", 20),
        parent,
        _job("nightly/periodic-1", 6, parent_id="nightly", status="dead"),
        _job("nightly/periodic-2", 40, parent_id="nightly", status="running"),
    ]
    return StateStore(StateStore.build(50, jobs=jobs))


def _page(
    token: str = "", per_page: int = 0, *, reverse: bool = False, **kw: object
) -> tuple[list[str], str, int]:
    q = query_pb2.QueryOptions(per_page=per_page, next_token=token, reverse=reverse)
    request = job_pb2.JobStatusesRequest(query=q, **kw)  # type: ignore[arg-type]
    out, nxt, index, _ = job_statuses.page(_snapshot().snapshot(), request, lambda ns: True)
    return [j.id for j in out], nxt, index


def test_newest_change_first_children_left_out() -> None:
    assert _page()[0] == ["b", "c", "a", "nightly"]
    assert _page(reverse=True)[0] == ["nightly", "a", "c", "b"]


def test_pages_by_modify_index_tokens() -> None:
    assert _page(per_page=2) == (["b", "c"], "10", 30)
    # nightly's newest change is its newest child's
    assert _page("10", 2) == (["a", "nightly"], "", 40)
    assert _page("25", 1) == (["c"], "10", 20)  # a token between two jobs


def test_a_parent_shows_its_childrens_statuses_and_their_newest_change() -> None:
    snap = _snapshot().snapshot()
    request = job_pb2.JobStatusesRequest(
        jobs=[job_pb2.NamespacedJobID(namespace="default", id="nightly")]
    )
    [entry], _, index, _ = job_statuses.page(snap, request, lambda ns: True)
    assert entry.has_children and list(entry.child_statuses) == ["dead", "running"]
    assert not entry.allocs and not entry.HasField("latest_deployment")
    assert index == 40  # the newest child's change


def test_include_children_and_named_jobs() -> None:
    ids, _, _ = _page(include_children=True)
    assert ids == ["nightly/periodic-2", "b", "c", "a", "nightly/periodic-1", "nightly"]
    named = [job_pb2.NamespacedJobID(id="a"), job_pb2.NamespacedJobID(id="b")]
    assert _page(jobs=named)[0] == ["b", "a"]
    # a namespace the caller may not read shows nothing
    request = job_pb2.JobStatusesRequest()
    assert job_statuses.page(_snapshot().snapshot(), request, lambda ns: False)[0] == []
