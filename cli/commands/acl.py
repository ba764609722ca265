"""`corral acl bootstrap`, `acl policy apply|list|info|delete`, `acl role
create|list|info|update|delete` and `acl token create|list|info|self|delete`:
Nomad's ACL commands over the state's `ACL` service. A secret id is
printed only by `bootstrap` and `token create` (the state keeps nothing but
its hash)."""

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
    acl = group(sub, "acl", "ACL tokens, policies and roles")

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

    _register_roles(acl)

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
    p.add_argument(
        "-role-id",
        "--role-id",
        dest="role_ids",
        action="append",
        default=[],
        help="the id of a role the token links (repeatable; client tokens only)",
    )
    p.add_argument(
        "-role-name",
        "--role-name",
        dest="role_names",
        action="append",
        default=[],
        help="the name of a role the token links (repeatable; client tokens only)",
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


def _register_roles(acl: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    role = acl.add_parser("role", help="ACL roles").add_subparsers(
        dest="role_command", metavar="<subcommand>"
    )

    def policy_flag(p: argparse.ArgumentParser, help_: str) -> None:
        p.add_argument(
            "-policy", "--policy", dest="policies", action="append", default=[], help=help_
        )

    p = role.add_parser("create", help="Create a role")
    p.add_argument("-name", "--name", default="", help="the role's name (required)")
    p.add_argument("-description", "--description", default="")
    policy_flag(p, "a policy the role links (repeatable; at least one)")
    common(p, json=True)
    p.set_defaults(func=cmd_role_create)
    p = role.add_parser("list", help="List roles")
    common(p, json=True)
    p.set_defaults(func=cmd_role_list)
    p = role.add_parser("info", help="Show a role")
    p.add_argument("-by-name", "--by-name", dest="by_name", action="store_true")
    p.add_argument("role", metavar="ROLE", help="the role's id (its name with -by-name)")
    common(p, json=True)
    p.set_defaults(func=cmd_role_info)
    p = role.add_parser("update", help="Change a role")
    p.add_argument("-name", "--name", default="")
    p.add_argument("-description", "--description", default="")
    policy_flag(p, "a policy to link (repeatable; added to the role's unless -no-merge)")
    p.add_argument(
        "-no-merge",
        "--no-merge",
        dest="no_merge",
        action="store_true",
        help="replace the role with the flags given instead of merging them in",
    )
    p.add_argument("role_id", metavar="ROLE_ID")
    common(p, json=True)
    p.set_defaults(func=cmd_role_update)
    p = role.add_parser("delete", help="Delete a role")
    p.add_argument("role_id", metavar="ROLE_ID")
    common(p)
    p.set_defaults(func=cmd_role_delete)


def _policies(t: acl_pb2.ACLToken) -> str:
    if t.type == "management":
        return "n/a"
    return f"[{' '.join(t.policies)}]"


def write_token(ctx: Context, t: acl_pb2.ACLToken) -> None:
    """A token as Nomad prints it (the secret only when the answer has it),
    its roles listed under the fields."""
    _token_fields(ctx, t)
    if t.type == "management":
        return
    ctx.out.write("\nRoles\n")
    if t.roles:
        table(("ID", "Name"), [(r.id, r.name) for r in t.roles], ctx.out)
    else:
        ctx.out.write("<none>\n")


def _token_fields(ctx: Context, t: acl_pb2.ACLToken) -> None:
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
            *([("Roles", "n/a")] if t.type == "management" else []),
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


# --------------------------------------------------------------------- roles


def _show_role(args: argparse.Namespace, ctx: Context, r: acl_pb2.ACLRole) -> int:
    if args.json:
        print_json(r, ctx.out)
        return 0
    kv(
        [
            ("ID", r.id),
            ("Name", r.name),
            ("Description", r.description or "<none>"),
            ("Policies", ",".join(sorted(r.policies))),
            ("Create Index", r.create_index),
            ("Modify Index", r.modify_index),
        ],
        ctx.out,
    )
    return 0


def _upsert_role(ctx: Context, role: acl_pb2.ACLRole) -> acl_pb2.ACLRole:
    resp = ctx.client.acl.UpsertRoles(acl_pb2.ACLUpsertRolesRequest(roles=[role]), timeout=30)
    written: acl_pb2.ACLRole = resp.roles[0]
    return written


def _named_and_linked(args: argparse.Namespace) -> None:
    """Nomad's checks before a role is sent whole (create, update -no-merge)."""
    if not args.name:
        raise CliError("ACL role name must be specified using the -name flag")
    if not args.policies:
        raise CliError("At least one policy name must be specified using the -policy flag")


def cmd_role_create(args: argparse.Namespace, ctx: Context) -> int:
    _named_and_linked(args)
    role = acl_pb2.ACLRole(
        name=args.name,
        description=args.description,
        policies=list(dict.fromkeys(args.policies)),
    )
    return _show_role(args, ctx, _upsert_role(ctx, role))


def cmd_role_list(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.acl.ListRoles(acl_pb2.ACLListRolesRequest(), timeout=30)
    if args.json:
        print_json(list(resp.roles), ctx.out)
        return 0
    if not resp.roles:
        ctx.out.write("No ACL roles found\n")
        return 0
    table(
        ("ID", "Name", "Description", "Policies"),
        [(r.id, r.name, r.description, ",".join(sorted(r.policies))) for r in resp.roles],
        ctx.out,
    )
    return 0


def _get_role(ctx: Context, ref: str, by_name: bool = False) -> acl_pb2.ACLRole:
    if by_name:
        resp = ctx.client.acl.GetRoleByName(acl_pb2.ACLGetRoleByNameRequest(name=ref), timeout=30)
    else:
        resp = ctx.client.acl.GetRole(acl_pb2.ACLGetRoleRequest(id=ref), timeout=30)
    role: acl_pb2.ACLRole = resp.role
    return role


def cmd_role_info(args: argparse.Namespace, ctx: Context) -> int:
    return _show_role(args, ctx, _get_role(ctx, args.role, args.by_name))


def cmd_role_update(args: argparse.Namespace, ctx: Context) -> int:
    """Nomad's `acl role update`: the flags given merged into the role as
    read (new policies added to its own), or with -no-merge the role
    replaced by the flags."""
    current = _get_role(ctx, args.role_id)
    if args.no_merge:
        _named_and_linked(args)
        role = acl_pb2.ACLRole(
            id=current.id,
            name=args.name,
            description=args.description,
            policies=list(dict.fromkeys(args.policies)),
        )
    else:
        if not (args.name or args.description or args.policies):
            raise CliError("Please provide at least one flag to update the ACL role")
        role = acl_pb2.ACLRole(
            id=current.id,
            name=args.name or current.name,
            description=args.description or current.description,
            policies=list(dict.fromkeys([*current.policies, *args.policies])),
        )
    return _show_role(args, ctx, _upsert_role(ctx, role))


def cmd_role_delete(args: argparse.Namespace, ctx: Context) -> int:
    ctx.client.acl.DeleteRoles(acl_pb2.ACLDeleteRolesRequest(ids=[args.role_id]), timeout=30)
    ctx.out.write(f"ACL role {args.role_id} successfully deleted\n")
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
            roles=[acl_pb2.ACLTokenRoleLink(id=i) for i in args.role_ids]
            + [acl_pb2.ACLTokenRoleLink(name=n) for n in args.role_names],
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
