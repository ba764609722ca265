"""`corral node pool apply|list|info|delete|nodes|jobs`: Nomad's node pool
commands over the state's `NodePool` service (registered under `corral
node` by `cli/commands/node.py`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.context import CliError, Context, all_pages, by_prefix, common, read_input
from cli.jobs import write_job_list
from cli.nodes import write_node_list
from cli.output import heading, kv, print_json, table
from corral.domain import object_specs
from corral.v1 import job_pb2, node_pb2, node_pool_pb2, query_pb2
from corral.v1 import structs_pb2 as pb


def register(nodes: Any) -> None:
    """Add `pool` and its subcommands to the `node` group's subparsers."""
    pools = nodes.add_parser("pool", help="Node pools").add_subparsers(
        dest="pool_command", metavar="<subcommand>"
    )
    p = pools.add_parser("apply", help="Create or update a node pool from a spec file")
    p.add_argument("input", help='a spec file: node_pool "name" { ... } (HCL); "-" = stdin')
    p.add_argument("-json", "--json", dest="json_input", action="store_true",
                   help="the spec file is Nomad's JSON (api.NodePool)")  # fmt: skip
    common(p)
    p.set_defaults(func=cmd_apply)

    p = pools.add_parser("list", help="List the node pools the token may read")
    common(p, json=True)
    p.set_defaults(func=cmd_list)

    p = pools.add_parser("info", help="Show a node pool")
    p.add_argument("pool", help="name or unique prefix")
    common(p, json=True)
    p.set_defaults(func=cmd_info)

    p = pools.add_parser("delete", help="Delete a node pool (no nodes, no live jobs)")
    p.add_argument("pool")
    common(p)
    p.set_defaults(func=cmd_delete)

    p = pools.add_parser("nodes", help="List the nodes of a node pool")
    p.add_argument("pool", help="name or unique prefix")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_nodes)

    p = pools.add_parser("jobs", help="List the jobs of a node pool")
    p.add_argument("pool", help="name or unique prefix")
    p.add_argument("-namespace", "--namespace", default="", help='the jobs\' namespace ("*" = all)')
    common(p, json=True)
    p.set_defaults(func=cmd_jobs)


def cmd_apply(args: argparse.Namespace, ctx: Context) -> int:
    text = read_input(args.input, "node pool specification")
    try:
        if args.json_input:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            pool = object_specs.node_pool_from_nomad(data)
        else:
            pool = object_specs.node_pool_from_hcl(text)
    except (ValueError, RecursionError) as exc:
        raise CliError(f"Failed to parse input content: {exc}") from None
    ctx.client.node_pools.Upsert(node_pool_pb2.NodePoolUpsertRequest(node_pools=[pool]), timeout=30)
    ctx.out.write(f'Successfully applied node pool "{pool.name}"!\n')
    return 0


def _list(ctx: Context, prefix: str = "") -> list[pb.NodePool]:
    resp = ctx.client.node_pools.List(
        node_pool_pb2.NodePoolListRequest(query=query_pb2.QueryOptions(prefix=prefix)), timeout=30
    )
    return list(resp.node_pools)


def _write_list(ctx: Context, pools: list[pb.NodePool]) -> None:
    table(("Name", "Description"), [(p.name, p.description) for p in pools], ctx.out)


def _resolve(ctx: Context, name: str) -> pb.NodePool:
    return by_prefix(_list(ctx, name), name, lambda p: p.name, "node pool")


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    pools = _list(ctx)
    if args.json:
        print_json(pools, ctx.out)
    else:
        _write_list(ctx, pools)
    return 0


def cmd_info(args: argparse.Namespace, ctx: Context) -> int:
    pool = _resolve(ctx, args.pool)
    if args.json:
        print_json(pool, ctx.out)
        return 0
    kv([("Name", pool.name), ("Description", pool.description)], ctx.out)
    heading("Metadata", ctx.out)
    if pool.meta:
        kv(sorted(pool.meta.items()), ctx.out)
    else:
        ctx.out.write("No metadata\n")
    heading("Scheduler Configuration", ctx.out)
    if pool.HasField("scheduler_config"):
        sc = pool.scheduler_config
        rows: list[tuple[str, Any]] = [("Scheduler Algorithm", sc.scheduler_algorithm)]
        if sc.HasField("memory_oversubscription_enabled"):
            rows.append(
                ("Memory Oversubscription Enabled", str(sc.memory_oversubscription_enabled).lower())
            )
        kv(rows, ctx.out)
    else:
        ctx.out.write("No scheduler configuration\n")
    return 0


def cmd_delete(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.node_pools.Delete(node_pool_pb2.NodePoolDeleteRequest(names=[args.pool]), timeout=30)
    ctx.out.write(f'Successfully deleted node pool "{args.pool}"!\n')
    return 0


def cmd_nodes(args: argparse.Namespace, ctx: Context) -> int:
    pool = _resolve(ctx, args.pool)

    def page(token: str) -> tuple[list[node_pb2.NodeListStub], str]:
        resp = ctx.client.node_pools.ListNodes(
            node_pool_pb2.NodePoolGetRequest(
                name=pool.name, query=query_pb2.QueryOptions(next_token=token, per_page=1000)
            ),
            timeout=30,
        )
        return list(resp.nodes), resp.meta.next_token

    nodes = all_pages(page)
    if args.json:
        print_json(nodes, ctx.out)
    elif not nodes:
        ctx.out.write("No nodes\n")
    else:
        write_node_list(ctx, nodes, verbose=args.verbose)
    return 0


def cmd_jobs(args: argparse.Namespace, ctx: Context) -> int:
    pool = _resolve(ctx, args.pool)

    def page(token: str) -> tuple[list[job_pb2.JobListStub], str]:
        resp = ctx.client.node_pools.ListJobs(
            node_pool_pb2.NodePoolGetRequest(
                name=pool.name,
                query=query_pb2.QueryOptions(
                    namespace=args.namespace, next_token=token, per_page=1000
                ),
            ),
            timeout=30,
        )
        return list(resp.jobs), resp.meta.next_token

    jobs = all_pages(page)
    if args.json:
        print_json(jobs, ctx.out)
    elif not jobs:
        ctx.out.write("No jobs\n")
    else:
        write_job_list(ctx, jobs)
    return 0
