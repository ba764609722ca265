"""`corral scaling policy list|info`: Nomad's scaling policy commands over
the state's `Scaling` service (the policies come from the jobs' `scaling`
blocks)."""

from __future__ import annotations

import argparse
import json

from google.protobuf import json_format

from cli.commands import group
from cli.context import Context, by_prefix, common
from cli.output import kv, print_json, short, table
from corral.v1 import query_pb2, scaling_pb2


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    scaling = group(sub, "scaling", "Scaling policies (from the jobs' scaling blocks)")
    policy = scaling.add_parser("policy", help="Scaling policies").add_subparsers(
        dest="policy_command", metavar="<subcommand>"
    )
    p = policy.add_parser("list", help="List scaling policies")
    p.add_argument("-job", "--job", default="", help="only this job's policies")
    p.add_argument(
        "-type", "--type", default="", help='only policies of this type (prefix: "horizontal")'
    )
    p.add_argument("-namespace", "--namespace", default="", help='"*" = every namespace')
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_list)

    p = policy.add_parser("info", help="Show a scaling policy and its policy document")
    p.add_argument("policy_id", help="id or unique prefix")
    p.add_argument("-namespace", "--namespace", default="", help='"*" = every namespace')
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_info)


def format_target(target: dict[str, str]) -> str:
    """Nomad's `Namespace:x,Job:y,Group:z[,Task:t]`."""
    first = [f"{k}:{target[k]}" for k in ("Namespace", "Job", "Group") if k in target]
    rest = [f"{k}:{v}" for k, v in sorted(target.items()) if k not in ("Namespace", "Job", "Group")]
    return ",".join(first + rest)


def _list(
    ctx: Context, namespace: str, *, job: str = "", kind: str = "", prefix: str = ""
) -> list[scaling_pb2.ScalingPolicyListStub]:
    resp = ctx.client.scaling.ListPolicies(
        scaling_pb2.ScalingPolicyListRequest(
            query=query_pb2.QueryOptions(namespace=namespace, prefix=prefix), job=job, type=kind
        ),
        timeout=30,
    )
    return list(resp.policies)


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    policies = _list(ctx, args.namespace, job=args.job, kind=args.type)
    if args.json:
        print_json(policies, ctx.out)
        return 0
    if not policies:
        ctx.out.write("No policies found\n")
        return 0
    policies.sort(key=lambda p: format_target(dict(p.target)))
    table(
        ("ID", "Enabled", "Type", "Target"),
        [
            (
                short(p.id, args.verbose),
                str(p.enabled).lower(),
                p.type,
                format_target(dict(p.target)),
            )
            for p in policies
        ],
        ctx.out,
    )
    return 0


def cmd_info(args: argparse.Namespace, ctx: Context) -> int:
    found = _list(ctx, args.namespace or "*", prefix=args.policy_id)
    stub = by_prefix(found, args.policy_id, lambda p: p.id, "scaling policy")
    resp = ctx.client.scaling.GetPolicy(
        scaling_pb2.ScalingPolicyGetRequest(
            id=stub.id, query=query_pb2.QueryOptions(namespace=args.namespace)
        ),
        timeout=30,
    )
    p = resp.policy
    if args.json:
        print_json(p, ctx.out)
        return 0
    kv(
        [
            ("ID", short(p.id, args.verbose)),
            ("Enabled", str(p.enabled).lower()),
            ("Target", format_target(dict(p.target))),
            ("Min", p.min),
            ("Max", p.max),
        ],
        ctx.out,
    )
    ctx.out.write("\nPolicy:\n")
    document = json_format.MessageToDict(p.policy) if p.HasField("policy") else {}
    ctx.out.write(json.dumps(document, indent=4, sort_keys=True) + "\n")
    return 0
