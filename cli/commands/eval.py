"""`corral eval list|status`."""

from __future__ import annotations

import argparse

from cli.commands import group
from cli.context import Context, common
from cli.monitor import write_placement_failure
from cli.output import fmt_time, heading, kv, print_json, short, table
from corral.v1 import eval_pb2, query_pb2
from corral.v1 import structs_pb2 as pb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    evals = group(sub, "eval", "Inspect evaluations")

    p = evals.add_parser("list", help="List evaluations (newest first, paginated)")
    p.add_argument("-job", "--job", dest="job", default="", help="only evals of this job")
    p.add_argument(
        "-status",
        "--status",
        dest="status",
        default="",
        help="pending, blocked, complete, failed, canceled",
    )
    p.add_argument("-triggered-by", "--triggered-by", dest="triggered_by", default="")
    p.add_argument("-per-page", "--per-page", dest="per_page", type=int, default=0)
    p.add_argument("-page-token", "--page-token", dest="page_token", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_list)

    p = evals.add_parser(
        "status", help="Show one evaluation, its related evals and placement failures"
    )
    p.add_argument("eval", help="eval id or unique prefix")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_status)


def eval_rows(evals: list[pb.Evaluation], verbose: bool) -> list[tuple[object, ...]]:
    return [
        (
            short(e.id, verbose),
            e.priority,
            e.triggered_by,
            e.job_id,
            e.namespace,
            short(e.node_id, verbose) if e.node_id else "<none>",
            e.status,
            str(bool(e.failed_tg_allocs)).lower(),
        )
        for e in evals
    ]


EVAL_HEADERS = (
    "ID",
    "Priority",
    "Triggered By",
    "Job ID",
    "Namespace",
    "Node ID",
    "Status",
    "Placement Failures",
)


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    resp: eval_pb2.EvalListResponse = ctx.client.evals.List(
        eval_pb2.EvalListRequest(
            query=query_pb2.QueryOptions(per_page=args.per_page, next_token=args.page_token),
            job_id=args.job,
            status=args.status,
            triggered_by=args.triggered_by,
        ),
        timeout=30,
    )
    if args.json:
        print_json(list(resp.evals), ctx.out)
        return 0
    if not resp.evals:
        ctx.out.write("No evals found\n")
    else:
        table(EVAL_HEADERS, eval_rows(list(resp.evals), args.verbose), ctx.out)
    if resp.meta.next_token:
        ctx.out.write(
            "\nResults have been paginated. To get the next page run:\n\n"
            f"corral eval list -page-token {resp.meta.next_token}"
            + (f" -per-page {args.per_page}" if args.per_page else "")
            + "\n"
        )
    return 0


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    resp: eval_pb2.EvalGetResponse = ctx.client.evals.Get(
        eval_pb2.EvalGetRequest(eval_id=args.eval, include_related=True), timeout=30
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    e = resp.eval
    v = args.verbose
    pairs: list[tuple[str, object]] = [
        ("ID", short(e.id, v)),
        ("Create Time", fmt_time(e.create_time)),
        ("Modify Time", fmt_time(e.modify_time)),
        ("Status", e.status),
        ("Status Description", e.status_description or "<none>"),
        ("Type", e.type),
        ("TriggeredBy", e.triggered_by),
        ("Job ID", e.job_id),
        ("Namespace", e.namespace),
        ("Priority", e.priority),
        ("Placement Failures", str(bool(e.failed_tg_allocs)).lower()),
        ("Previous Eval", short(e.previous_eval, v) or "<none>"),
        ("Next Eval", short(e.next_eval, v) or "<none>"),
        ("Blocked Eval", short(e.blocked_eval, v) or "<none>"),
    ]
    if e.node_id:
        pairs.insert(8, ("Node ID", short(e.node_id, v)))
    if e.wait_until:
        pairs.append(("Wait Until", fmt_time(e.wait_until)))
    kv(pairs, ctx.out)
    if resp.related:
        heading("Related Evaluations", ctx.out)
        rel = []
        for r in resp.related:
            how = (
                "previous"
                if r.id == e.previous_eval
                else "next"
                if r.id == e.next_eval
                else "blocked"
                if r.id == e.blocked_eval
                else "related"
            )
            rel.append((short(r.id, v), how, r.triggered_by, r.status))
        table(("ID", "Relation", "Triggered By", "Status"), rel, ctx.out)
    if e.queued_allocations:
        heading("Queued Allocations", ctx.out)
        table(("Task Group", "Queued"), sorted(e.queued_allocations.items()), ctx.out)
    if resp.allocs:
        heading("Placed Allocations", ctx.out)
        table(
            ("ID", "Node ID", "Task Group", "Desired", "Status"),
            [
                (
                    short(a.id, v),
                    short(a.node_id, v),
                    a.task_group,
                    a.desired_status,
                    a.client_status,
                )
                for a in resp.allocs
            ],
            ctx.out,
        )
    if e.failed_tg_allocs:
        heading("Failed Placements", ctx.out)
        for tg, metric in sorted(e.failed_tg_allocs.items()):
            write_placement_failure(ctx.out, tg, metric, indent="")
        if e.blocked_eval:
            ctx.out.write(
                f'\nEvaluation "{short(e.blocked_eval, v)}" waiting for additional capacity '
                "to place remainder\n"
            )
    return 0
