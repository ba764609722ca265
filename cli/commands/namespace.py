"""`corral namespace apply|list|status|inspect|delete`: Nomad's namespace
commands over the state's `Namespace` service."""

from __future__ import annotations

import argparse
import json
import os

import grpc

from cli.commands import group, not_found
from cli.context import CliError, Context, by_prefix, common, read_input
from cli.output import heading, kv, print_json, table
from corral.domain import object_specs
from corral.v1 import namespace_pb2, query_pb2
from corral.v1 import structs_pb2 as pb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    namespaces = group(sub, "namespace", "Namespaces: create, list, inspect and delete them")

    p = namespaces.add_parser(
        "apply",
        help="Create or update a namespace from a spec file (HCL, or JSON with -json), "
        "or by name with -description/-meta",
    )
    p.add_argument("input", help="a namespace name, or a spec file ('-' = stdin)")
    p.add_argument("-description", "--description", default=None)
    p.add_argument(
        "-meta",
        "--meta",
        dest="meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a metadata entry (repeatable; with a name, not a file)",
    )
    p.add_argument(
        "-quota", "--quota", default=None, help="refused: quotas are not supported by Corral"
    )
    p.add_argument("-json", "--json", dest="json_input", action="store_true",
                   help="the spec file is Nomad's JSON (api.Namespace)")  # fmt: skip
    common(p)
    p.set_defaults(func=cmd_apply)

    p = namespaces.add_parser("list", help="List the namespaces the token may see")
    common(p, json=True)
    p.set_defaults(func=cmd_list)

    for name, what in (("status", "Show a namespace"), ("inspect", "A namespace as JSON")):
        p = namespaces.add_parser(name, help=what)
        p.add_argument("namespace", help="name or unique prefix")
        common(p, json=name == "status")
        p.set_defaults(func=cmd_status, inspect=name == "inspect")

    p = namespaces.add_parser("delete", help="Delete a namespace (it must hold no live jobs)")
    p.add_argument("namespace")
    common(p)
    p.set_defaults(func=cmd_delete)


def _meta(entries: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise CliError(f"-meta {entry!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _from_file(args: argparse.Namespace) -> pb.Namespace:
    text = read_input(args.input, "namespace specification")
    try:
        if args.json_input:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            return object_specs.namespace_from_nomad(data)
        return object_specs.namespace_from_hcl(text)
    except (ValueError, RecursionError) as exc:
        raise CliError(f"error parsing namespace specification: {exc}") from None


def cmd_apply(args: argparse.Namespace, ctx: Context) -> int:
    if args.quota is not None:
        raise CliError("-quota: namespace quotas are not supported by Corral")
    if args.input == "-" or os.path.isfile(args.input):
        if args.description is not None or args.meta:
            ctx.err.write("Flags are ignored when a file is specified!\n")
        ns = _from_file(args)
    else:
        ns = _current(ctx, args.input) or pb.Namespace(name=args.input)
        if args.description is not None:
            ns.description = args.description
        ns.meta.update(_meta(args.meta))
    ctx.client.namespaces.Upsert(namespace_pb2.NamespaceUpsertRequest(namespaces=[ns]), timeout=30)
    ctx.out.write(f'Successfully applied namespace "{ns.name}"!\n')
    return 0


def _current(ctx: Context, name: str) -> pb.Namespace | None:
    try:
        resp = ctx.client.namespaces.Get(namespace_pb2.NamespaceGetRequest(name=name), timeout=30)
    except grpc.RpcError as exc:
        if not_found(exc):
            return None
        raise
    found: pb.Namespace = resp.namespace
    found.create_index = found.modify_index = 0
    return found


def _list(ctx: Context, prefix: str = "") -> list[pb.Namespace]:
    resp = ctx.client.namespaces.List(
        namespace_pb2.NamespaceListRequest(query=query_pb2.QueryOptions(prefix=prefix)), timeout=30
    )
    return list(resp.namespaces)


def write_list(ctx: Context, namespaces: list[pb.Namespace]) -> None:
    if not namespaces:
        ctx.out.write("No namespaces found\n")
        return
    table(("Name", "Description"), [(n.name, n.description) for n in namespaces], ctx.out)


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    namespaces = _list(ctx)
    if args.json:
        print_json(namespaces, ctx.out)
    else:
        write_list(ctx, namespaces)
    return 0


def _resolve(ctx: Context, name: str) -> pb.Namespace:
    return by_prefix(_list(ctx, name), name, lambda n: n.name, "namespace")


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    ns = _resolve(ctx, args.namespace)
    if args.inspect or getattr(args, "json", False):
        print_json(ns, ctx.out)
        return 0
    caps = ns.capabilities
    kv(
        [
            ("Name", ns.name),
            ("Description", ns.description),
            ("Quota", ""),
            ("Enabled Drivers", ",".join(caps.enabled_task_drivers) or "*"),
            ("Disabled Drivers", ",".join(caps.disabled_task_drivers)),
            ("Enabled Network Modes", ",".join(caps.enabled_network_modes) or "*"),
            ("Disabled Network Modes", ",".join(caps.disabled_network_modes)),
        ],
        ctx.out,
    )
    if ns.meta:
        heading("Metadata", ctx.out)
        kv(sorted(ns.meta.items()), ctx.out)
    if ns.HasField("node_pool_config"):
        cfg = ns.node_pool_config
        heading("Node Pool Configuration", ctx.out)
        rows: list[tuple[str, str]] = [("Default", cfg.default or "default")]
        if cfg.HasField("allowed"):
            rows.append(("Allowed", ", ".join(cfg.allowed.values)))
        if cfg.HasField("denied"):
            rows.append(("Denied", ", ".join(cfg.denied.values)))
        kv(rows, ctx.out)
    return 0


def cmd_delete(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.namespaces.Delete(
        namespace_pb2.NamespaceDeleteRequest(names=[args.namespace]), timeout=30
    )
    ctx.out.write(f'Successfully deleted namespace "{args.namespace}"!\n')
    return 0
