"""`corral system gc` (Nomad's `nomad system gc`): force a full garbage
collection, thresholds ignored.

Nomad returns as soon as the GC eval is enqueued; this waits for a worker to
finish the pass (so a script can rely on the garbage being gone when it
returns) unless `-detach` is given, and prints the core eval's id either way.
"""

from __future__ import annotations

import argparse

from cli.commands import group
from cli.context import CliError, Context, common
from cli.output import print_json
from corral.v1 import system_pb2, system_pb2_grpc

MAX_TIMEOUT_S = 300


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sys_group = group(sub, "system", "Cluster-wide maintenance")
    p = sys_group.add_parser(
        "gc", help="Collect every terminal eval, alloc, job, deployment and down node now"
    )
    p.add_argument(
        "-detach",
        "--detach",
        action="store_true",
        help="return once the GC eval is enqueued (as Nomad does)",
    )
    p.add_argument(
        "-timeout",
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help=f"longest wait for the pass (default 60, at most {MAX_TIMEOUT_S})",
    )
    common(p, json=True)
    p.set_defaults(func=cmd_gc)


def cmd_gc(args: argparse.Namespace, ctx: Context) -> int:
    if not 0 < args.timeout <= MAX_TIMEOUT_S:
        raise CliError(f"-timeout: expected seconds in (0, {MAX_TIMEOUT_S}], got {args.timeout}")
    stub = system_pb2_grpc.SystemStub(ctx.client.channel())
    resp: system_pb2.SystemGCResponse = stub.GarbageCollect(
        system_pb2.SystemGCRequest(detach=args.detach, timeout_ms=int(args.timeout * 1000)),
        timeout=args.timeout + 45,
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0 if resp.complete or args.detach else 1
    if args.detach:
        ctx.out.write(f"Garbage collection enqueued\nEvaluation ID: {resp.eval_id}\n")
        return 0
    if not resp.complete:
        raise CliError(
            f"garbage collection eval {resp.eval_id} did not finish within {args.timeout:g}s "
            "(is a worker with the _core scheduler running?)"
        )
    ctx.out.write(f"Garbage collection complete\nEvaluation ID: {resp.eval_id}\n")
    if resp.expired_acl_tokens:
        ctx.out.write(f"Expired ACL tokens deleted: {resp.expired_acl_tokens}\n")
    return 0
