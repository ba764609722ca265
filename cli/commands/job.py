"""`corral job run|plan|status|stop|history|inspect|scale|dispatch|validate|revert|promote|
deployments` (`job periodic force` lives in job_periodic.py, `job tag` in job_tag.py)."""

from __future__ import annotations

import argparse
import io
import os
import shlex
import sys

import grpc

from cli.commands import action, group, job_periodic, job_tag
from cli.commands.deployment import DEPLOYMENT_HEADERS, deployment_rows, promote
from cli.context import CliError, Context, common, grpc_message
from cli.deployment_monitor import HEADERS as DEPLOYMENT_GROUP_HEADERS
from cli.deployment_monitor import group_rows
from cli.diff_output import write_job_diff
from cli.jobs import after_register, job_status, list_jobs, resolve_job, write_job_list
from cli.monitor import monitor_eval, write_placement_failure
from cli.output import fmt_ago, fmt_time, heading, join, kv, print_json, short, table
from cli.plan_output import changes, write_plan
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job, read_job_file, submission, var_inputs
from corral.domain.structs import EvalStatus
from corral.runtime import telemetry
from corral.v1 import deployment_pb2, job_pb2, query_pb2
from corral.v1 import structs_pb2 as pb

PLAN_EXIT_ERROR = 255


def _go_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "t"):
        return True
    if text.lower() in ("false", "0", "f"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _var_flags(p: argparse.ArgumentParser) -> None:
    """-var, -var-file and -hcl2-strict, as Nomad's job run/plan/validate."""
    p.add_argument(
        "-var",
        "--var",
        dest="vars",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a value for an HCL2 input variable (repeatable)",
    )
    p.add_argument(
        "-var-file",
        "--var-file",
        dest="var_files",
        action="append",
        default=[],
        metavar="PATH",
        help="an HCL or JSON file of variable values (repeatable)",
    )
    p.add_argument(
        "-hcl2-strict",
        "--hcl2-strict",
        dest="hcl2_strict",
        type=_go_bool,
        default=True,
        metavar="BOOL",
        help="a -var or var file value for an undeclared variable is an error (default true)",
    )


def _load(args: argparse.Namespace) -> pb.Job:
    return _load_with_source(args)[0]


def _load_with_source(args: argparse.Namespace) -> tuple[pb.Job, pb.JobSubmission]:
    """The job and what registering it keeps of its file (`job inspect -hcl`)."""
    inputs = var_inputs(args.vars, args.var_files, strict=args.hcl2_strict)
    text, name = read_job_file(args.file)
    return parse_job(text, name, inputs), submission(text, inputs)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    jobs = group(sub, "job", "Register, plan, inspect and stop jobs")

    p = jobs.add_parser("run", help="Register a job file and monitor its evaluation")
    p.add_argument("file", help="job file (HCL or JSON; - for stdin)")
    _var_flags(p)
    p.add_argument("-detach", "--detach", action="store_true", help="return after registering")
    p.add_argument(
        "-check-index",
        "--check-index",
        dest="check_index",
        type=int,
        default=None,
        help="register only if the job's modify index equals this (0: must not exist)",
    )
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_run)

    p = jobs.add_parser(
        "plan", help="Dry-run a job file: what would change (exit 1 if allocs change)"
    )
    p.add_argument("file")
    _var_flags(p)
    p.add_argument("-diff", "--diff", dest="diff", action="store_true", default=True)
    p.add_argument("-no-diff", "--no-diff", dest="diff", action="store_false")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_plan)

    p = jobs.add_parser("validate", help="Parse and check a job file without contacting a server")
    p.add_argument("file")
    _var_flags(p)
    p.add_argument(
        "-json", "--json", dest="json", action="store_true", help="print the job as JSON"
    )
    p.set_defaults(func=cmd_validate)

    p = jobs.add_parser("status", help="List jobs, or show one job with its allocations")
    p.add_argument("job", nargs="?", help="job id or unique prefix")
    p.add_argument("-all-allocs", "--all-allocs", dest="all_allocs", action="store_true")
    p.add_argument("-evals", "--evals", dest="evals", action="store_true")
    p.add_argument("-short", "--short", dest="short", action="store_true")
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_status)

    p = jobs.add_parser("stop", help="Stop a job (and -purge it)")
    p.add_argument("job")
    p.add_argument("-purge", "--purge", action="store_true", help="remove the job from state")
    p.add_argument("-detach", "--detach", action="store_true")
    p.add_argument(
        "-yes",
        "--yes",
        "-y",
        action="store_true",
        help="no confirmation (accepted for Nomad compatibility)",
    )
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_stop)

    p = jobs.add_parser("history", help="A job's versions (-p for the diffs between them)")
    p.add_argument("job")
    p.add_argument(
        "-p", "--p", dest="diffs", action="store_true", help="show the diff of each version"
    )
    p.add_argument("-version", "--version", dest="version", type=int, default=None)
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_history)

    p = jobs.add_parser("inspect", help="Print a job's registered specification as JSON")
    p.add_argument("job")
    p.add_argument("-version", "--version", dest="version", type=int, default=None)
    p.add_argument(
        "-hcl",
        "--hcl",
        dest="hcl",
        action="store_true",
        help="print the job file it was submitted with (not with -json)",
    )
    p.add_argument(
        "-with-vars", "--with-vars", dest="with_vars", action="store_true",
        help="with -hcl: the variable values it was submitted with too",
    )  # fmt: skip
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True)
    p.set_defaults(func=cmd_inspect)

    p = jobs.add_parser("scale", help="Change a task group's count: job scale JOB [GROUP] COUNT")
    p.add_argument("job")
    p.add_argument("args", nargs="+", metavar="[GROUP] COUNT")
    p.add_argument("-detach", "--detach", action="store_true")
    p.add_argument("-check-index", "--check-index", dest="check_index", type=int, default=None)
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_scale)

    p = jobs.add_parser(
        "revert", help="Register an earlier version again: job revert JOB VERSION|TAG"
    )
    p.add_argument("job")
    p.add_argument("version", metavar="VERSION|TAG", help="a version number or a version's tag")
    p.add_argument("-detach", "--detach", action="store_true")
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_revert)

    p = jobs.add_parser("promote", help="Promote the canaries of a job's latest deployment")
    p.add_argument("job")
    p.add_argument(
        "-group", "--group", action="append", default=[], help="only this group (repeatable)"
    )
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_promote)

    p = jobs.add_parser("deployments", help="A job's deployments, newest first")
    p.add_argument("job")
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_deployments)

    p = jobs.add_parser("dispatch", help="Dispatch an instance of a parameterized batch job")
    p.add_argument("job")
    p.add_argument("payload", nargs="?", help="payload file (- for stdin)")
    p.add_argument("-meta", "--meta", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("-id-prefix-template", "--id-prefix-template", dest="id_prefix", default="")
    p.add_argument("-detach", "--detach", action="store_true")
    p.add_argument("-namespace", "--namespace", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_dispatch)

    job_periodic.register(jobs)
    action.register_job_action(jobs)
    job_tag.register(jobs)


# ------------------------------------------------------------------ run / plan


def cmd_run(args: argparse.Namespace, ctx: Context) -> int:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, the run (the register and the
    monitoring) is one trace, which the eval's pipeline joins."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return _run(args, ctx)
    telemetry.setup_tracing("corral-cli")  # before the first channel is dialled
    try:
        with telemetry.tracer("corral.cli").start_as_current_span("corral job run") as span:
            span.set_attribute("job.file", str(args.file))
            return _run(args, ctx)
    finally:
        telemetry.shutdown_tracing()


def follow_job_region(ctx: Context, job: pb.Job) -> None:
    """A job naming its region (other than "global") is sent there, over
    -region and CORRAL_REGION, as Nomad's `job run` does."""
    if job.region and job.region != "global":
        ctx.use_region(job.region)


def _run(args: argparse.Namespace, ctx: Context) -> int:
    job, source = _load_with_source(args)
    follow_job_region(ctx, job)
    req = job_pb2.JobRegisterRequest(job=job, submission=source)
    if args.check_index is not None:
        req.enforce_index = True
        req.job_modify_index = args.check_index
    resp: job_pb2.JobRegisterResponse = ctx.client.jobs.Register(req, timeout=30)
    if args.json:
        print_json(resp, ctx.out)
        if args.detach or not resp.eval_id:
            return 0
        # -json without -detach: print the answer, then wait quietly
        ctx.out = io.StringIO()
    if job.periodic.enabled and job.HasField("periodic"):
        ctx.out.write("Job registration successful\n")
        ctx.out.write(f"Approximate next launch time: {job_periodic.next_launch_text(job)}\n")
        return 0
    if job.HasField("parameterized"):
        ctx.out.write(
            f"Job registration successful\nDispatch it with `corral job dispatch {job.id}`\n"
        )
        return 0
    if resp.warnings:
        ctx.err.write(f"Job Warnings:\n{resp.warnings}\n\n")
    return after_register(
        ctx, args, job.id, job.namespace, resp.eval_id, resp.version, resp.eval_create_index
    )


def cmd_plan(args: argparse.Namespace, ctx: Context) -> int:
    try:
        job = _load(args)
        follow_job_region(ctx, job)
        resp: job_pb2.JobPlanResponse = ctx.client.jobs.Plan(
            job_pb2.JobPlanRequest(job=job, diff=args.diff), timeout=60
        )
    except grpc.RpcError as exc:
        # Nomad's plan exits 255 on errors so that 1 can mean "changes".
        ctx.err.write(f"Error: {grpc_message(exc, ctx.address)}\n")
        return PLAN_EXIT_ERROR
    except JobspecError as exc:
        ctx.err.write(f"Error: {exc}\n")
        return PLAN_EXIT_ERROR
    if args.json:
        print_json(resp, ctx.out)
    else:
        write_plan(
            ctx.out, job, resp, filename=args.file, verbose=args.verbose, show_diff=args.diff
        )
    return 1 if changes(resp) else 0


def cmd_validate(args: argparse.Namespace, ctx: Context) -> int:
    job = _load(args)
    if args.json:
        print_json(job, ctx.out)
    else:
        ctx.out.write("Job validation successful\n")
    return 0


# ------------------------------------------------------------------ status


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    if not args.job:
        jobs = list_jobs(ctx, namespace=args.namespace)
        if args.json:
            print_json(jobs, ctx.out)
        elif not jobs:
            ctx.out.write("No running jobs\n")
        else:
            write_job_list(ctx, jobs)
        return 0
    job = resolve_job(ctx, args.job, args.namespace)
    get = job_pb2.JobGetRequest(
        job_id=job.id, query=query_pb2.QueryOptions(namespace=job.namespace)
    )
    summary = ctx.client.jobs.Summary(get, timeout=30).summary
    allocs = list(
        ctx.client.jobs.Allocations(
            job_pb2.JobGetRequest(job_id=job.id, all=args.all_allocs, query=get.query), timeout=30
        ).allocs
    )
    evals = list(ctx.client.jobs.Evaluations(get, timeout=30).evals)
    parent = job_periodic.is_periodic_parent(job)
    if args.json:
        print_json(
            {
                "job": _d(job),
                "summary": _d(summary),
                "allocations": [_d(a) for a in allocs],
                "evaluations": [_d(e) for e in evals],
                **(job_periodic.status_json(ctx, job) if parent else {}),
            },
            ctx.out,
        )
        return 0
    v = args.verbose
    kv(
        [
            ("ID", job.id),
            ("Name", job.name),
            ("Submit Date", fmt_time(job.submit_time)),
            ("Type", job.type),
            ("Priority", job.priority),
            ("Datacenters", join(job.datacenters)),
            ("Namespace", job.namespace),
            ("Node Pool", job.node_pool),
            ("Status", job_status(job.status, job.stop)),
            ("Periodic", str(job.HasField("periodic") and job.periodic.enabled).lower()),
            ("Parameterized", str(job.HasField("parameterized")).lower()),
            ("Version", job.version),
            *([("Next Periodic Launch", job_periodic.next_launch_text(job))] if parent else []),
        ],
        ctx.out,
    )
    if args.short:
        return 0
    if job.HasField("parameterized") and not job.dispatched:
        _parameterized(ctx, job)
    heading("Summary", ctx.out)
    table(
        ("Task Group", "Queued", "Starting", "Running", "Failed", "Complete", "Lost", "Unknown"),
        [
            (name, s.queued, s.starting, s.running, s.failed, s.complete, s.lost, s.unknown)
            for name, s in sorted(summary.summary.items())
        ],
        ctx.out,
    )
    blocked = [e for e in evals if e.status == EvalStatus.BLOCKED and e.failed_tg_allocs]
    if blocked:
        heading("Placement Failure", ctx.out)
        for tg, metric in sorted(blocked[0].failed_tg_allocs.items()):
            write_placement_failure(ctx.out, tg, metric, indent="")
    if parent:
        job_periodic.write_children(ctx, job)
        return 0
    if args.evals:
        heading("Evaluations", ctx.out)
        _eval_table(ctx, evals, v)
    _latest_deployment(ctx, job, v)
    heading("Allocations", ctx.out)
    if not allocs:
        ctx.out.write("No allocations placed\n")
    else:
        _alloc_table(ctx, allocs, v)
    return 0


def _parameterized(ctx: Context, job: pb.Job) -> None:
    """A parameterized parent: what a dispatch must give, and its children
    (ids `<job>/dispatch-...`), as Nomad's job status shows them."""
    p = job.parameterized
    heading("Parameterized Job", ctx.out)
    kv(
        [
            ("Payload", p.payload or "optional"),
            ("Required Metadata", join(p.meta_required)),
            ("Optional Metadata", join(p.meta_optional)),
        ],
        ctx.out,
    )
    children = [
        j
        for j in list_jobs(ctx, prefix=f"{job.id}/dispatch-", namespace=job.namespace)
        if j.namespace == job.namespace
    ]
    heading("Dispatched Jobs", ctx.out)
    if not children:
        ctx.out.write("No dispatched instances of parameterized job found\n")
        return
    table(
        ("ID", "Status"),
        [(j.id, job_status(j.status, j.stop)) for j in sorted(children, key=lambda j: j.id)],
        ctx.out,
    )


def _latest_deployment(ctx: Context, job: pb.Job, verbose: bool) -> None:
    """Nomad's "Latest Deployment" section of `job status`."""
    resp: deployment_pb2.DeploymentListResponse = ctx.client.deployments.List(
        deployment_pb2.DeploymentListRequest(
            # newest first: the state lists oldest first, as Nomad
            job_id=job.id,
            query=query_pb2.QueryOptions(namespace=job.namespace, reverse=True),
        ),
        timeout=30,
    )
    if not resp.deployments:
        return
    d = resp.deployments[0]
    heading("Latest Deployment", ctx.out)
    kv(
        [
            ("ID", short(d.id, verbose)),
            ("Job Version", d.job_version),
            ("Status", d.status),
            ("Description", d.status_description),
        ],
        ctx.out,
    )
    ctx.out.write("\n")
    table(DEPLOYMENT_GROUP_HEADERS, group_rows(d), ctx.out)


def _d(m: object) -> dict[str, object]:
    from cli.output import to_dict

    return to_dict(m)  # type: ignore[arg-type]


def _alloc_table(ctx: Context, allocs: list[pb.Allocation], verbose: bool) -> None:
    allocs = sorted(allocs, key=lambda a: a.create_index, reverse=True)
    table(
        ("ID", "Node ID", "Task Group", "Version", "Desired", "Status", "Created", "Modified"),
        [
            (
                short(a.id, verbose),
                short(a.node_id, verbose),
                a.task_group,
                a.job_version,
                a.desired_status,
                a.client_status,
                fmt_ago(a.create_time),
                fmt_ago(a.modify_time),
            )
            for a in allocs
        ],
        ctx.out,
    )


def _eval_table(ctx: Context, evals: list[pb.Evaluation], verbose: bool) -> None:
    table(
        ("ID", "Priority", "Triggered By", "Status", "Placement Failures"),
        [
            (
                short(e.id, verbose),
                e.priority,
                e.triggered_by,
                e.status,
                str(bool(e.failed_tg_allocs)).lower(),
            )
            for e in sorted(evals, key=lambda e: e.create_index, reverse=True)
        ],
        ctx.out,
    )


# ------------------------------------------------------------------ stop / scale / dispatch


def cmd_stop(args: argparse.Namespace, ctx: Context) -> int:
    job = resolve_job(ctx, args.job, args.namespace)
    resp: job_pb2.JobDeregisterResponse = ctx.client.jobs.Deregister(
        job_pb2.JobDeregisterRequest(job_id=job.id, namespace=job.namespace, purge=args.purge),
        timeout=30,
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    if not resp.eval_id:
        ctx.out.write(f'Job "{job.id}" {"purged" if args.purge else "stopped"}\n')
        return 0
    if args.detach:
        ctx.out.write(f"Evaluation ID: {resp.eval_id}\n")
        return 0
    return monitor_eval(
        ctx.client, resp.eval_id, ctx.out, verbose=args.verbose, min_index=resp.eval_create_index
    ).exit_code


def cmd_scale(args: argparse.Namespace, ctx: Context) -> int:
    job = resolve_job(ctx, args.job, args.namespace)
    if len(args.args) == 1:
        if len(job.task_groups) != 1:
            names = ", ".join(tg.name for tg in job.task_groups)
            raise CliError(f'job "{job.id}" has several groups ({names}); name the one to scale')
        group_name, count_text = job.task_groups[0].name, args.args[0]
    elif len(args.args) == 2:
        group_name, count_text = args.args
    else:
        raise CliError("usage: corral job scale JOB [GROUP] COUNT")
    try:
        count = int(count_text)
    except ValueError:
        raise CliError(f"count must be a whole number, got {count_text!r}") from None
    if count < 0:
        raise CliError("count must not be negative")
    req = job_pb2.JobScaleRequest(
        job_id=job.id,
        namespace=job.namespace,
        group=group_name,
        count=count,
        message="scaled with corral job scale",
    )
    if args.check_index is not None:
        req.enforce_index = True
        req.job_modify_index = args.check_index
    resp: job_pb2.JobRegisterResponse = ctx.client.jobs.Scale(req, timeout=30)
    if args.json:
        print_json(resp, ctx.out)
        return 0
    return after_register(
        ctx, args, job.id, job.namespace, resp.eval_id, resp.version, resp.eval_create_index
    )


def cmd_dispatch(args: argparse.Namespace, ctx: Context) -> int:
    meta: dict[str, str] = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"-meta expects KEY=VALUE, got {item!r}")
        meta[key] = value
    payload = b""
    if args.payload == "-":
        payload = sys.stdin.buffer.read()
    elif args.payload:
        try:
            with open(args.payload, "rb") as fh:
                payload = fh.read()
        except OSError as exc:
            raise CliError(f"cannot read payload {args.payload}: {exc.strerror}") from None
    resp: job_pb2.JobDispatchResponse = ctx.client.jobs.Dispatch(
        job_pb2.JobDispatchRequest(
            job_id=args.job,
            namespace=args.namespace,
            payload=payload,
            meta=meta,
            id_prefix_template=args.id_prefix,
        ),
        timeout=30,
    )
    if args.json:
        print_json(resp, ctx.out)
        if args.detach or not resp.eval_id:
            return 0
        ctx.out = io.StringIO()  # -json without -detach: print the answer, then wait quietly
    ctx.out.write(
        f"Dispatched Job ID = {resp.dispatched_job_id}\nEvaluation ID     = {resp.eval_id}\n\n"
    )
    return after_register(
        ctx, args, resp.dispatched_job_id, args.namespace, resp.eval_id, 0, resp.eval_create_index
    )


# ------------------------------------------------------------------ history / inspect


def _versions(ctx: Context, job: pb.Job, diffs: bool) -> job_pb2.JobVersionsResponse:
    resp: job_pb2.JobVersionsResponse = ctx.client.jobs.Versions(
        job_pb2.JobVersionsRequest(
            job_id=job.id, diffs=diffs, query=query_pb2.QueryOptions(namespace=job.namespace)
        ),
        timeout=30,
    )
    return resp


def cmd_history(args: argparse.Namespace, ctx: Context) -> int:
    job = resolve_job(ctx, args.job, args.namespace)
    resp = _versions(ctx, job, args.diffs)
    # diffs[i] compares versions[i] with the version before it (newest first)
    pairs: list[tuple[pb.Job, job_pb2.JobDiff | None]] = [
        (v, resp.diffs[i] if i < len(resp.diffs) else None) for i, v in enumerate(resp.versions)
    ]
    if args.version is not None:
        pairs = [(v, d) for v, d in pairs if v.version == args.version]
        if not pairs:
            raise CliError(f'job "{job.id}" has no version {args.version}')
    if args.json:
        if args.diffs:
            print_json(
                {
                    "versions": [_d(v) for v, _ in pairs],
                    "diffs": [_d(d) for _, d in pairs if d is not None],
                },
                ctx.out,
            )
        else:
            print_json([v for v, _ in pairs], ctx.out)
        return 0
    for i, (v, d) in enumerate(pairs):
        if i:
            ctx.out.write("\n")
        rows: list[tuple[str, object]] = [
            ("Version", v.version),
            ("Stable", str(v.stable).lower()),
            ("Submit Date", fmt_time(v.submit_time)),
            *job_tag.tag_rows(v),
        ]
        changed = args.diffs and d is not None and d.type and d.type != "None"
        if changed:
            rows.append(("Diff", ""))
        kv(rows, ctx.out)
        if changed:
            assert d is not None
            write_job_diff(ctx.out, d, job.id, verbose=False)
    return 0


def cmd_revert(args: argparse.Namespace, ctx: Context) -> int:
    job = resolve_job(ctx, args.job, args.namespace)
    # a number is a version, anything else a version's tag (Nomad)
    given = str(args.version)
    version = int(given) if given.isdigit() else job_tag.version_named(ctx, job, given)
    resp: job_pb2.JobRegisterResponse = ctx.client.jobs.Revert(
        job_pb2.JobRevertRequest(job_id=job.id, namespace=job.namespace, version=version),
        timeout=30,
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    ctx.out.write(f'Job "{job.id}" reverted to version {version} as version {resp.version}\n')
    return after_register(
        ctx, args, job.id, job.namespace, resp.eval_id, resp.version, resp.eval_create_index
    )


def cmd_promote(args: argparse.Namespace, ctx: Context) -> int:
    job = resolve_job(ctx, args.job, args.namespace)
    resp: deployment_pb2.DeploymentListResponse = ctx.client.deployments.List(
        deployment_pb2.DeploymentListRequest(
            # newest first: the state lists oldest first, as Nomad
            job_id=job.id,
            query=query_pb2.QueryOptions(namespace=job.namespace, reverse=True),
        ),
        timeout=30,
    )
    if not resp.deployments:
        raise CliError(f'job "{job.id}" has no deployment')
    latest = resp.deployments[0]
    answer = promote(ctx, latest.id, args.group)
    if args.json:
        print_json(answer, ctx.out)
        return 0
    ctx.out.write(f'Deployment "{short(latest.id, args.verbose)}" promoted\n')
    if answer.eval_id:
        ctx.out.write(f'Evaluation "{short(answer.eval_id, args.verbose)}" created\n')
    return 0


def cmd_deployments(args: argparse.Namespace, ctx: Context) -> int:
    job = resolve_job(ctx, args.job, args.namespace)
    resp: deployment_pb2.DeploymentListResponse = ctx.client.deployments.List(
        deployment_pb2.DeploymentListRequest(
            # newest first: the state lists oldest first, as Nomad
            job_id=job.id,
            query=query_pb2.QueryOptions(namespace=job.namespace, reverse=True),
        ),
        timeout=30,
    )
    if args.json:
        print_json(list(resp.deployments), ctx.out)
        return 0
    if not resp.deployments:
        ctx.out.write(f'No deployments found for job "{job.id}"\n')
        return 0
    table(DEPLOYMENT_HEADERS, deployment_rows(list(resp.deployments), args.verbose), ctx.out)
    return 0


def cmd_inspect(args: argparse.Namespace, ctx: Context) -> int:
    if args.hcl and args.json:
        raise CliError("-json and -hcl cannot be used together")
    if args.with_vars and not args.hcl:
        raise CliError("-with-vars can only be used with -hcl")
    job = resolve_job(ctx, args.job, args.namespace)
    if args.hcl:
        return _inspect_source(ctx, job, args.version, args.with_vars)
    if args.version is not None and args.version != job.version:
        match = [v for v in _versions(ctx, job, False).versions if v.version == args.version]
        if not match:
            raise CliError(f'job "{job.id}" has no version {args.version}')
        job = match[0]
    # Nomad prints the job as JSON; the output is a valid job file for `job run`.
    print_json({"job": _d(job)}, ctx.out)
    return 0


def _inspect_source(ctx: Context, job: pb.Job, version: int | None, with_vars: bool) -> int:
    """Nomad's `job inspect -hcl [-with-vars]`: the file as submitted on
    standard output; with -with-vars, how to run it again with the values it
    was submitted with, on standard error (as Nomad prints it)."""
    req = job_pb2.JobSubmissionRequest(
        job_id=job.id, query=query_pb2.QueryOptions(namespace=job.namespace)
    )
    if version is not None:
        req.version = version
    sub = ctx.client.jobs.GetSubmission(req, timeout=30).submission
    ctx.out.write(sub.source if sub.source.endswith("\n") else sub.source + "\n")
    if with_vars:
        args: list[str] = []  # the file names its namespace
        for name, value in sorted(sub.variable_flags.items()):
            args += ["-var", f"{name}={value}"]
        for line in sub.variables.splitlines():
            name, eq, value = line.partition("=")
            if eq and name.strip():
                args += ["-var", f"{name.strip()}={value.strip()}"]
        run = " ".join(shlex.quote(a) for a in [*args, "-"])
        ctx.err.write(
            "\nTo run this job as originally submitted:\n\n"
            f"$ corral job inspect -namespace {shlex.quote(job.namespace)} -hcl "
            f"{shlex.quote(job.id)} |\n    corral job run {run}\n"
        )
    return 0


__all__ = ["register"]
