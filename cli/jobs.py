"""What the commands about jobs share (cli/commands/job.py,
job_periodic.py, node_pool.py): finding a job by id or prefix, listing jobs
page by page and as Nomad's table, and following a registration to its end
(the eval, the placements, the deployment) unless `-detach`."""

from __future__ import annotations

import argparse

import grpc

from cli.commands import not_found
from cli.context import CliError, Context
from cli.deployment_monitor import wait_and_monitor
from cli.monitor import monitor_eval, monitor_placements
from cli.output import fmt_time, table
from corral.v1 import job_pb2, query_pb2
from corral.v1 import structs_pb2 as pb


def resolve_job(ctx: Context, job_id: str, namespace: str = "") -> pb.Job:
    """The job with this id, or the only job whose id starts with it."""
    try:
        resp = ctx.client.jobs.Get(
            job_pb2.JobGetRequest(job_id=job_id, query=query_pb2.QueryOptions(namespace=namespace)),
            timeout=30,
        )
        return resp.job
    except grpc.RpcError as exc:
        if not not_found(exc):
            raise
    matches = list_jobs(ctx, prefix=job_id, namespace=namespace)
    if len(matches) == 1:
        return resolve_job(ctx, matches[0].id, matches[0].namespace)
    if not matches:
        raise CliError(f'no job with id or prefix "{job_id}" (see `corral job status`)')
    ids = ", ".join(m.id for m in matches[:10])
    raise CliError(f'prefix "{job_id}" matched {len(matches)} jobs ({ids}); give more of the id')


def list_jobs(ctx: Context, *, prefix: str = "", namespace: str = "") -> list[job_pb2.JobListStub]:
    """Every page of Job.List."""
    out: list[job_pb2.JobListStub] = []
    token = ""
    while True:
        resp = ctx.client.jobs.List(
            job_pb2.JobListRequest(
                query=query_pb2.QueryOptions(
                    prefix=prefix, next_token=token, namespace=namespace, per_page=500
                )
            ),
            timeout=30,
        )
        out.extend(resp.jobs)
        token = resp.meta.next_token
        if not token:
            return out


def after_register(
    ctx: Context,
    args: argparse.Namespace,
    job_id: str,
    namespace: str,
    eval_id: str,
    version: int | None,
    eval_index: int,
) -> int:
    """Shared tail of run/scale/stop/dispatch: monitor unless -detach."""
    if not eval_id:
        ctx.out.write(f'Job "{job_id}" registered (periodic or parameterized: no evaluation)\n')
        return 0
    if args.detach:
        ctx.out.write(f"Evaluation ID: {eval_id}\n")
        return 0
    result = monitor_eval(
        ctx.client, eval_id, ctx.out, verbose=getattr(args, "verbose", False), min_index=eval_index
    )
    if result.exit_code == 1 or version is None:
        return result.exit_code
    code = monitor_placements(
        ctx.client,
        job_id,
        namespace,
        version,
        ctx.out,
        expect_full=not result.placement_failures,
    )
    if result.exit_code:
        return result.exit_code
    # a deployment's verdict decides (a failed alloc may be replaced or reverted)
    verdict = wait_and_monitor(
        ctx.client, job_id, namespace, version, ctx.out, verbose=getattr(args, "verbose", False)
    )
    return code if verdict is None else verdict


def job_status(status: str, stop: bool) -> str:
    """A job's status as the job commands show it."""
    return f"{status} (stopped)" if stop and status != "dead" else status


def write_job_list(ctx: Context, jobs: list[job_pb2.JobListStub]) -> None:
    """Nomad's job list table (with a Namespace column when several show)."""
    several = len({j.namespace for j in jobs}) > 1
    headers: list[str] = ["ID", "Namespace", "Type", "Priority", "Status", "Submit Date"]
    rows: list[list[object]] = [
        [
            j.id,
            j.namespace,
            j.type,
            j.priority,
            job_status(j.status, j.stop),
            fmt_time(j.submit_time),
        ]
        for j in jobs
    ]
    if not several:
        headers.pop(1)
        for r in rows:
            r.pop(1)
    table(headers, rows, ctx.out)
