"""`corral job tag apply|unset` (Nomad 1.9's job_tag_apply and
job_tag_unset): name a version of a job, so `job revert JOB NAME` and
`job history` find it again, or take the name away. A name is unique among
the job's versions; a new version starts untagged."""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import group
from cli.context import CliError, Context, common
from cli.jobs import resolve_job
from cli.output import print_json
from corral.v1 import job_pb2, query_pb2
from corral.v1 import structs_pb2 as pb


def register(jobs: Any) -> None:
    """Add `job tag apply` and `job tag unset` under the `job` group."""
    sub = group(jobs, "tag", "Name job versions (apply, unset)")
    p = sub.add_parser(
        "apply",
        help="Tag a version of a job (the current one unless -version) with a name",
    )
    p.add_argument("job", help="job id or unique prefix")
    p.add_argument("-name", "--name", default="", help="the tag's name (required)")
    p.add_argument("-description", "--description", default="", help="what the version is")
    p.add_argument(
        "-version", "--version", type=int, default=None, help="the version (default: the current)"
    )
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True)
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("unset", help="Take a tag's name away from the job version that has it")
    p.add_argument("job", help="job id or unique prefix")
    p.add_argument("-name", "--name", default="", help="the tag's name (required)")
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True)
    p.set_defaults(func=cmd_unset)


def _name(args: argparse.Namespace) -> str:
    if not args.name:
        raise CliError("A version tag name is required (-name)")
    return str(args.name)


def cmd_apply(args: argparse.Namespace, ctx: Context) -> int:
    name = _name(args)
    if args.version is not None and args.version < 0:
        raise CliError(f"Error parsing version: {args.version} is not a version")
    job = resolve_job(ctx, args.job, args.namespace)
    resp: job_pb2.JobTagVersionResponse = ctx.client.jobs.TagVersion(
        job_pb2.JobTagVersionRequest(
            job_id=job.id,
            namespace=job.namespace,
            name=name,
            description=args.description,
            version=args.version or 0,
            latest=args.version is None,
        ),
        timeout=30,
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    ctx.out.write(f'Job version {resp.version} tagged with name "{resp.name}"\n')
    return 0


def cmd_unset(args: argparse.Namespace, ctx: Context) -> int:
    name = _name(args)
    job = resolve_job(ctx, args.job, args.namespace)
    resp: job_pb2.JobTagVersionResponse = ctx.client.jobs.TagVersion(
        job_pb2.JobTagVersionRequest(job_id=job.id, namespace=job.namespace, name=name, unset=True),
        timeout=30,
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    ctx.out.write(f'Tag "{name}" removed from job "{job.id}"\n')
    return 0


def tag_rows(v: pb.Job) -> list[tuple[str, object]]:
    """What `job history` shows of a version's tag (Nomad's)."""
    if not v.HasField("version_tag"):
        return []
    rows: list[tuple[str, object]] = [("Tag Name", v.version_tag.name)]
    if v.version_tag.description:
        rows.append(("Tag Description", v.version_tag.description))
    return rows


def version_named(ctx: Context, job: pb.Job, name: str) -> int:
    """The version of `job` tagged `name` (`job revert JOB NAME`)."""
    resp: job_pb2.JobVersionsResponse = ctx.client.jobs.Versions(
        job_pb2.JobVersionsRequest(
            job_id=job.id, query=query_pb2.QueryOptions(namespace=job.namespace)
        ),
        timeout=30,
    )
    for v in resp.versions:
        if v.version_tag.name == name:
            return int(v.version)
    raise CliError(f"Error retrieving job versions: version tag {name} not found for job {job.id}")
