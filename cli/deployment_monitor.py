"""`job run` after the placements: follow the job version's deployment to
its end (Nomad's deployment monitor), with a progress line per task group
(promoted, desired, canaries placed/desired, placed, healthy, unhealthy,
progress deadline).

Exit codes: 0 when the deployment succeeded, 1 when it failed or was
cancelled (an auto-revert is named). Driven by blocking queries."""

from __future__ import annotations

import time
from typing import TextIO

import grpc

from cli.client import Client
from cli.output import fmt_time, now_stamp, short
from corral.domain import deployments
from corral.domain.structs import DeploymentStatus
from corral.v1 import deployment_pb2, query_pb2
from corral.v1 import structs_pb2 as pb

BLOCK_MS = 2000
RPC_TIMEOUT = BLOCK_MS / 1000 + 15
HEADERS = (
    "Task Group",
    "Promoted",
    "Desired",
    "Canaries",
    "Placed",
    "Healthy",
    "Unhealthy",
    "Progress Deadline",
)


def group_rows(d: pb.Deployment) -> list[tuple[str, ...]]:
    return [
        (
            name,
            str(s.promoted).lower() if s.desired_canaries else "-",
            str(s.desired_total),
            f"{len(s.placed_canaries)}/{s.desired_canaries}" if s.desired_canaries else "0",
            str(s.placed_allocs),
            str(s.healthy_allocs),
            str(s.unhealthy_allocs),
            fmt_time(s.require_progress_by) if s.require_progress_by else "-",
        )
        for name, s in sorted(d.task_groups.items())
    ]


def _draw(out: TextIO, d: pb.Deployment) -> None:
    rows = [HEADERS, *group_rows(d)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    out.write(f"    {now_stamp()}: deployment {d.status}: {d.status_description}\n")
    for r in rows:
        out.write("    " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n")
    out.flush()


def find_deployment(
    client: Client, job_id: str, namespace: str, version: int
) -> pb.Deployment | None:
    resp = client.deployments.List(
        deployment_pb2.DeploymentListRequest(
            job_id=job_id, query=query_pb2.QueryOptions(namespace=namespace)
        ),
        timeout=RPC_TIMEOUT,
    )
    for d in resp.deployments:
        if d.job_version == version:
            return d
    return None


def monitor_deployment(
    client: Client, deployment: pb.Deployment, out: TextIO, *, verbose: bool = False
) -> int:
    out.write(f'==> {now_stamp()}: Monitoring deployment "{short(deployment.id, verbose)}"\n')
    index = 0
    last: tuple[object, ...] | None = None
    told = False  # that the canaries wait for a promotion
    while True:
        try:
            resp = client.deployments.Get(
                deployment_pb2.DeploymentGetRequest(
                    deployment_id=deployment.id,
                    query=query_pb2.QueryOptions(min_index=index, wait_ms=BLOCK_MS),
                ),
                timeout=RPC_TIMEOUT,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                continue
            raise
        index = max(index, resp.meta.index)
        d = resp.deployment
        key = (d.status, d.status_description, tuple(group_rows(d)))
        if key != last:
            last = key
            _draw(out, d)
        waiting = deployments.awaiting_promotion(d)
        if waiting and not told and _canaries_healthy(d, list(resp.allocs), waiting):
            told = True
            out.write(
                f"==> {now_stamp()}: Canaries of {', '.join(waiting)} are healthy; "
                f"promote with `corral deployment promote {short(d.id, verbose)}` "
                "(or wait for auto_promote)\n"
            )
            out.flush()
            if not _auto_promote(d):
                return 0
        if deployments.is_active(d):
            continue
        ok = d.status == DeploymentStatus.SUCCESSFUL
        out.write(
            f'==> {now_stamp()}: Deployment "{short(d.id, verbose)}" {d.status}: '
            f"{d.status_description}\n"
        )
        out.flush()
        return 0 if ok else 1


def _canaries_healthy(d: pb.Deployment, allocs: list[pb.Allocation], groups: list[str]) -> bool:
    by_id = {a.id: a for a in allocs}
    return all(
        deployments.canaries_healthy(d.task_groups[g], d.task_groups[g].desired_canaries, by_id.get)
        for g in groups
    )


def _auto_promote(d: pb.Deployment) -> bool:
    return all(d.task_groups[g].auto_promote for g in deployments.awaiting_promotion(d))


def wait_and_monitor(
    client: Client, job_id: str, namespace: str, version: int, out: TextIO, *, verbose: bool
) -> int | None:
    """Monitor the deployment of `version` and return its exit code; None
    when the scheduler made none (a job without update block, an identical
    re-registration)."""
    for _ in range(3):
        d = find_deployment(client, job_id, namespace, version)
        if d is not None:
            return monitor_deployment(client, d, out, verbose=verbose)
        time.sleep(0.2)  # the read may be served a moment behind the plan
    return None
