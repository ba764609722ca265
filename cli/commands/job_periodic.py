"""`corral job periodic force`, and what `job run` and `job status` show of
a periodic job: its next launch and its children (Nomad's job_periodic_force
and the periodic parts of job_run and job_status)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from cli.commands import group
from cli.context import Context, common
from cli.jobs import after_register, list_jobs, resolve_job
from cli.output import fmt_time, heading, print_json, table
from corral.domain import periodic
from corral.domain.jobspec.duration import format_duration
from corral.v1 import job_pb2, periodic_pb2, periodic_pb2_grpc
from corral.v1 import structs_pb2 as pb


def register(jobs: Any) -> None:
    """Add `job periodic force` under the `job` group's subparsers."""
    sub = group(jobs, "periodic", "Interact with periodic jobs")
    p = sub.add_parser(
        "force", help="Launch a periodic job now, whatever its cron spec and prohibit_overlap"
    )
    p.add_argument("job", help="job id or unique prefix")
    p.add_argument("-detach", "--detach", action="store_true", help="return after launching")
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_force)


def cmd_force(args: argparse.Namespace, ctx: Context) -> int:
    job = resolve_job(ctx, args.job, args.namespace)
    stub = periodic_pb2_grpc.PeriodicStub(ctx.client.channel())
    resp: periodic_pb2.PeriodicForceResponse = stub.Force(
        periodic_pb2.PeriodicForceRequest(job_id=job.id, namespace=job.namespace), timeout=60
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    if args.detach:
        ctx.out.write(f"Job {resp.child_job_id!r} launched\nEvaluation ID: {resp.eval_id}\n")
        return 0
    ctx.out.write(f'Launched job "{resp.child_job_id}"\n')
    return after_register(
        ctx, args, resp.child_job_id, job.namespace, resp.eval_id, 0, resp.eval_create_index
    )


def next_launch_text(job: pb.Job, now: datetime | None = None) -> str:
    """`<time> (<in how long> from now)`, or why there is none."""
    if job.stop:
        return "none (job stopped)"
    now = now or datetime.now(UTC)
    upcoming = periodic.next_launch(job.periodic, now)
    if upcoming is None:
        return "none"
    ahead = int((upcoming - now).total_seconds()) * 1_000_000_000
    return f"{fmt_time(periodic.to_unix_ns(upcoming))} ({format_duration(ahead)} from now)"


def is_periodic_parent(job: pb.Job) -> bool:
    return job.HasField("periodic") and job.periodic.enabled and not job.HasField("parameterized")


def children(ctx: Context, job: pb.Job) -> list[job_pb2.JobListStub]:
    """The launched children still in state, oldest first."""
    found = list_jobs(ctx, prefix=job.id + periodic.LAUNCH_SUFFIX, namespace=job.namespace)
    return sorted((c for c in found if c.parent_id == job.id), key=lambda c: c.create_index)


def status_json(ctx: Context, job: pb.Job) -> dict[str, Any]:
    """Extra keys of `job status -json` for a periodic parent."""
    upcoming = None if job.stop else periodic.next_launch(job.periodic, datetime.now(UTC))
    return {
        "next_periodic_launch": periodic.to_unix_ns(upcoming) if upcoming else 0,
        "children": [{"id": c.id, "status": c.status} for c in children(ctx, job)],
    }


def write_children(ctx: Context, job: pb.Job) -> None:
    heading("Previously Launched Jobs", ctx.out)
    kids = children(ctx, job)
    if not kids:
        ctx.out.write("No instances of periodic job found\n")
        return
    table(("ID", "Status"), [(c.id, c.status) for c in kids], ctx.out)
