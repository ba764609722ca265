"""Plan annotations for dry runs (`job plan`): per task group, what the
scheduler would do."""

from __future__ import annotations

from corral.domain import structs
from corral.domain.structs import NodeStatus, Trigger
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import annotate
from services.worker.scheduler.reconcile.node import AllocTuple, NodeDiff
from tests.unit.scheduler.test_generic_sched import cluster, register, run


def tg_updates(h) -> dict[str, pb.DesiredUpdates]:
    return dict(h.last_plan().annotations.desired_tg_updates)


def test_register_annotates_placements():
    h, _ = cluster(3)
    job = register(h, mock.job(count=4))
    run(h, job, annotate_plan=True)
    du = tg_updates(h)["web"]
    assert du.place == 4 and du.stop == 0


def test_annotated_noop_plan_is_still_submitted():
    h, nodes = cluster(2)
    job = register(h, mock.job(count=2))
    h.upsert_allocs(*(mock.alloc(job, nodes[i], index=i) for i in range(2)))
    run(h, job, annotate_plan=True)
    assert len(h.plans) == 1
    assert tg_updates(h)["web"].ignore == 2


def test_destructive_and_in_place_and_stop_counts():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=3))
    allocs = [mock.alloc(job, nodes[i], index=i) for i in range(3)]
    h.upsert_allocs(*allocs)
    job.task_groups[0].count = 2
    job.task_groups[0].restart_policy.attempts = 5
    job = register(h, job)
    run(h, job, annotate_plan=True)
    du = tg_updates(h)["web"]
    assert du.stop == 1 and du.in_place_update == 2

    job.task_groups[0].tasks[0].env["X"] = "y"
    job = register(h, job)
    run(h, job, annotate_plan=True)
    du = tg_updates(h)["web"]
    assert du.destructive_update == 2


def test_migrate_and_lost_counts():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=2))
    a0, a1 = mock.alloc(job, nodes[0], index=0), mock.alloc(job, nodes[1], index=1)
    a0.desired_transition.migrate = True
    h.upsert_allocs(a0, a1)
    down = structs.copy_msg(nodes[1])
    down.status = NodeStatus.DOWN
    h.upsert_nodes(down)
    run(h, job, Trigger.NODE_UPDATE, annotate_plan=True)
    du = tg_updates(h)["web"]
    assert du.migrate == 1
    assert du.stop == 1  # the lost alloc
    assert du.place == 1  # its replacement (the migration places separately)


def test_system_annotations_count_only_feasible_places():
    h, nodes = cluster(2)
    h.upsert_nodes(mock.node(attributes={"kernel.name": "windows"}))
    job = register(h, mock.system_job())
    run(h, job, annotate_plan=True)
    assert tg_updates(h)["web"].place == 2


def test_desired_updates_from_node_diff():
    job = mock.system_job()
    tg = job.task_groups[0]
    n = mock.node()
    a = mock.alloc(job, n)
    t = AllocTuple(a.name, tg, a, n.id)
    diff = NodeDiff(place=[t, t], stop=[t], ignore=[t], migrate=[t], lost=[t])
    out = annotate.desired_updates_from_node_diff(diff, [t], [t, t])
    du = out.desired_tg_updates["web"]
    assert (du.place, du.stop, du.ignore, du.migrate) == (2, 2, 1, 1)
    assert (du.in_place_update, du.destructive_update) == (1, 2)


def test_add_preemptions():
    out = pb.PlanAnnotations()
    victims = [mock.alloc(mock.job(), mock.node()) for _ in range(2)]
    annotate.add_preemptions(out, "web", victims)
    assert out.desired_tg_updates["web"].preemptions == 2
    assert [a.id for a in out.preempted_allocs] == [v.id for v in victims]


def _full_node_with_low_priority_alloc(h, nodes):
    victim_job = mock.job(count=1, cpu=3500, priority=20)
    victim = mock.alloc(victim_job, nodes[0])
    h.upsert_allocs(victim)
    return victim


def test_system_preemption_is_planned_and_annotated():
    h, nodes = cluster(1)
    victim = _full_node_with_low_priority_alloc(h, nodes)
    job = register(h, mock.system_job(cpu=3000, priority=70))
    run(h, job, annotate_plan=True)
    plan = h.last_plan()
    (alloc,) = [a for lst in plan.node_allocation.values() for a in lst.allocs]
    assert list(alloc.preempted_allocations) == [victim.id]
    (evict,) = plan.node_preemptions[nodes[0].id].stops
    assert evict.alloc_id == victim.id and evict.preempted_by_allocation == alloc.id
    assert tg_updates(h)["web"].preemptions == 1
    assert [a.id for a in plan.annotations.preempted_allocs] == [victim.id]
    assert h.alloc(victim.id).desired_status == "evict"


def test_service_preemption_follows_scheduler_config():
    h, nodes = cluster(1)
    victim = _full_node_with_low_priority_alloc(h, nodes)
    job = register(h, mock.job(count=1, cpu=3000, priority=70))
    run(h, job)
    assert len(h.create_evals) == 1  # blocked: preemption is off for service

    h.set_scheduler_config(
        pb.SchedulerConfiguration(
            preemption_config=pb.PreemptionConfig(service_scheduler_enabled=True)
        )
    )
    h.create_evals.clear()
    run(h, job, annotate_plan=True)
    (alloc,) = [a for lst in h.last_plan().node_allocation.values() for a in lst.allocs]
    assert list(alloc.preempted_allocations) == [victim.id]
    assert tg_updates(h)["web"].preemptions == 1
