"""`corral acl bootstrap`, `acl policy apply|list|info|delete` and `acl
token create|list|info|self|delete`: Nomad's ACL commands over the state's
`ACL` service. A secret id is printed only by `bootstrap` and `token
create` (the state keeps nothing but its hash)."""

from __future__ import annotations

import argparse
import time

from cli.commands import group
from cli.context import CliError, Context, common, read_input
from cli.output import fmt_time, kv, print_json, table
from corral.domain.jobspec.duration import parse_duration
from corral.v1 import acl_pb2

HIDDEN = "<hidden>"  # the state stores only a hash of each secret


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    acl = group(sub, "acl", "ACL tokens and policies")

    p = acl.add_parser("bootstrap", help="Create the first management token (once)")
    p.add_argument(
        "secret_file",
        nargs="?",
        default=None,
        metavar="PATH",
        help="a file holding the secret id (a UUID) to use; '-' = stdin; default: a random one",
    )
    common(p, json=True)
    p.set_defaults(func=cmd_bootstrap)

    policy = acl.add_parser("policy", help="ACL policies").add_subparsers(
        dest="policy_command", metavar="<subcommand>"
    )
    p = policy.add_parser("apply", help="Create or update a policy from an HCL file")
    p.add_argument("-description", "--description", default="")
    p.add_argument("name")
    p.add_argument("file", help="the policy's rules (HCL); '-' = stdin")
    common(p)
    p.set_defaults(func=cmd_policy_apply)
    p = policy.add_parser("list", help="List policies")
    common(p, json=True)
    p.set_defaults(func=cmd_policy_list)
    p = policy.add_parser("info", help="Show a policy and its rules")
    p.add_argument("name")
    common(p, json=True)
    p.set_defaults(func=cmd_policy_info)
    p = policy.add_parser("delete", help="Delete a policy")
    p.add_argument("name")
    common(p)
    p.set_defaults(func=cmd_policy_delete)

    token = acl.add_parser("token", help="ACL tokens").add_subparsers(
        dest="token_command", metavar="<subcommand>"
    )
    p = token.add_parser("create", help="Create a token (its secret is shown once)")
    p.add_argument("-name", "--name", default="")
    p.add_argument("-type", "--type", choices=("client", "management"), default="client")
    p.add_argument(
        "-policy",
        "--policy",
        dest="policies",
        action="append",
        default=[],
        help="a policy of the token (repeatable; client tokens only)",
    )
    p.add_argument("-global", "--global", dest="is_global", action="store_true")
    p.add_argument("-ttl", "--ttl", default="", help='lifetime, e.g. "1h" (default: no expiry)')
    common(p, json=True)
    p.set_defaults(func=cmd_token_create)
    p = token.add_parser("list", help="List tokens")
    common(p, json=True)
    p.set_defaults(func=cmd_token_list)
    p = token.add_parser("info", help="Show a token")
    p.add_argument("accessor_id")
    common(p, json=True)
    p.set_defaults(func=cmd_token_info)
    p = token.add_parser("self", help="Show the token this command runs with")
    common(p, json=True)
    p.set_defaults(func=cmd_token_self)
    p = token.add_parser("delete", help="Delete a token")
    p.add_argument("accessor_id")
    common(p)
    p.set_defaults(func=cmd_token_delete)


def _policies(t: acl_pb2.ACLToken) -> str:
    if t.type == "management":
        return "n/a"
    return f"[{' '.join(t.policies)}]"


def write_token(ctx: Context, t: acl_pb2.ACLToken) -> None:
    """A token as Nomad prints it (the secret only when the answer has it)."""
    kv(
        [
            ("Accessor ID", t.accessor_id),
            ("Secret ID", t.secret_id or HIDDEN),
            ("Name", t.name or "<none>"),
            ("Type", t.type),
            ("Global", str(t.is_global).lower()),
            ("Create Time", fmt_time(t.create_time)),
            ("Expiry Time", fmt_time(t.expiration_time)),
            ("Create Index", t.create_index),
            ("Modify Index", t.modify_index),
            ("Policies", _policies(t)),
        ],
        ctx.out,
    )


def _show_token(args: argparse.Namespace, ctx: Context, t: acl_pb2.ACLToken) -> int:
    if args.json:
        print_json(t, ctx.out)
    else:
        write_token(ctx, t)
    return 0


def cmd_bootstrap(args: argparse.Namespace, ctx: Context) -> int:
    secret = read_input(args.secret_file, "secret file").strip() if args.secret_file else ""
    resp = ctx.client.acl.Bootstrap(acl_pb2.ACLBootstrapRequest(secret_id=secret), timeout=30)
    return _show_token(args, ctx, resp.token)


# ------------------------------------------------------------------ policies


def cmd_policy_apply(args: argparse.Namespace, ctx: Context) -> int:
    rules = read_input(args.file, "policy file")
    ctx.client.acl.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name=args.name, description=args.description, rules=rules)]
        ),
        timeout=30,
    )
    ctx.out.write(f'Successfully wrote "{args.name}" ACL policy!\n')
    return 0


def cmd_policy_list(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.acl.ListPolicies(acl_pb2.ACLListPoliciesRequest(), timeout=30)
    if args.json:
        print_json(list(resp.policies), ctx.out)
        return 0
    if not resp.policies:
        ctx.out.write("No policies found\n")
        return 0
    table(
        ("Name", "Description"),
        [(p.name, p.description or "<none>") for p in resp.policies],
        ctx.out,
    )
    return 0


def cmd_policy_info(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.acl.GetPolicy(acl_pb2.ACLGetPolicyRequest(name=args.name), timeout=30)
    p = resp.policy
    if args.json:
        print_json(p, ctx.out)
        return 0
    kv(
        [
            ("Name", p.name),
            ("Description", p.description or "<none>"),
            ("Create Index", p.create_index),
            ("Modify Index", p.modify_index),
        ],
        ctx.out,
    )
    ctx.out.write("\nRules\n\n")
    ctx.out.write(p.rules if p.rules.endswith("\n") else p.rules + "\n")
    return 0


def cmd_policy_delete(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.acl.DeletePolicies(acl_pb2.ACLDeletePoliciesRequest(names=[args.name]), timeout=30)
    ctx.out.write(f'Successfully deleted "{args.name}" ACL policy!\n')
    return 0


# -------------------------------------------------------------------- tokens


def cmd_token_create(args: argparse.Namespace, ctx: Context) -> int:
    ttl = 0
    if args.ttl:
        try:
            ttl = parse_duration(args.ttl)
        except ValueError as exc:
            raise CliError(f"-ttl: {exc}") from None
        if ttl <= 0:
            raise CliError("-ttl: must be positive")
    resp = ctx.client.acl.CreateToken(
        acl_pb2.ACLCreateTokenRequest(
            name=args.name,
            type=args.type,
            policies=args.policies,
            is_global=args.is_global,
            expiration_ttl=ttl,
        ),
        timeout=30,
    )
    return _show_token(args, ctx, resp.token)


def cmd_token_list(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.acl.ListTokens(acl_pb2.ACLListTokensRequest(), timeout=30)
    tokens = sorted(resp.tokens, key=lambda t: (t.name, t.accessor_id))
    if args.json:
        print_json(tokens, ctx.out)
        return 0
    if not tokens:
        ctx.out.write("No tokens found\n")
        return 0
    now = time.time_ns()
    table(
        ("Name", "Type", "Global", "Accessor ID", "Expired"),
        [
            (
                t.name or "<none>",
                t.type,
                str(t.is_global).lower(),
                t.accessor_id,
                str(bool(t.expiration_time) and t.expiration_time <= now).lower(),
            )
            for t in tokens
        ],
        ctx.out,
    )
    return 0


def cmd_token_info(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.acl.GetToken(
        acl_pb2.ACLGetTokenRequest(accessor_id=args.accessor_id), timeout=30
    )
    return _show_token(args, ctx, resp.token)


def cmd_token_self(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.acl.TokenSelf(acl_pb2.ACLTokenSelfRequest(), timeout=30)
    return _show_token(args, ctx, resp.token)


def cmd_token_delete(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.acl.DeleteTokens(
        acl_pb2.ACLDeleteTokensRequest(accessor_ids=[args.accessor_id]), timeout=30
    )
    ctx.out.write(f"Token {args.accessor_id} successfully deleted\n")
    return 0
