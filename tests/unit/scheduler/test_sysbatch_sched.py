"""The sysbatch scheduler (seed 004): run once on every feasible node;
allocs that finished are not run again for the same job version."""

from __future__ import annotations

from corral.domain import structs
from corral.domain.structs import ClientStatus, EvalStatus, NodeStatus, Trigger
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from tests.unit.scheduler.test_generic_sched import cluster, planned, register, run, stops


def finished(job, node, *, ok: bool = True) -> pb.Allocation:
    a = mock.alloc(job, node, client_status=ClientStatus.COMPLETE if ok else ClientStatus.FAILED)
    a.task_states["web"].CopyFrom(
        pb.TaskState(state="dead", failed=not ok, finished_at=structs.now_ns())
    )
    return a


def test_register_places_one_per_node():
    h, nodes = cluster(4)
    job = register(h, mock.sysbatch_job())
    run(h, job)
    assert sorted(a.node_id for a in planned(h.last_plan())) == sorted(n.id for n in nodes)
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_periodic_trigger_is_accepted():
    h, _ = cluster(2)
    job = register(h, mock.sysbatch_job())
    run(h, job, Trigger.PERIODIC_JOB)
    assert h.last_eval().status == EvalStatus.COMPLETE
    assert len(planned(h.last_plan())) == 2


def test_completed_allocs_are_not_rerun():
    h, nodes = cluster(3)
    job = register(h, mock.sysbatch_job())
    h.upsert_allocs(*(finished(job, n) for n in nodes))
    run(h, job)
    assert not h.plans
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_failed_allocs_are_not_rerun_for_the_same_version():
    h, nodes = cluster(2)
    job = register(h, mock.sysbatch_job())
    h.upsert_allocs(finished(job, nodes[0], ok=False), finished(job, nodes[1]))
    run(h, job)
    assert not h.plans


def test_job_update_reruns_finished_allocs():
    h, nodes = cluster(2)
    job = register(h, mock.sysbatch_job())
    old = [finished(job, n) for n in nodes]
    h.upsert_allocs(*old)
    job.task_groups[0].tasks[0].env["V"] = "2"
    job = register(h, job)
    run(h, job)
    new = planned(h.last_plan())
    assert sorted(a.node_id for a in new) == sorted(n.id for n in nodes)
    assert {a.previous_allocation for a in new} == {a.id for a in old}
    assert all(a.job_modify_index == job.job_modify_index for a in new)


def test_new_node_runs_it_once():
    h, nodes = cluster(2)
    job = register(h, mock.sysbatch_job())
    h.upsert_allocs(*(finished(job, n) for n in nodes))
    new = mock.node()
    h.upsert_nodes(new)
    run(h, job, Trigger.NODE_UPDATE, node_id=new.id)
    (a,) = planned(h.last_plan())
    assert a.node_id == new.id


def test_completed_alloc_on_down_node_is_not_lost():
    h, nodes = cluster(2)
    job = register(h, mock.sysbatch_job())
    done = finished(job, nodes[0])
    running = mock.alloc(job, nodes[1])
    h.upsert_allocs(done, running)
    down = structs.copy_msg(nodes[0])
    down.status = NodeStatus.DOWN
    h.upsert_nodes(down)
    run(h, job, Trigger.NODE_UPDATE)
    assert not h.plans


def test_running_alloc_on_down_node_is_lost():
    h, nodes = cluster(2)
    job = register(h, mock.sysbatch_job())
    a = mock.alloc(job, nodes[0])
    h.upsert_allocs(a, finished(job, nodes[1]))
    down = structs.copy_msg(nodes[0])
    down.status = NodeStatus.DOWN
    h.upsert_nodes(down)
    run(h, job, Trigger.NODE_UPDATE)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == a.id and s.client_status == ClientStatus.LOST


def test_retry_limit_is_two():
    h, nodes = cluster(1)
    job = register(h, mock.sysbatch_job())
    h.reject_nodes.add(nodes[0].id)
    run(h, job)
    assert len(h.plans) == 2
    assert h.last_eval().status_description == "maximum attempts reached (2)"


def test_filtered_nodes_are_skipped_silently():
    h, nodes = cluster(2)
    h.upsert_nodes(mock.node(attributes={"kernel.name": "darwin"}))
    job = register(h, mock.sysbatch_job())
    run(h, job)
    assert {a.node_id for a in planned(h.last_plan())} == {n.id for n in nodes}
    assert not h.create_evals and not h.last_eval().failed_tg_allocs


def test_filter_metrics_count_every_filtered_node():
    h, _ = cluster(2)
    job = mock.sysbatch_job()
    job.constraints.append(
        pb.Constraint(l_target="${node.unique.name}", r_target="elsewhere", operand="==")
    )
    job = register(h, job)
    run(h, job)
    m = h.last_eval().failed_tg_allocs["web"]
    assert m.nodes_filtered == 2
    assert dict(m.constraint_filtered) == {"${node.unique.name} == elsewhere": 2}


def test_in_place_job_update_does_not_rerun_finished_allocs():
    h, nodes = cluster(2)
    job = register(h, mock.sysbatch_job())
    h.upsert_allocs(*(finished(job, n) for n in nodes))
    job.task_groups[0].restart_policy.attempts = 9
    job = register(h, job)
    run(h, job)
    assert not h.plans or not planned(h.last_plan())


def test_deregister_stops_running_allocs_only():
    h, nodes = cluster(2)
    job = register(h, mock.sysbatch_job())
    live = mock.alloc(job, nodes[0])
    h.upsert_allocs(live, finished(job, nodes[1]))
    job.stop = True
    job = register(h, job)
    run(h, job, Trigger.JOB_DEREGISTER)
    assert [s.alloc_id for s in stops(h.last_plan())] == [live.id]


def test_sysbatch_does_not_preempt_by_default():
    h, nodes = cluster(1)
    hog = mock.alloc(mock.job(cpu=3500, priority=10), nodes[0])
    h.upsert_allocs(hog)
    job = register(h, mock.sysbatch_job(cpu=3000, priority=90))
    run(h, job)
    assert not h.plans or not planned(h.last_plan())
    (blocked,) = h.create_evals
    assert blocked.node_id == nodes[0].id
