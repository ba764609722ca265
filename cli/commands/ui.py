"""`corral ui` (Nomad's `nomad ui`): open the web UI, or one job's,
allocation's or node's page in it, in the default browser.

The CLI speaks gRPC to the state; the UI is the gateway's, at its own HTTP
address (`-http-addr`, CORRAL_HTTP_ADDR, default `corral dev`'s). With
`-authenticate` the CLI makes a one-time token for its own ACL token and
adds it to the address as `?ott=`; the UI exchanges it for the token and
keeps that (services/gateway/ui/static/app.js), so the real secret never
goes into a URL. The one-time secret is printed only by `-show-url`, or
when there is no browser to open the address with (a server, a
container), since the address is then the whole point of the command.
"""

from __future__ import annotations

import argparse
import os
import urllib.parse
import webbrowser

from cli.client import DEFAULT_HTTP_PORT, ENV_HTTP_ADDR
from cli.context import CliError, Context, common
from cli.jobs import list_jobs
from corral.v1 import acl_pb2, alloc_pb2, node_pb2, query_pb2

DEFAULT_HTTP_ADDR = f"http://127.0.0.1:{DEFAULT_HTTP_PORT}"
#: how many matches of a prefix are worth naming in an error
_SHOWN = 10


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "ui",
        help="Open the web UI in the default browser",
        description="Open the web UI in the default browser; with an identifier (a job, "
        "allocation or node id, or a unique prefix of one), that object's page.",
    )
    common(p)
    p.add_argument(
        "-http-addr",
        "--http-addr",
        dest="http_addr",
        default=None,
        help=f"the gateway's HTTP address (env {ENV_HTTP_ADDR}, default {DEFAULT_HTTP_ADDR})",
    )
    p.add_argument("-namespace", "--namespace", default="", help="the namespace of a job's page")
    p.add_argument(
        "-authenticate",
        "--authenticate",
        action="store_true",
        help="sign the UI in with your ACL token, through a one-time token (ACLs on)",
    )
    p.add_argument(
        "-show-url",
        "--show-url",
        dest="show_url",
        action="store_true",
        help="print the UI's address instead of opening it",
    )
    p.add_argument("identifier", nargs="?", default="", help="a job, allocation or node id")
    p.set_defaults(func=cmd_ui)


def ui_address(flag: str | None) -> str:
    """The gateway's base URL: `-http-addr`, CORRAL_HTTP_ADDR or the default
    (a bare host:port is taken as http://)."""
    address = (flag or os.environ.get(ENV_HTTP_ADDR) or DEFAULT_HTTP_ADDR).rstrip("/")
    if "://" not in address:
        address = "http://" + address
    parsed = urllib.parse.urlsplit(address)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise CliError(f"-http-addr {address!r} is not an http(s) address")
    return address


def _matches(ctx: Context, prefix: str, namespace: str) -> dict[str, list[str]]:
    """The ids starting with `prefix` of each kind the UI has a page for."""
    query = query_pb2.QueryOptions(prefix=prefix, namespace=namespace, per_page=_SHOWN)
    jobs = [j.id for j in list_jobs(ctx, prefix=prefix, namespace=namespace)]
    allocs = ctx.client.allocs.List(alloc_pb2.AllocListRequest(query=query), timeout=30).allocs
    nodes = ctx.client.nodes.List(node_pb2.NodeListRequest(query=query), timeout=30).nodes
    return {"jobs": jobs, "allocations": [a.id for a in allocs], "nodes": [n.id for n in nodes]}


def object_path(ctx: Context, identifier: str, namespace: str) -> str:
    """The UI page of the one object `identifier` names (Nomad's `nomad ui
    <identifier>`: an exact id wins, else the prefix must be unique)."""
    found = _matches(ctx, identifier, namespace)
    exact = [kind for kind, ids in found.items() if identifier in ids]
    hits = [(kind, ids[0]) for kind, ids in found.items() if len(ids) == 1]
    if len(exact) == 1:
        kind, full = exact[0], identifier
    elif len(hits) == 1 and all(len(ids) <= 1 for ids in found.values()):
        kind, full = hits[0]
    elif not any(found.values()):
        raise CliError(f'no job, allocation or node with id or prefix "{identifier}"')
    else:
        listed = "; ".join(f"{kind}: {', '.join(ids)}" for kind, ids in found.items() if ids)
        raise CliError(f'multiple matches for "{identifier}" ({listed}); give more of the id')
    quoted = urllib.parse.quote(full, safe="")
    return {"jobs": "/ui/jobs/", "allocations": "/ui/allocations/", "nodes": "/ui/nodes/"}[
        kind
    ] + quoted


def cmd_ui(args: argparse.Namespace, ctx: Context) -> int:
    path = object_path(ctx, args.identifier, args.namespace) if args.identifier else "/ui/"
    params = {"namespace": args.namespace} if args.namespace else {}
    url = ui_address(args.http_addr) + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    secret = ""
    if args.authenticate:
        made = ctx.client.acl.UpsertOneTimeToken(acl_pb2.ACLUpsertOneTimeTokenRequest(), timeout=30)
        secret = made.one_time_token.one_time_secret_id
    full = url
    if secret:
        full += ("&" if params else "?") + urllib.parse.urlencode({"ott": secret})
    if args.show_url:
        ctx.out.write(f"URL for web UI: {full}\n")
        return 0
    ctx.out.write(f'Opening URL "{url}"' + (" with one-time token" if secret else "") + "\n")
    if not webbrowser.open(full):
        ctx.out.write(f"No browser to open it with here; the address is: {full}\n")
    return 0
