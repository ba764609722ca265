"""`corral node meta apply|read`: a node's dynamic metadata (Nomad's `nomad
node meta`), read from and applied by the node's agent, which registers
the node again with it (services/agent/node_meta.py).

Nomad's CLI talks to a local agent and defaults to its node; Corral's talks
to the servers, so without `-node-id` it takes the cluster's only node
(a `corral dev` cluster) and asks for `-node-id` when there are more."""

from __future__ import annotations

import argparse
from typing import Any

import grpc

from cli.commands import not_found
from cli.context import CliError, Context, common
from cli.output import heading, kv, print_json
from corral.domain import node_meta
from corral.v1 import node_pb2, query_pb2


def register(nodes: Any) -> None:
    meta = nodes.add_parser("meta", help="Read or apply a node's dynamic metadata").add_subparsers(
        dest="meta_command", metavar="<subcommand>"
    )
    p = meta.add_parser(
        "apply",
        help="Set dynamic metadata (key=value ...) and unset keys (-unset k1,k2) on a node",
    )
    p.add_argument("pairs", nargs="*", metavar="key=value")
    p.add_argument(
        "-node-id", "--node-id", dest="node_id", default="", help="the node (id or prefix)"
    )
    p.add_argument(
        "-unset", "--unset", dest="unset", default="", help="comma-separated keys to unset"
    )
    common(p)
    p.set_defaults(func=cmd_apply)

    p = meta.add_parser("read", help="Show a node's metadata: all, dynamic and static")
    p.add_argument(
        "-node-id", "--node-id", dest="node_id", default="", help="the node (id or prefix)"
    )
    common(p, json=True)
    p.set_defaults(func=cmd_read)


def _agent(ctx: Context, node_id: str) -> tuple[str, str]:
    """The node's full id and its agent's address."""
    if not node_id:
        listed = ctx.client.nodes.List(
            node_pb2.NodeListRequest(query=query_pb2.QueryOptions(per_page=2)), timeout=30
        )
        if len(listed.nodes) != 1:
            raise CliError(
                "name the node with -node-id (Corral's CLI talks to the servers, not to a "
                "local agent: it defaults only to a cluster's only node)"
            )
        node_id = listed.nodes[0].id
    try:
        node = ctx.client.nodes.Get(node_pb2.NodeGetRequest(node_id=node_id), timeout=30).node
    except grpc.RpcError as exc:
        if not not_found(exc):
            raise
        raise CliError(
            f'no node with id or prefix "{node_id}" (see `corral node status`)'
        ) from None
    if not node.http_addr:
        raise CliError(f'node "{node.id[:8]}" does not advertise an address to reach its agent')
    return node.id, node.http_addr


def changes(pairs: list[str], unset: str) -> tuple[dict[str, str], list[str]]:
    """Nomad's parsing: `k=v` sets, a bare `k` sets "", -unset names keys to unset."""
    sets: dict[str, str] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        sets[key] = value
    unsets = [k for k in unset.split(",") if k]
    for key in unsets:
        sets.pop(key, None)
    return sets, unsets


def cmd_apply(args: argparse.Namespace, ctx: Context) -> int:
    if not args.unset and not args.pairs:
        raise CliError("Must specify -unset or at least 1 key=value pair")
    sets, unsets = changes(args.pairs, args.unset)
    node_id, address = _agent(ctx, args.node_id)
    ctx.client.client_node(address).ApplyMeta(
        node_pb2.NodeMetaApplyRequest(node_id=node_id, meta=sets, unset=unsets), timeout=30
    )
    return 0


def cmd_read(args: argparse.Namespace, ctx: Context) -> int:
    node_id, address = _agent(ctx, args.node_id)
    resp = ctx.client.client_node(address).ReadMeta(
        node_pb2.NodeMetaReadRequest(node_id=node_id), timeout=30
    )
    body = node_meta.nomad_json(resp)
    if args.json:
        print_json(body)
        return 0
    print("All Meta")
    kv(sorted(body["Meta"].items()))
    heading("Dynamic Meta")
    kv([(k, "<unset>" if v is None else v) for k, v in sorted(body["Dynamic"].items())])
    heading("Static Meta")
    kv(sorted(body["Static"].items()))
    return 0
