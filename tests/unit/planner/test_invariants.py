"""The invariant checker on StateStore-built snapshots: each violation it
must find, and silence on a valid state."""

from __future__ import annotations

from corral.store import StateStore
from corral.structs import ClientStatus, DesiredStatus
from corral.testing import mock
from corral.testing.invariants import (
    DUPLICATE_NAME,
    MISSING_JOB,
    MISSING_NODE,
    OVER_COMMITTED,
    WARNING,
    check_snapshot,
    errors,
)


def test_valid_state_has_no_violations() -> None:
    node, job = mock.node(), mock.job()
    allocs = [mock.alloc(job, node, index=i) for i in range(7)]
    snap = StateStore.build(5, nodes=[node], jobs=[job], allocs=allocs)
    assert check_snapshot(snap) == []


def test_over_committed_node_is_found_terminal_allocs_do_not_count() -> None:
    node, job = mock.node(), mock.job()
    allocs = [mock.alloc(job, node, index=i) for i in range(7)]
    allocs.append(mock.alloc(job, node, index=20, desired_status=DesiredStatus.STOP))
    allocs.append(mock.alloc(job, node, index=21, client_status=ClientStatus.FAILED))
    assert check_snapshot(StateStore.build(5, nodes=[node], jobs=[job], allocs=allocs)) == []
    allocs.append(mock.alloc(job, node, index=7))
    found = check_snapshot(StateStore.build(5, nodes=[node], jobs=[job], allocs=allocs))
    assert [(v.kind, v.subject) for v in found] == [(OVER_COMMITTED, node.id)]
    assert "cpu" in found[0].detail


def test_allocs_referencing_missing_nodes_or_job_versions_are_found() -> None:
    node, job, ghost_node, ghost_job = mock.node(), mock.job(), mock.node(), mock.job()
    on_ghost_node = mock.alloc(job, ghost_node)
    of_ghost_job = mock.alloc(ghost_job, node)
    old_version = mock.alloc(job, node, index=3)
    old_version.job_version = 7
    snap = StateStore.build(
        5, nodes=[node], jobs=[job], allocs=[on_ghost_node, of_ghost_job, old_version]
    )
    kinds = sorted((v.kind, v.subject) for v in errors(check_snapshot(snap)))
    assert kinds == sorted(
        [
            (MISSING_NODE, on_ghost_node.id),
            (MISSING_JOB, of_ghost_job.id),
            (MISSING_JOB, old_version.id),
        ]
    )


def test_duplicate_live_names_are_reported_as_warnings_only() -> None:
    node, job = mock.node(), mock.job()
    a, b = mock.alloc(job, node, index=0), mock.alloc(job, node, index=0)
    c = mock.alloc(job, node, index=0, desired_status=DesiredStatus.STOP)
    found = check_snapshot(StateStore.build(5, nodes=[node], jobs=[job], allocs=[a, b, c]))
    assert [(v.kind, v.severity) for v in found] == [(DUPLICATE_NAME, WARNING)]
    assert errors(found) == []
