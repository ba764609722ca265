"""Plan.Submit's validation: bad plans are refused naming the field;
defaults a worker may leave out are filled in."""

from __future__ import annotations

import pytest

from corral.domain.errors import InvalidArgument
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.planner.handlers import validate_plan


def good_plan() -> tuple[pb.Plan, pb.Node]:
    node, job = mock.node(), mock.job(priority=70)
    plan = pb.Plan(eval_id="e1", eval_token="t1", job=job)
    a = mock.alloc(job, node)
    a.node_id = a.namespace = a.eval_id = a.desired_status = ""
    plan.node_allocation[node.id].allocs.append(a)
    plan.node_update[node.id].stops.add(alloc_id="x", client_status="lost")
    return plan, node


def test_defaults_are_filled_in() -> None:
    plan, node = good_plan()
    validate_plan(plan)
    a = plan.node_allocation[node.id].allocs[0]
    assert (a.node_id, a.namespace, a.eval_id, a.desired_status) == (
        node.id,
        "default",
        "e1",
        "run",
    )
    assert plan.priority == 70


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p, n: setattr(p, "eval_id", ""), "plan.eval_id"),
        (lambda p, n: setattr(p, "eval_token", ""), "plan.eval_token"),
        (lambda p, n: setattr(p.job, "id", ""), "plan.job.id"),
        (lambda p, n: setattr(p, "priority", -1), "plan.priority"),
        (
            lambda p, n: setattr(p.node_allocation[n.id].allocs[0], "id", ""),
            "plan.node_allocation[{n}].allocs[0].id",
        ),
        (
            lambda p, n: setattr(p.node_allocation[n.id].allocs[0], "node_id", "other"),
            "plan.node_allocation[{n}].allocs[0].node_id",
        ),
        (
            lambda p, n: setattr(p.node_allocation[n.id].allocs[0], "job_id", "other"),
            "plan.node_allocation[{n}].allocs[0].job_id",
        ),
        (
            lambda p, n: setattr(p.node_allocation[n.id].allocs[0], "client_status", "zzz"),
            "plan.node_allocation[{n}].allocs[0].client_status",
        ),
        (
            lambda p, n: setattr(p.node_allocation[n.id].allocs[0].resources, "cpu", -5),
            "plan.node_allocation[{n}].allocs[0].resources.cpu",
        ),
        (
            lambda p, n: p.node_allocation[n.id].allocs.append(p.node_allocation[n.id].allocs[0]),
            "plan.node_allocation[{n}].allocs[1].id",
        ),
        (
            lambda p, n: setattr(p.node_update[n.id].stops[0], "alloc_id", ""),
            "plan.node_update[{n}].stops[0].alloc_id",
        ),
        (
            lambda p, n: setattr(p.node_update[n.id].stops[0], "desired_status", "run"),
            "plan.node_update[{n}].stops[0].desired_status",
        ),
        (lambda p, n: p.deployment_updates.add(status="x"), "plan.deployment_updates[0]"),
    ],
)
def test_bad_plans_name_the_field(mutate: object, field: str) -> None:
    plan, node = good_plan()
    mutate(plan, node)  # type: ignore[operator]
    with pytest.raises(InvalidArgument) as err:
        validate_plan(plan)
    assert err.value.field.startswith(field.format(n=node.id))


def test_a_plan_without_a_job_may_only_stop() -> None:
    # the scheduler's plan for a purged job: no job, only stops
    node = mock.node()
    plan = pb.Plan(eval_id="e1", eval_token="t1")
    plan.node_update[node.id].stops.add(alloc_id="a1")
    plan.deployment_updates.add(deployment_id="d1", status="cancelled")
    validate_plan(plan)
    assert not plan.HasField("job")

    plan.node_allocation[node.id].allocs.append(pb.Allocation(id="a2", task_group="web"))
    with pytest.raises(InvalidArgument) as err:
        validate_plan(plan)
    assert err.value.field == "plan.job.id"
