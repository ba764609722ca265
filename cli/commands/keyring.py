"""`corral operator root keyring list|rotate|remove`: the root keys that
encrypt Variables and sign workload identities, as Nomad's `nomad operator
root keyring` (docs/variables.md)."""

from __future__ import annotations

import argparse
import time

from cli.context import CliError, Context, common
from cli.output import fmt_time, print_json, short, table
from corral.domain.jobspec.duration import parse_duration
from corral.v1 import keyring_pb2
from corral.v1 import structs_pb2 as pb

ROTATE_NEEDS = (
    'One of "-now" or "-prepublish" must be used. If a key has been leaked use "-now" to '
    'force immediate rotation. Otherwise please use "-prepublish <duration>" to ensure the '
    "new key is not used to sign workload identities before JWKS endpoints are updated."
)


def register(op: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    root = op.add_parser("root", help="The keyring of Variables and workload identities")
    root_sub = root.add_subparsers(dest="root_command", metavar="<subcommand>")
    kr = root_sub.add_parser("keyring", help="Root keys: list, rotate, remove")
    kr.set_defaults(group_parser=kr)
    sub = kr.add_subparsers(dest="keyring_command", metavar="<subcommand>")

    p = sub.add_parser("list", help="Every root key and its state")
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("rotate", help="Make a new root key")
    p.add_argument("-full", "--full", action="store_true", help="re-encrypt every variable")
    p.add_argument("-now", "--now", action="store_true", help="activate the new key at once")
    p.add_argument(
        "-prepublish", "--prepublish", default="", help="activate it after this duration"
    )
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_rotate)

    p = sub.add_parser("remove", help="Delete an inactive root key")
    p.add_argument("key_id")
    p.add_argument("-force", "--force", action="store_true", help="even if variables use it")
    common(p)
    p.set_defaults(func=cmd_remove)


def _show(ctx: Context, keys: list[pb.RootKeyMeta], verbose: bool) -> None:
    table(
        ["Key", "State", "Create Time", "Publish Time"],
        [
            (
                short(k.key_id, verbose),
                k.state,
                fmt_time(k.create_time),
                fmt_time(k.publish_time) if k.publish_time else "",
            )
            for k in keys
        ],
        ctx.out,
    )


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.keyring.List(keyring_pb2.KeyringListRequest(), timeout=30)
    if args.json:
        print_json(list(resp.keys), ctx.out)
        return 0
    _show(ctx, list(resp.keys), args.verbose)
    return 0


def cmd_rotate(args: argparse.Namespace, ctx: Context) -> int:
    if args.now == bool(args.prepublish):
        raise CliError(ROTATE_NEEDS)
    publish_time = 0
    if args.prepublish:
        try:
            wait = parse_duration(args.prepublish)
        except ValueError as exc:
            raise CliError(f"invalid -prepublish: {exc}") from None
        if wait <= 0:
            raise CliError("-prepublish must be a positive duration")
        publish_time = time.time_ns() + wait
    resp = ctx.client.keyring.Rotate(
        keyring_pb2.KeyringRotateRequest(full=args.full, publish_time=publish_time), timeout=60
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    _show(ctx, [resp.key], args.verbose)
    return 0


def cmd_remove(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.keyring.Delete(
        keyring_pb2.KeyringDeleteRequest(key_id=args.key_id, force=args.force), timeout=30
    )
    ctx.out.write(f"Removed encryption key {args.key_id}\n")
    return 0
