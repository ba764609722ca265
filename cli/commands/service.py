"""`corral service list|info|delete` (Nomad's command/service_*.go): the
catalog of Nomad-provider services the clients register. `info` also asks
each instance's client for its checks (Nomad keeps check results on the
client; reading them needs node:read to find the client, like `alloc
logs`)."""

from __future__ import annotations

import argparse
from collections import Counter

import grpc

from cli.commands import group
from cli.context import CliError, Context, common
from cli.output import kv, print_json, short, table
from corral.domain import services
from corral.v1 import alloc_pb2, node_pb2, query_pb2, service_pb2
from corral.v1 import structs_pb2 as pb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    svc = group(sub, "service", "Inspect and remove service registrations (Nomad provider)")

    p = svc.add_parser("list", help="List the registered services and their tags")
    _namespace(p)
    common(p, json=True)
    p.set_defaults(func=cmd_list)

    p = svc.add_parser("info", help="Show the instances of a service, with their checks")
    p.add_argument("service", help="service name or unique prefix")
    _namespace(p)
    p.add_argument("-tag", "--tag", default="", help="only instances with this tag")
    p.add_argument("-choose", "--choose", default="", help='"<n>|<key>": a stable subset')
    p.add_argument("-per-page", "--per-page", dest="per_page", type=int, default=0)
    p.add_argument("-page-token", "--page-token", dest="page_token", default="")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_info)

    p = svc.add_parser("delete", help="Remove one instance from the catalog by hand")
    p.add_argument("service", help="service name")
    p.add_argument("id", help="the instance's id (see service info -verbose)")
    _namespace(p)
    common(p)
    p.set_defaults(func=cmd_delete)


def _namespace(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-namespace", "--namespace", default="", help='namespace (default "default"; "*": all)'
    )


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    resp: service_pb2.ServiceListResponse = ctx.client.services.List(
        service_pb2.ServiceListRequest(query=query_pb2.QueryOptions(namespace=args.namespace)),
        timeout=30,
    )
    if args.json:
        print_json(list(resp.namespaces), ctx.out)
        return 0
    if not any(ns.services for ns in resp.namespaces):
        ctx.out.write("No service registrations found\n")
        return 0
    every = args.namespace == "*"
    rows = []
    for ns in resp.namespaces:
        for s in ns.services:
            tags = f"[{','.join(s.tags)}]"
            rows.append((s.service_name, ns.namespace, tags) if every else (s.service_name, tags))
    headers = ("Service Name", "Namespace", "Tags") if every else ("Service Name", "Tags")
    table(headers, rows, ctx.out)
    return 0


def _resolve(ctx: Context, args: argparse.Namespace) -> tuple[str, str]:
    """(namespace, name) of the service the argument names: a unique prefix
    will do, and with `-namespace '*'` the one namespace holding it."""
    resp: service_pb2.ServiceListResponse = ctx.client.services.List(
        service_pb2.ServiceListRequest(
            query=query_pb2.QueryOptions(namespace=args.namespace, prefix=args.service)
        ),
        timeout=30,
    )
    found = [(ns.namespace, s.service_name) for ns in resp.namespaces for s in ns.services]
    exact = [f for f in found if f[1] == args.service]
    if len(exact) == 1 or (len(found) == 1):
        return (exact or found)[0]
    if not found:
        raise CliError(f'No service registrations with prefix "{args.service}" found')
    names = ", ".join(f"{n} ({ns})" for ns, n in sorted(found))
    raise CliError(f"Prefix matched multiple services: {names}")


def cmd_info(args: argparse.Namespace, ctx: Context) -> int:
    namespace, name = _resolve(ctx, args)
    resp: service_pb2.ServiceGetResponse = ctx.client.services.GetService(
        service_pb2.ServiceGetRequest(
            service_name=name,
            choose=args.choose,
            tag=args.tag,
            query=query_pb2.QueryOptions(
                namespace=namespace, per_page=args.per_page, next_token=args.page_token
            ),
        ),
        timeout=30,
    )
    regs = sorted(resp.registrations, key=lambda r: (r.job_id, r.alloc_id, r.id))
    if args.json:
        print_json(list(regs), ctx.out)
        return 0
    if not regs:
        ctx.out.write("No service registrations found\n")
        return 0
    checks = _checks(ctx, regs)
    if args.verbose:
        for r in regs:
            kv(
                [
                    ("ID", r.id),
                    ("Service Name", r.service_name),
                    ("Namespace", r.namespace),
                    ("Job ID", r.job_id),
                    ("Alloc ID", r.alloc_id),
                    ("Node ID", r.node_id),
                    ("Datacenter", r.datacenter),
                    ("Address", f"{r.address}:{r.port}"),
                    ("Tags", f"[{','.join(r.tags)}]"),
                    *[(f"Meta[{k}]", v) for k, v in sorted(r.meta.items())],
                ],
                ctx.out,
            )
            results = checks.get(r.alloc_id)
            if isinstance(results, str):
                ctx.out.write(f"Checks       = {results}\n")
            elif results is not None:
                mine = [c for c in results if c.service == r.service_name]
                if mine:
                    ctx.out.write("\n")
                    table(
                        ("Check", "Mode", "Status", "Output"),
                        [(c.check, c.mode, c.status, _one_line(c.output)) for c in mine],
                        ctx.out,
                    )
            ctx.out.write("\n")
    else:
        table(
            ("Job ID", "Address", "Tags", "Node ID", "Alloc ID", "Checks"),
            [
                (
                    r.job_id,
                    _address(r),
                    f"[{','.join(r.tags)}]",
                    short(r.node_id),
                    short(r.alloc_id),
                    _summary(checks.get(r.alloc_id), r.service_name),
                )
                for r in regs
            ],
            ctx.out,
        )
    if resp.meta.next_token:
        ctx.out.write(
            f"\nResults have been paginated. To get the next page run with "
            f"-page-token {resp.meta.next_token}\n"
        )
    return 0


def _address(r: pb.ServiceRegistration) -> str:
    if not r.port:
        return r.address
    return f"[{r.address}]:{r.port}" if ":" in r.address else f"{r.address}:{r.port}"


def _one_line(text: str, limit: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _summary(results: list[pb.CheckResult] | str | None, service: str) -> str:
    """ "2 passing", "1 failing, 1 passing", "-" (no checks) or why the
    client could not be asked."""
    if results is None:
        return "-"
    if isinstance(results, str):
        return "unknown"
    mine = [c for c in results if c.service == service]
    if not mine:
        return "-"
    names = {
        services.CHECK_SUCCESS: "passing",
        services.CHECK_FAILURE: "failing",
        services.CHECK_PENDING: "pending",
    }
    counts = Counter(names.get(c.status, c.status) for c in mine)
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))


def _checks(
    ctx: Context, regs: list[pb.ServiceRegistration]
) -> dict[str, list[pb.CheckResult] | str]:
    """Each instance's alloc's check results from its client, or why they
    could not be read (the client unreachable, or no node:read)."""
    out: dict[str, list[pb.CheckResult] | str] = {}
    addresses: dict[str, str] = {}
    for r in regs:
        if r.alloc_id in out:
            continue
        try:
            if r.node_id not in addresses:
                node = ctx.client.nodes.Get(node_pb2.NodeGetRequest(node_id=r.node_id), timeout=10)
                addresses[r.node_id] = node.node.http_addr
            address = addresses[r.node_id]
            if not address:
                out[r.alloc_id] = "the node advertises no address"
                continue
            resp = ctx.client.client_alloc(address).Checks(
                alloc_pb2.AllocChecksRequest(alloc_id=r.alloc_id), timeout=10
            )
            out[r.alloc_id] = list(resp.results)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            out[r.alloc_id] = f"unknown ({code.name.lower() if code else 'error'})"
    return out


def cmd_delete(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.services.DeleteByID(
        service_pb2.ServiceDeleteByIDRequest(namespace=args.namespace, id=args.id), timeout=30
    )
    ctx.out.write("Successfully deleted service registration\n")
    return 0
