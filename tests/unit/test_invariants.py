"""The invariant checker on StateStore-built snapshots: each known-bad state
(issue 19's list and the earlier ones) is built, checked, and named; a
valid state is silent."""

from __future__ import annotations

from corral.domain.store import StateStore
from corral.domain.structs import (
    ClientStatus,
    DeploymentStatus,
    DesiredStatus,
    EvalStatus,
    NodeStatus,
    new_id,
)
from corral.testing import mock
from corral.testing.invariants import (
    DUPLICATE_NAME,
    LIVE_ON_DOWN_NODE,
    MISSING_JOB,
    MISSING_NODE,
    OVER_COMMITTED,
    OVER_COMMITTED_STOPPING,
    OVER_PLACED,
    STALE_BLOCKED,
    STUCK_PENDING,
    UNDER_PLACED,
    check_placed,
    check_settled,
    check_snapshot,
    errors,
    kinds,
)
from corral.v1 import structs_pb2 as pb

S = 1_000_000_000
NOW = 1_700_000_000 * S


def settled(**parts: object) -> list[str]:
    snap = StateStore.build(5, **parts)  # type: ignore[arg-type]
    return kinds(check_settled(snap, now_ns=NOW, stuck_after=60))


def test_valid_state_has_no_violations() -> None:
    node, job = mock.node(), mock.job()
    allocs = [mock.alloc(job, node, index=i) for i in range(7)]
    ev = mock.eval_for(job, status=EvalStatus.COMPLETE)
    job.task_groups[0].count = 7
    snap = StateStore.build(5, nodes=[node], jobs=[job], allocs=allocs, evals=[ev])
    assert check_settled(snap, now_ns=NOW) == []


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
    found = sorted((v.kind, v.subject) for v in errors(check_snapshot(snap)))
    assert found == sorted(
        [
            (MISSING_NODE, on_ghost_node.id),
            (MISSING_JOB, of_ghost_job.id),
            (MISSING_JOB, old_version.id),
        ]
    )


def test_duplicate_live_names_are_errors() -> None:
    node, job = mock.node(), mock.job()
    a, b = mock.alloc(job, node, index=0), mock.alloc(job, node, index=0)
    c = mock.alloc(job, node, index=0, desired_status=DesiredStatus.STOP)
    found = errors(check_snapshot(StateStore.build(5, nodes=[node], jobs=[job], allocs=[a, b, c])))
    assert [(v.kind, v.subject) for v in found] == [
        (DUPLICATE_NAME, ",".join(sorted([a.id, b.id])))
    ]
    assert "named" in found[0].detail


def test_names_nomad_lets_share_are_not_duplicates() -> None:
    """A canary of an active deployment, an alloc held as unknown on a
    disconnected node, and a system job's allocs on different nodes."""
    n1, n2 = mock.node(), mock.node()
    job = mock.job(count=2)
    old, canary = mock.alloc(job, n1, index=0), mock.alloc(job, n2, index=0)
    canary.deployment_status.canary = True
    dep = pb.Deployment(
        id=new_id(), namespace=job.namespace, job_id=job.id, status=DeploymentStatus.RUNNING
    )
    unknown, replacement = mock.alloc(job, n1, index=1), mock.alloc(job, n2, index=1)
    unknown.client_status = ClientStatus.UNKNOWN
    sysjob = mock.system_job()
    s1, s2 = mock.alloc(sysjob, n1), mock.alloc(sysjob, n2)
    snap = StateStore.build(
        5,
        nodes=[n1, n2],
        jobs=[job, sysjob],
        allocs=[old, canary, unknown, replacement, s1, s2],
        deployments=[dep],
    )
    assert check_snapshot(snap) == []
    # the same system job twice on one node is a duplicate
    s3 = mock.alloc(sysjob, n1)
    snap = StateStore.build(5, nodes=[n1, n2], jobs=[sysjob], allocs=[s1, s2, s3])
    assert kinds(check_snapshot(snap)) == [DUPLICATE_NAME]


def test_more_live_allocs_than_count_is_found() -> None:
    node, job = mock.node(), mock.job(count=2)
    allocs = [mock.alloc(job, node, index=i) for i in range(3)]
    assert settled(nodes=[node], jobs=[job], allocs=allocs) == [OVER_PLACED]
    snap = StateStore.build(5, nodes=[node], jobs=[job], allocs=allocs)
    found = check_settled(snap, now_ns=NOW)
    assert "3 live allocs for count 2" in found[0].detail
    # a stopped job has none
    job.stop = True
    assert settled(nodes=[node], jobs=[job], allocs=allocs[:1]) == [OVER_PLACED]
    # terminal allocs do not count
    allocs[2].client_status = ClientStatus.FAILED
    job.stop = False
    assert settled(nodes=[node], jobs=[job], allocs=allocs) == []


def test_over_commit_from_a_stopping_alloc_that_still_runs_is_found() -> None:
    node = mock.node(cpu=2100)  # 2000 MHz usable: four 500 MHz allocs
    job = mock.job(count=4)
    allocs = [mock.alloc(job, node, index=i) for i in range(4)]
    old = mock.job(job_id=job.id, count=4)
    old.version, old.job_modify_index = 0, 50
    job.version, job.job_modify_index = 1, 99
    stopping = mock.alloc(old, node, index=0, desired_status=DesiredStatus.STOP)
    stopping.client_status = ClientStatus.RUNNING
    parts = {"nodes": [node], "jobs": [job], "job_versions": [old, job]}
    # the always-true check frees it once the stop is committed (as the planner does)
    assert check_snapshot(StateStore.build(5, allocs=[*allocs, stopping], **parts)) == []  # type: ignore[arg-type]
    assert settled(allocs=[*allocs, stopping], **parts) == [OVER_COMMITTED_STOPPING]
    stopping.client_status = ClientStatus.COMPLETE
    assert settled(allocs=[*allocs, stopping], **parts) == []


def test_under_placed_job_without_a_blocked_eval_is_found() -> None:
    node, job = mock.node(), mock.job(count=3)
    allocs = [mock.alloc(job, node, index=i) for i in range(2)]
    found = check_placed(StateStore.build(5, nodes=[node], jobs=[job], allocs=allocs))
    assert [(v.kind, v.subject) for v in found] == [(UNDER_PLACED, f"default/{job.id}")]


def test_a_blocked_eval_explains_a_shortfall_only_when_the_cluster_is_full() -> None:
    node = mock.node(cpu=1100)  # room for exactly two 500 MHz allocs
    job = mock.job(count=3)
    allocs = [mock.alloc(job, node, index=i) for i in range(2)]
    blocked = mock.eval_for(job, status=EvalStatus.BLOCKED)
    blocked.class_eligibility[node.computed_class] = True
    assert settled(nodes=[node], jobs=[job], allocs=allocs, evals=[blocked]) == []
    # one alloc finished: room for the missing one, and the blocked eval still waits
    allocs[1].client_status = ClientStatus.FAILED
    found = check_placed(
        StateStore.build(5, nodes=[node], jobs=[job], allocs=allocs, evals=[blocked])
    )
    assert [v.kind for v in found] == [STALE_BLOCKED]
    assert node.id in found[0].detail


def test_a_blocked_eval_for_an_older_job_version_is_stale() -> None:
    node = mock.node(cpu=1100)
    job = mock.job(count=3)
    allocs = [mock.alloc(job, node, index=i) for i in range(2)]
    blocked = mock.eval_for(job, status=EvalStatus.BLOCKED)
    blocked.job_modify_index = job.job_modify_index - 10
    found = check_placed(
        StateStore.build(5, nodes=[node], jobs=[job], allocs=allocs, evals=[blocked])
    )
    assert [v.kind for v in found] == [STALE_BLOCKED]
    assert "older version" in found[0].detail


def test_a_blocked_eval_of_a_constrained_job_without_class_info_is_trusted() -> None:
    """Without the eval's class eligibility the checker cannot know the job's
    constraints rule the roomy node out, so it does not cry stale."""
    node = mock.node()
    job = mock.job(count=3)
    blocked = mock.eval_for(job, status=EvalStatus.BLOCKED)
    blocked.escaped_computed_class = True
    assert settled(nodes=[node], jobs=[job], evals=[blocked]) == []


def test_an_eval_stuck_pending_is_found() -> None:
    job = mock.job(count=0)
    fresh = mock.eval_for(job)
    fresh.modify_time = NOW - 5 * S
    stuck = mock.eval_for(job)
    stuck.modify_time = NOW - 600 * S
    delayed = mock.eval_for(job)  # a reschedule-later eval, due in the future
    delayed.modify_time, delayed.wait_until = NOW - 600 * S, NOW + 30 * S
    snap = StateStore.build(5, jobs=[job], evals=[fresh, stuck, delayed])
    found = check_settled(snap, now_ns=NOW, stuck_after=60)
    assert [(v.kind, v.subject) for v in found] == [(STUCK_PENDING, stuck.id)]
    assert "pending for 600s" in found[0].detail


def test_a_running_alloc_on_a_down_node_is_found() -> None:
    node, job = mock.node(status=NodeStatus.DOWN), mock.job(count=1)
    running = mock.alloc(job, node)
    lost = mock.alloc(job, node, index=0, desired_status=DesiredStatus.STOP)
    lost.client_status = ClientStatus.LOST
    job.task_groups[0].count = 1
    snap = StateStore.build(5, nodes=[node], jobs=[job], allocs=[running, lost])
    found = [v for v in check_settled(snap, now_ns=NOW) if v.kind == LIVE_ON_DOWN_NODE]
    assert [v.subject for v in found] == [running.id]
    assert node.id in found[0].detail
