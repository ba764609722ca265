"""`corral var get|put|list|purge|lock|init`: Nomad Variables, with
`nomad var`'s arguments, flags and output (docs/cli.md, docs/variables.md).

Output formats default as Nomad's: a table (get, list) or nothing but a
line (put) on a terminal, JSON when the output is redirected."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cli.commands import group
from cli.context import CliError, Context, common
from cli.output import fmt_time, table
from cli.var_lock import DEFAULT_MAX_RETRY, Lease, child_command, run_locked
from cli.var_spec import (
    FORMATS_IN,
    OUT_FORMATS,
    apply_pairs,
    as_json,
    check_out,
    default_out,
    format_of,
    parse_spec,
    render,
    render_template,
)
from corral.domain import variables as nomad_json
from corral.domain.jobspec.duration import format_duration, parse_duration
from corral.v1 import query_pb2, variables_pb2
from corral.v1 import structs_pb2 as pb

WILDCARD = 'The wildcard namespace ("*") is not valid for this command.'
HCL_SPEC = """\
# A variable specification for `corral var put @spec.nv.hcl`.
#
# path and namespace may be given here or on the command line (the command
# line wins); only items is required: the keys and values stored, encrypted
# together, in the variable.
#
# path      = "path/to/variable"
# namespace = "default"
#
# Keys may hold dots, but templates read keys without them more easily.

items {
  key1 = "value 1"
  key2 = "value 2"
}
"""
JSON_SPEC = """\
{
  "Namespace": "default",
  "Path": "path/to/variable",
  "Items": {
    "key1": "value 1",
    "key2": "value 2"
  }
}
"""


def _namespace_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-namespace",
        "--namespace",
        default=os.environ.get("CORRAL_NAMESPACE", ""),
        help='the variable\'s namespace (env CORRAL_NAMESPACE; default "default")',
    )


def _out_flags(p: argparse.ArgumentParser, formats: str) -> None:
    p.add_argument("-out", "--out", dest="out", default=None, help=f"output format: {formats}")
    p.add_argument("-template", "--template", dest="template", default="", help="Go template")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    var = group(sub, "var", "Interact with variables")

    p = var.add_parser("get", help="Read a variable")
    p.add_argument("path")
    p.add_argument("-item", "--item", default=None, help="print only this item's value")
    _out_flags(p, "go-template, hcl, json, none, table")
    _namespace_flag(p)
    common(p)
    p.set_defaults(func=cmd_get)

    p = var.add_parser("put", help="Create or update a variable")
    p.add_argument("args", nargs="+", metavar="<path | @spec | -> [@spec | -] [key=value ...]")
    p.add_argument("-check-index", "--check-index", dest="check_index", default=None)
    p.add_argument("-force", "--force", action="store_true", help="write whatever is stored")
    p.add_argument("-in", "--in", dest="fmt_in", default="json", help="spec format: hcl, json")
    p.add_argument("-verbose", "--verbose", action="store_true")
    _out_flags(p, "go-template, hcl, json, none, table")
    _namespace_flag(p)
    common(p)
    p.set_defaults(func=cmd_put)

    p = var.add_parser("list", help="List variable metadata")
    p.add_argument("prefix", nargs="?", default="")
    p.add_argument("-per-page", "--per-page", dest="per_page", type=int, default=0)
    p.add_argument("-page-token", "--page-token", dest="page_token", default="")
    _out_flags(p, "go-template, json, table, terse")
    _namespace_flag(p)
    common(p)
    p.set_defaults(func=cmd_list)

    p = var.add_parser("purge", help="Purge a variable")
    p.add_argument("path")
    p.add_argument("-check-index", "--check-index", dest="check_index", default=None)
    _namespace_flag(p)
    common(p)
    p.set_defaults(func=cmd_purge)

    p = var.add_parser("lock", help="Hold a lock on a variable while running a command")
    p.add_argument("args", nargs="*", metavar="<path | @spec> [@spec] child...")
    p.add_argument("-ttl", "--ttl", default="", help="lock TTL (default 15s)")
    p.add_argument("-delay", "--delay", default="", help="lock delay (default 15s)")
    p.add_argument(
        "-max-retry", "--max-retry", dest="max_retry", type=int, default=DEFAULT_MAX_RETRY
    )
    p.add_argument("-early-return", "--early-return", dest="early_return", action="store_true")
    p.add_argument("-backoff", "--backoff", default="", help="wait between attempts (1.1 TTL)")
    p.add_argument(
        "-shell", "--shell", default="true", choices=("true", "false"), help="run in $SHELL"
    )
    p.add_argument("-in", "--in", dest="fmt_in", default="json")
    p.add_argument("-verbose", "--verbose", action="store_true")
    _namespace_flag(p)
    common(p)
    p.set_defaults(func=cmd_lock)

    p = var.add_parser("init", help="Write an example variable specification")
    p.add_argument("filename", nargs="?", default="")
    p.add_argument("-out", "--out", dest="out", default="hcl", choices=FORMATS_IN)
    p.add_argument("-quiet", "--quiet", action="store_true")
    p.set_defaults(func=cmd_init)


#: `var lock` flags that take a value (the child's own flags must not be
#: read as ours: the first argument that is not one of ours starts it)
_LOCK_VALUE_FLAGS = frozenset(
    {"ttl", "delay", "max-retry", "backoff", "shell", "in", "namespace", "address", "token",
     "ca-file", "cert-file", "key-file", "region"}
)  # fmt: skip


def split_child(argv: list[str]) -> tuple[list[str], list[str]]:
    """For `var lock`: (what our parser reads, the child command). The
    path and an optional @spec end our part, as Nomad reads it; other
    commands are returned whole."""
    if argv[:2] != ["var", "lock"]:
        return argv, []
    i = 2
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        name = argv[i].lstrip("-").split("=", 1)[0]
        takes_value = name in _LOCK_VALUE_FLAGS and "=" not in argv[i]
        i += 2 if takes_value else 1
    ours = i + 1  # the path (or the @spec)
    if ours < len(argv) and argv[ours].startswith("@"):
        ours += 1
    return argv[:ours], argv[ours:]


def _ns(args: argparse.Namespace) -> str:
    if args.namespace == "*":
        raise CliError(WILDCARD)
    return str(args.namespace or "")


def _check_index(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise CliError(f"Invalid -check-index value {raw!r}: not parsable as uint64") from None
    if not 0 <= value < 2**64:
        raise CliError(f"Invalid -check-index value {raw!r}: out of range for uint64")
    return value


def _conflict(check: int, resp: variables_pb2.VariablesApplyResponse) -> CliError:
    current = resp.conflict.metadata
    updated = (
        f" The server-side item was last updated on {fmt_time(current.modify_time)}."
        if current.modify_index
        else ""
    )
    return CliError(
        f"Check-and-Set conflict: your provided check-index ({check}) does not match the "
        f"server-side index ({current.modify_index}).{updated} If you are sure you want to "
        f"perform this operation, add the -force or -check-index={current.modify_index} flag "
        "before the positional arguments."
    )


# -------------------------------------------------------------------- get


def cmd_get(args: argparse.Namespace, ctx: Context) -> int:
    fmt = args.out or default_out("table", "json", ctx.out)
    check_out(fmt, args.template, OUT_FORMATS)
    resp = ctx.client.variables.Read(
        variables_pb2.VariablesReadRequest(
            path=args.path.strip(" /"), query=query_pb2.QueryOptions(namespace=_ns(args))
        ),
        timeout=30,
    )
    if not resp.found:
        raise CliError("Variable not found")
    if args.item is not None:
        if args.item not in resp.variable.items:
            raise CliError(f'Variable does not contain "{args.item}" item')
        ctx.out.write(resp.variable.items[args.item])
        return 0
    render(resp.variable, fmt, args.template, ctx.out)
    return 0


# -------------------------------------------------------------------- put


def _load(arg: str, fmt_in: str, ctx: Context, used: list[bool]) -> tuple[pb.Variable, str]:
    if arg == "-":
        used[0] = True
        return parse_spec(sys.stdin.read(), fmt_in)
    path = arg[1:]
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"Error reading {path!r}: {exc.strerror}") from None
    return parse_spec(text, format_of(path))


def _is_spec(arg: str) -> bool:
    return arg == "-" or (arg.startswith("@") and not arg.startswith("\\@"))


def build_variable(
    args: list[str], namespace: str, fmt_in: str, ctx: Context, used: list[bool]
) -> tuple[pb.Variable, str, list[str]]:
    """Nomad's var put / var lock arguments: (variable, namespace, the rest)."""
    if fmt_in not in FORMATS_IN:
        raise CliError('Invalid value for "-in"; valid values are [hcl, json]')
    first, rest = args[0], list(args[1:])
    path = ""
    spec: tuple[pb.Variable, str] | None = None
    if _is_spec(first):
        spec = _load(first, fmt_in, ctx, used)
    else:
        path = first.strip().strip("/")
        if rest and _is_spec(rest[0]):
            spec = _load(rest.pop(0), fmt_in, ctx, used)
    v, spec_ns = spec if spec is not None else (pb.Variable(metadata=pb.VariableMetadata()), "")
    reset = False
    if path and path != v.metadata.path:
        v.metadata.path, reset = path, True
    chosen = namespace or spec_ns or "default"
    if spec_ns and namespace and namespace != spec_ns:
        reset = True
    if reset:
        for field in ("create_index", "modify_index", "create_time", "modify_time"):
            setattr(v.metadata, field, 0)
    if not v.metadata.path:
        raise CliError("Failed to parse variable data: the variable has no path")
    return v, chosen, rest


def cmd_put(args: argparse.Namespace, ctx: Context) -> int:
    fmt = args.out or default_out("none", "json", ctx.out)
    check_out(fmt, args.template, OUT_FORMATS)
    check = _check_index(args.check_index)
    namespace = _ns(args)
    if len(args.args) == 1 and not _is_spec(args.args[0]):
        raise CliError("Must supply data")
    used = [False]
    v, namespace, pairs = build_variable(args.args, namespace, args.fmt_in, ctx, used)

    def verbose(msg: str) -> None:
        if args.verbose:
            ctx.err.write(msg + "\n")

    verbose(f'Writing to path "{v.metadata.path}"')
    warnings = apply_pairs(v, pairs, sys.stdin, used)
    if check is not None:
        v.metadata.modify_index = check
    op = "set" if args.force else "cas"
    resp = ctx.client.variables.Apply(
        variables_pb2.VariablesApplyRequest(op=op, variable=v, namespace=namespace), timeout=30
    )
    if resp.result != "ok":
        raise _conflict(v.metadata.modify_index, resp)
    for w in warnings:
        ctx.err.write(f"Variable Warnings:\n* {w}\n")
    out = resp.output
    message = (
        f'Created variable "{out.metadata.path}" with modify index {out.metadata.modify_index}'
    )
    if fmt == "none":
        ctx.out.write(message + "\n")
        return 0
    verbose(message)
    render(out, fmt, args.template, ctx.out)
    return 0


# ------------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    fmt = args.out or default_out("table", "json", ctx.out)
    check_out(fmt, args.template, ("go-template", "json", "table", "terse"))
    namespace = args.namespace or "default"
    resp = ctx.client.variables.List(
        variables_pb2.VariablesListRequest(
            query=query_pb2.QueryOptions(
                namespace=namespace,
                prefix=args.prefix,
                per_page=args.per_page,
                next_token=args.page_token,
            )
        ),
        timeout=30,
    )
    items = [nomad_json.metadata(m) for m in resp.variables]
    if fmt == "json":
        if args.per_page > 0:
            data = {"Data": items, "QueryMeta": {"NextToken": resp.meta.next_token}}
            ctx.out.write(as_json(data) + "\n")
        else:
            ctx.out.write(as_json(items) + "\n")
        return 0
    if fmt == "terse":
        for m in resp.variables:
            ctx.out.write((f"{m.namespace}|{m.path}" if namespace == "*" else m.path) + "\n")
    elif fmt == "go-template":
        ctx.out.write(render_template(args.template, items) + "\n")
    elif not resp.variables:
        ctx.out.write("No matching variables found\n")
    else:
        table(
            ["Namespace", "Path", "Last Updated"],
            [(m.namespace, m.path, fmt_time(m.modify_time)) for m in resp.variables],
            ctx.out,
        )
    if resp.meta.next_token:
        ctx.err.write(f"Next page token: {resp.meta.next_token}\n")
    return 0


# ------------------------------------------------------------------ purge


def cmd_purge(args: argparse.Namespace, ctx: Context) -> int:
    check = _check_index(args.check_index)
    path = args.path.strip(" /")
    v = pb.Variable(metadata=pb.VariableMetadata(path=path))
    op = "delete"
    if check is not None:
        op, v.metadata.modify_index = "delete-cas", check
    resp = ctx.client.variables.Apply(
        variables_pb2.VariablesApplyRequest(op=op, variable=v, namespace=_ns(args)), timeout=30
    )
    if resp.result != "ok":
        raise _conflict(check or 0, resp)
    ctx.out.write(f'Successfully purged variable "{path}"!\n')
    return 0


# ------------------------------------------------------------------- lock


def _duration(raw: str, what: str) -> int:
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise CliError(f"Invalid {what}: {exc}") from None


def cmd_lock(args: argparse.Namespace, ctx: Context) -> int:
    namespace = _ns(args)
    if not args.args:
        raise CliError("Not enough arguments: give the variable's path and a command")
    v, namespace, rest = build_variable(args.args, namespace, args.fmt_in, ctx, [False])
    child = [*rest, *getattr(args, "child", [])]
    if not child:
        raise CliError("Not enough arguments: give the command to run while the lock is held")
    lock = v.metadata.lock
    lock.id = ""
    if args.ttl:
        lock.ttl = _duration(args.ttl, "TTL")
    if args.delay:
        lock.lock_delay = _duration(args.delay, "Lock Delay")
    ttl_ns = lock.ttl or 15 * 10**9

    def log(msg: str) -> None:
        if args.verbose:
            ctx.err.write(msg + "\n")

    log(f"Using TTL for the lock of {format_duration(ttl_ns)}")
    lease = Lease(
        stub=ctx.client.variables,
        namespace=namespace,
        variable=v,
        ttl_s=ttl_ns / 1e9,
        log=log,
        max_retry=args.max_retry,
    )
    backoff = _duration(args.backoff, "backoff") / 1e9 if args.backoff else ttl_ns / 1e9 * 1.1
    return run_locked(
        lease,
        child_command(child, args.shell == "true"),
        early_return=args.early_return,
        backoff_s=backoff,
    )


# ------------------------------------------------------------------- init


def cmd_init(args: argparse.Namespace, ctx: Context) -> int:
    name = args.filename or ("spec.nv.hcl" if args.out == "hcl" else "spec.nv.json")
    target = Path(name)
    if target.exists():
        raise CliError(f'File "{name}" already exists')
    content = HCL_SPEC if args.out == "hcl" else JSON_SPEC
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o660)
    except OSError as exc:
        raise CliError(f'Failed to write "{name}": {exc.strerror}') from None
    with os.fdopen(fd, "w") as f:
        f.write(content)
    if not args.quiet:
        ctx.out.write(f"Example variable specification written to {name}\n")
    return 0
