"""The deployment progress table `job run` and `deployment status` print."""

from __future__ import annotations

from cli.deployment_monitor import HEADERS, group_rows
from corral.v1 import structs_pb2 as pb


def test_a_row_per_group_with_canaries_when_there_are() -> None:
    d = pb.Deployment()
    d.task_groups["web"].CopyFrom(
        pb.DeploymentState(
            desired_total=4,
            desired_canaries=1,
            placed_canaries=["c1"],
            placed_allocs=1,
            healthy_allocs=1,
        )
    )
    d.task_groups["api"].CopyFrom(pb.DeploymentState(desired_total=2, unhealthy_allocs=1))
    rows = group_rows(d)
    assert [dict(zip(HEADERS, r, strict=True)) for r in rows] == [
        {
            "Task Group": "api",
            "Promoted": "-",
            "Desired": "2",
            "Canaries": "0",
            "Placed": "0",
            "Healthy": "0",
            "Unhealthy": "1",
            "Progress Deadline": "-",
        },
        {
            "Task Group": "web",
            "Promoted": "false",
            "Desired": "4",
            "Canaries": "1/1",
            "Placed": "1",
            "Healthy": "1",
            "Unhealthy": "0",
            "Progress Deadline": "-",
        },
    ]
