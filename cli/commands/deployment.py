"""`corral deployment list|status|promote|fail|pause|resume|set-health`.

`unblock` (multi-region deployments) does not exist: Corral has one region."""

from __future__ import annotations

import argparse

from cli.commands import group
from cli.context import Context, common
from cli.deployment_monitor import HEADERS, group_rows, monitor_deployment
from cli.output import heading, kv, print_json, short, table
from corral.v1 import deployment_pb2, query_pb2
from corral.v1 import structs_pb2 as pb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    deps = group(sub, "deployment", "Inspect and control deployments")

    p = deps.add_parser("list", help="List deployments (newest first)")
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_list)

    p = deps.add_parser("status", help="Show one deployment and its task groups")
    p.add_argument("deployment", help="deployment id or unique prefix")
    p.add_argument("-monitor", "--monitor", action="store_true", help="follow it until it ends")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_status)

    p = deps.add_parser("promote", help="Promote a deployment's healthy canaries")
    p.add_argument("deployment", help="deployment id or unique prefix")
    p.add_argument(
        "-group", "--group", action="append", default=[], help="only this group (repeatable)"
    )
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_promote)

    p = deps.add_parser(
        "set-health", help="Set allocs of a deployment healthy or unhealthy (manual health)"
    )
    p.add_argument("deployment", help="deployment id or unique prefix")
    p.add_argument("-healthy", "--healthy", action="append", default=[], metavar="ALLOC_ID")
    p.add_argument("-unhealthy", "--unhealthy", action="append", default=[], metavar="ALLOC_ID")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_set_health)

    for name, help_text, func in (
        ("fail", "Mark a deployment failed (auto_revert then reverts the job)", cmd_fail),
        ("pause", "Pause a running deployment", cmd_pause),
        ("resume", "Resume a paused deployment", cmd_resume),
    ):
        p = deps.add_parser(name, help=help_text)
        p.add_argument("deployment", help="deployment id or unique prefix")
        common(p, json=True, verbose=True)
        p.set_defaults(func=func)


def deployment_rows(deps: list[pb.Deployment], verbose: bool) -> list[tuple[object, ...]]:
    return [
        (
            short(d.id, verbose),
            d.job_id,
            d.job_version,
            d.status,
            d.status_description,
        )
        for d in deps
    ]


DEPLOYMENT_HEADERS = ("ID", "Job ID", "Job Version", "Status", "Description")


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    resp: deployment_pb2.DeploymentListResponse = ctx.client.deployments.List(
        deployment_pb2.DeploymentListRequest(
            # the state lists oldest first, as Nomad; the command shows the newest first
            query=query_pb2.QueryOptions(namespace=args.namespace, reverse=True)
        ),
        timeout=30,
    )
    if args.json:
        print_json(list(resp.deployments), ctx.out)
        return 0
    if not resp.deployments:
        ctx.out.write("No deployments found\n")
        return 0
    table(DEPLOYMENT_HEADERS, deployment_rows(list(resp.deployments), args.verbose), ctx.out)
    return 0


def write_status(ctx: Context, d: pb.Deployment, verbose: bool) -> None:
    kv(
        [
            ("ID", short(d.id, verbose)),
            ("Job ID", d.job_id),
            ("Job Version", d.job_version),
            ("Status", d.status),
            ("Description", d.status_description),
        ],
        ctx.out,
    )
    ctx.out.write("\n")
    heading("Deployed", ctx.out)
    table(HEADERS, group_rows(d), ctx.out)


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    resp: deployment_pb2.DeploymentGetResponse = ctx.client.deployments.Get(
        deployment_pb2.DeploymentGetRequest(deployment_id=args.deployment), timeout=30
    )
    if args.json:
        print_json(resp.deployment, ctx.out)
        return 0
    if args.monitor:
        return monitor_deployment(ctx.client, resp.deployment, ctx.out, verbose=args.verbose)
    write_status(ctx, resp.deployment, args.verbose)
    return 0


def _answer(
    ctx: Context, args: argparse.Namespace, resp: deployment_pb2.DeploymentUpdateResponse, what: str
) -> int:
    if args.json:
        print_json(resp, ctx.out)
        return 0
    ctx.out.write(f'Deployment "{args.deployment}" {what}\n')
    if resp.reverted:
        ctx.out.write(f"Job reverted: registered again as version {resp.reverted_job_version}\n")
    if resp.eval_id:
        ctx.out.write(f'Evaluation "{short(resp.eval_id, args.verbose)}" created\n')
    return 0


def promote(
    ctx: Context, deployment_id: str, groups: list[str]
) -> deployment_pb2.DeploymentUpdateResponse:
    resp: deployment_pb2.DeploymentUpdateResponse = ctx.client.deployments.Promote(
        deployment_pb2.DeploymentPromoteRequest(
            deployment_id=deployment_id, groups=groups, all=not groups
        ),
        timeout=30,
    )
    return resp


def cmd_promote(args: argparse.Namespace, ctx: Context) -> int:
    resp = promote(ctx, args.deployment, args.group)
    return _answer(ctx, args, resp, "promoted")


def cmd_set_health(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.deployments.SetAllocHealth(
        deployment_pb2.DeploymentAllocHealthRequest(
            deployment_id=args.deployment,
            healthy_alloc_ids=args.healthy,
            unhealthy_alloc_ids=args.unhealthy,
        ),
        timeout=30,
    )
    return _answer(ctx, args, resp, "alloc health set")


def cmd_fail(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.deployments.Fail(
        deployment_pb2.DeploymentFailRequest(deployment_id=args.deployment), timeout=30
    )
    return _answer(ctx, args, resp, "marked as failed")


def cmd_pause(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.deployments.Pause(
        deployment_pb2.DeploymentPauseRequest(deployment_id=args.deployment, pause=True),
        timeout=30,
    )
    return _answer(ctx, args, resp, "paused")


def cmd_resume(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.deployments.Pause(
        deployment_pb2.DeploymentPauseRequest(deployment_id=args.deployment, pause=False),
        timeout=30,
    )
    return _answer(ctx, args, resp, "resumed")
