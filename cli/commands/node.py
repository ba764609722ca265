"""`corral node status|drain|eligibility`, `node pool ...`
(`cli/commands/node_pool.py`) and `node meta ...` (`cli/commands/node_meta.py`)."""

from __future__ import annotations

import argparse

import grpc

from cli.commands import group, node_meta, node_pool, not_found
from cli.context import CliError, Context, common
from cli.nodes import write_node_list
from cli.output import fmt_ago, fmt_time, heading, join, kv, print_json, short, table, to_dict
from corral.domain.jobspec.duration import format_duration, parse_duration
from corral.domain.structs import Eligibility
from corral.v1 import node_pb2, query_pb2
from corral.v1 import structs_pb2 as pb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    nodes = group(sub, "node", "Inspect client nodes, drain them, toggle eligibility")

    p = nodes.add_parser("status", help="List nodes, or show one node with its allocations")
    p.add_argument("node", nargs="?", help="node id or unique prefix")
    p.add_argument(
        "-allocs", "--allocs", dest="allocs", action="store_true", help="count running allocs"
    )
    p.add_argument(
        "-status", "--status", dest="status", default="", help="only nodes with this status"
    )
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_status)

    p = nodes.add_parser("drain", help="Start (-enable) or stop (-disable) draining a node")
    p.add_argument("node")
    p.add_argument("-enable", "--enable", action="store_true")
    p.add_argument("-disable", "--disable", action="store_true")
    p.add_argument(
        "-deadline", "--deadline", default="1h", help='time to finish draining (default "1h")'
    )
    p.add_argument("-no-deadline", "--no-deadline", dest="no_deadline", action="store_true")
    p.add_argument("-force", "--force", action="store_true", help="stop every alloc now")
    p.add_argument("-ignore-system", "--ignore-system", dest="ignore_system", action="store_true")
    p.add_argument(
        "-keep-ineligible", "--keep-ineligible", dest="keep_ineligible", action="store_true"
    )
    p.add_argument("-m", "--message", dest="message", default="")
    p.add_argument(
        "-detach", "--detach", action="store_true", help="accepted; draining is not monitored"
    )
    p.add_argument("-yes", "--yes", "-y", action="store_true")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_drain)

    p = nodes.add_parser(
        "eligibility", help="Mark a node eligible (-enable) or ineligible (-disable)"
    )
    p.add_argument("node")
    p.add_argument("-enable", "--enable", action="store_true")
    p.add_argument("-disable", "--disable", action="store_true")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_eligibility)

    node_pool.register(nodes)
    node_meta.register(nodes)


def list_nodes(ctx: Context, *, prefix: str = "", status: str = "") -> list[node_pb2.NodeListStub]:
    out: list[node_pb2.NodeListStub] = []
    token = ""
    while True:
        resp = ctx.client.nodes.List(
            node_pb2.NodeListRequest(
                query=query_pb2.QueryOptions(prefix=prefix, next_token=token, per_page=1000),
                status=status,
            ),
            timeout=30,
        )
        out.extend(resp.nodes)
        token = resp.meta.next_token
        if not token:
            return out


def resolve_node(ctx: Context, node_id: str) -> pb.Node:
    try:
        return ctx.client.nodes.Get(node_pb2.NodeGetRequest(node_id=node_id), timeout=30).node
    except grpc.RpcError as exc:
        if not not_found(exc):
            raise
    raise CliError(f'no node with id or prefix "{node_id}" (see `corral node status`)')


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    v = args.verbose
    if not args.node:
        nodes = list_nodes(ctx, status=args.status)
        if args.json:
            print_json(nodes, ctx.out)
        elif not nodes:
            ctx.out.write("No nodes registered\n")
        else:
            write_node_list(ctx, nodes, verbose=v, allocs=args.allocs)
        return 0
    node = resolve_node(ctx, args.node)
    allocs = list(
        # every alloc the node ran, completed and failed ones too, as Nomad's
        ctx.client.nodes.Allocations(
            node_pb2.NodeGetRequest(node_id=node.id, all=True), timeout=30
        ).allocs
    )
    if args.json:
        data = to_dict(node)
        data.pop("secret_id", None)
        print_json({"node": data, "allocations": [to_dict(a) for a in allocs]}, ctx.out)
        return 0
    r = node.node_resources
    drain = "false"
    if node.drain:
        drain = "true"
        if node.drain_strategy.force_deadline:
            drain += f"; deadline {fmt_time(node.drain_strategy.force_deadline)}"
    kv(
        [
            ("ID", node.id if v else short(node.id)),
            ("Name", node.name),
            ("Node Pool", node.node_pool),
            ("Class", node.node_class or "<none>"),
            ("DC", node.datacenter),
            ("Drain", drain),
            ("Eligibility", node.scheduling_eligibility),
            ("Status", node.status),
            ("Address", node.http_addr or "<none>"),
            (
                "Drivers",
                join(
                    sorted(d for d, info in node.drivers.items() if info.detected and info.healthy)
                ),
            ),
            ("Host Volumes", join(sorted(node.host_volumes))),
            ("Resources", f"cpu {r.cpu} MHz, memory {r.memory_mb} MiB, disk {r.disk_mb} MiB"),
            ("Status Changed", fmt_ago(node.status_updated_at)),
        ],
        ctx.out,
    )
    if v and node.host_volumes:
        heading("Host Volumes", ctx.out)
        table(
            ("Name", "ReadOnly", "Source"),
            [
                (name, str(hv.read_only).lower(), hv.path)
                for name, hv in sorted(node.host_volumes.items())
            ],
            ctx.out,
        )
    if node.events:
        heading("Node Events", ctx.out)
        table(
            ("Time", "Subsystem", "Message"),
            [
                (fmt_time(e.timestamp), e.subsystem, e.message)
                for e in list(node.events)[-10:][::-1]
            ],
            ctx.out,
        )
    if v and node.attributes:
        heading("Attributes", ctx.out)
        kv(sorted(node.attributes.items()), ctx.out)
    if node.meta:
        heading("Meta", ctx.out)
        kv(sorted(node.meta.items()), ctx.out)
    heading("Allocations", ctx.out)
    if not allocs:
        ctx.out.write("No allocations placed\n")
    else:
        table(
            ("ID", "Job ID", "Task Group", "Version", "Desired", "Status", "Created", "Modified"),
            [
                (
                    short(a.id, v),
                    a.job_id,
                    a.task_group,
                    a.job_version,
                    a.desired_status,
                    a.client_status,
                    fmt_ago(a.create_time),
                    fmt_ago(a.modify_time),
                )
                for a in sorted(allocs, key=lambda a: a.create_index, reverse=True)
            ],
            ctx.out,
        )
    return 0


def _enable_disable(args: argparse.Namespace) -> bool:
    if args.enable == args.disable:
        raise CliError("give exactly one of -enable or -disable")
    return bool(args.enable)


def cmd_drain(args: argparse.Namespace, ctx: Context) -> int:
    enable = _enable_disable(args)
    node = resolve_node(ctx, args.node)
    req = node_pb2.NodeUpdateDrainRequest(node_id=node.id, meta_message=args.message)
    if enable:
        if args.force:
            deadline = -1
        elif args.no_deadline:
            deadline = 0
        else:
            try:
                deadline = parse_duration(args.deadline)
            except ValueError as exc:
                raise CliError(f"-deadline: {exc}") from None
            if deadline <= 0:
                raise CliError("-deadline must be positive (use -force to drain at once)")
        req.drain_strategy.CopyFrom(
            pb.DrainStrategy(
                deadline=deadline,
                ignore_system_jobs=args.ignore_system,
            )
        )
    else:
        req.mark_eligible = not args.keep_ineligible
    resp = ctx.client.nodes.UpdateDrain(req, timeout=30)
    if args.json:
        print_json(resp, ctx.out)
        return 0
    if enable:
        how = (
            "at once"
            if args.force
            else (
                "without deadline"
                if args.no_deadline
                else f"within {format_duration(req.drain_strategy.deadline)}"
            )
        )
        ctx.out.write(f'Node "{short(node.id, args.verbose)}" drain strategy set ({how})\n')
    else:
        ctx.out.write(f'Node "{short(node.id, args.verbose)}" drain strategy unset\n')
    return 0


def cmd_eligibility(args: argparse.Namespace, ctx: Context) -> int:
    enable = _enable_disable(args)
    node = resolve_node(ctx, args.node)
    value = Eligibility.ELIGIBLE if enable else Eligibility.INELIGIBLE
    resp = ctx.client.nodes.UpdateEligibility(
        node_pb2.NodeUpdateEligibilityRequest(node_id=node.id, eligibility=value), timeout=30
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    ctx.out.write(f'Node "{short(node.id, args.verbose)}" scheduling eligibility set: {value}\n')
    return 0
