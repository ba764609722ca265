"""`corral server members|join|force-leave`: the state servers of every
region this one knows and the health of the links to them (Nomad's
`server members`), joining another region at run time and forgetting one
(Nomad's `server join` / `server force-leave`)."""

from __future__ import annotations

import argparse

from cli.commands import group
from cli.context import CliError, Context, common
from cli.output import fmt_ago, heading, print_json, table
from corral.v1 import federation_pb2


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    srv = group(sub, "server", "The state servers of every region, and joining regions")

    p = srv.add_parser("members", help="The state servers of this region and every region it knows")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_members)

    p = srv.add_parser(
        "join", help="Join the regions whose state servers listen at the given addresses"
    )
    p.add_argument("addresses", nargs="+", metavar="HOST:PORT")
    common(p)
    p.set_defaults(func=cmd_join)

    p = srv.add_parser("force-leave", help="Forget a region joined at run time")
    p.add_argument("name", metavar="REGION", help="the region, or one of its servers' names")
    common(p)
    p.set_defaults(func=cmd_force_leave)


def _port(address: str) -> str:
    return address.rpartition(":")[2]


def show_links(status: federation_pb2.FederationStatus, ctx: Context) -> None:
    """The links of the region that answered, with their health."""
    if not status.links:
        return
    heading(f"Links from region {status.region}", ctx.out)
    table(
        ("Region", "Status", "Source", "Addresses", "Last Contact", "Error"),
        [
            (
                link.region or "<unknown>",
                link.status,
                link.source,
                ",".join(link.addresses),
                fmt_ago(link.last_contact),
                link.last_error or "-",
            )
            for link in status.links
        ],
        ctx.out,
    )


def replication_line(r: federation_pb2.ReplicationStatus) -> str:
    """One line on ACL replication from the authoritative region."""
    if not r.enabled:
        return "ACL replication: not running (this region is authoritative, or ACLs are off)"
    line = f"ACL replication from region {r.source_region}: {r.status}"
    if r.last_success:
        line += (
            f", last success {fmt_ago(r.last_success)} "
            f"(policies index {r.policies_index}, tokens index {r.tokens_index}, "
            f"roles index {r.roles_index})"
        )
    if r.status == "failed" and r.last_error:
        line += f"; last error {fmt_ago(r.last_error_time)}: {r.last_error}"
    return line


def cmd_members(args: argparse.Namespace, ctx: Context) -> int:
    status = ctx.client.federation.Status(federation_pb2.FederationStatusRequest(), timeout=30)
    if args.json:
        print_json(status, ctx.out)
        return 0
    table(
        ("Name", "Address", "Port", "Status", "Leader", "Build", "Datacenter", "Region"),
        [
            (
                s.name,
                s.address.rpartition(":")[0],
                _port(s.address),
                s.status,
                str(s.leader).lower(),
                s.version or "1",
                "dc1",
                s.region,
            )
            for s in status.servers
        ],
        ctx.out,
    )
    show_links(status, ctx)
    if args.verbose or status.acl_replication.enabled:
        ctx.out.write("\n" + replication_line(status.acl_replication) + "\n")
    return 0


def cmd_join(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.federation.Join(
        federation_pb2.FederationJoinRequest(addresses=args.addresses), timeout=60
    )
    if not resp.joined:
        raise CliError(f"Error joining: {resp.error or 'no address answered'}")
    regions = ", ".join(resp.regions)
    ctx.out.write(f"Joined {resp.joined} servers successfully (region {regions})\n")
    if resp.error:
        ctx.err.write(f"Warning: {resp.error}\n")
    return 0


def cmd_force_leave(args: argparse.Namespace, ctx: Context) -> int:
    region = args.name.rpartition(".")[2]
    ctx.client.federation.ForceLeave(
        federation_pb2.FederationForceLeaveRequest(region=region), timeout=30
    )
    ctx.out.write(f"Region {region} forgotten\n")
    return 0
