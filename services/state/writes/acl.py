"""ACL writes: bootstrap, policies, roles and tokens, each in an indexed write
transaction like every other write (`ctx.write()`), deciding on rows read
inside it.

ACL rows are not in the in-memory state, so these write their tables with
SQL of their own and record one change-log event per object (topic
`ACLPolicy`/`ACLToken`/`ACLRole`, key only: a policy name, an accessor id
or a role id, never a secret), which stamps the index and tells every state process to drop its
cached tokens. Only the SHA-256 of a secret id reaches the database.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

from corral.domain import topics
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.domain.topics import EventType
from corral.security import acl
from corral.v1 import acl_pb2, federation_pb2
from services.state.acl import (
    POLICIES_TABLE,
    ROLE_COLUMNS,
    ROLES_TABLE,
    TOKEN_COLUMNS,
    TOKENS_TABLE,
    from_ns,
    role_from_row,
    to_ns,
    token_from_row,
)
from services.state.db.database import WriteTx

POLICY_NAME = re.compile(r"^[A-Za-z0-9-]{1,128}$")  # Nomad's rule for policy names
MAX_DESCRIPTION = 256
MAX_TOKEN_NAME = 256
MAX_BATCH = 100
MAX_TOKEN_POLICIES = 100
MAX_ACCESSOR_ID = 64
MAX_TOKEN_ROLES = 100
MAX_ROLE_POLICIES = 100
BOOTSTRAP_DONE = "ACL bootstrap already done"


def _batch(n: int, field: str) -> None:
    if n == 0:
        raise InvalidArgument(field, "must not be empty")
    if n > MAX_BATCH:
        raise InvalidArgument(field, f"has {n} entries, more than {MAX_BATCH}")


def _no_nul(value: str, field: str) -> None:
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")


def policy_name(name: str, field: str) -> None:
    if not name:
        raise InvalidArgument(field, "is required")
    if not POLICY_NAME.match(name):
        raise InvalidArgument(
            field, "may contain only letters, digits and '-', at most 128 characters"
        )


def accessor_id(value: str, field: str) -> None:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_ACCESSOR_ID:
        raise InvalidArgument(field, f"is longer than {MAX_ACCESSOR_ID} characters")
    _no_nul(value, field)


def _description(text: str, field: str) -> None:
    """A policy's or role's description: no NUL, at most MAX_DESCRIPTION."""
    _no_nul(text, field)
    if len(text) > MAX_DESCRIPTION:
        raise InvalidArgument(field, f"is longer than {MAX_DESCRIPTION} characters")


def validate_policies(policies: Sequence[acl_pb2.ACLPolicy]) -> None:
    """Every policy named, described briefly and parseable; no name twice."""
    _batch(len(policies), "policies")
    seen: set[str] = set()
    for i, p in enumerate(policies):
        where = f"policies[{i}]"
        policy_name(p.name, f"{where}.name")
        if p.name in seen:
            raise InvalidArgument(f"{where}.name", f"{p.name!r} is given twice")
        seen.add(p.name)
        _description(p.description, f"{where}.description")
        acl.parse_policy(p.rules, field=f"{where}.rules")


def validate_token(req: acl_pb2.ACLCreateTokenRequest, min_ttl_ns: int, max_ttl_ns: int) -> None:
    _no_nul(req.name, "name")
    if len(req.name) > MAX_TOKEN_NAME:
        raise InvalidArgument("name", f"is longer than {MAX_TOKEN_NAME} characters")
    kind = req.type or acl.TOKEN_CLIENT
    if kind not in acl.TOKEN_TYPES:
        raise InvalidArgument("type", f"must be one of {', '.join(acl.TOKEN_TYPES)}, not {kind!r}")
    if kind == acl.TOKEN_MANAGEMENT and req.policies:
        raise InvalidArgument("policies", "a management token takes no policies")
    if kind == acl.TOKEN_MANAGEMENT and req.roles:
        raise InvalidArgument("roles", "a management token takes no roles")
    if kind == acl.TOKEN_CLIENT and not req.policies and not req.roles:
        raise InvalidArgument("policies", "a client token needs at least one policy or role")
    if len(req.policies) > MAX_TOKEN_POLICIES:
        raise InvalidArgument("policies", f"has more than {MAX_TOKEN_POLICIES} entries")
    for i, name in enumerate(req.policies):
        policy_name(name, f"policies[{i}]")
    role_links(req.roles)
    ttl = req.expiration_ttl
    if ttl < 0:
        raise InvalidArgument("expiration_ttl", "must not be negative")
    if ttl and not min_ttl_ns <= ttl <= max_ttl_ns:
        raise InvalidArgument(
            "expiration_ttl",
            f"must be between {min_ttl_ns / 1e9:g}s and {max_ttl_ns / 1e9:g}s "
            "(the state's acl token_min/max_expiration_ttl)",
        )


async def touch_table(tx: WriteTx, table: str) -> None:
    """Stamp an ACL table's index with this write's (what its blocking
    reads and `table_index` report)."""
    await tx.conn.execute(
        "INSERT INTO table_indexes (name, index) VALUES (%s, %s) "
        "ON CONFLICT (name) DO UPDATE SET index = excluded.index",
        (table, tx.index),
    )


async def upsert_policies(tx: WriteTx, policies: Sequence[acl_pb2.ACLPolicy]) -> None:
    """Create or replace each policy (validated by `validate_policies`).
    A rule naming a namespace that does not exist is refused (a `*` glob
    may match namespaces created later)."""
    for i, p in enumerate(policies):
        for label in acl.parse_policy(p.rules).namespaces:
            if "*" not in label and await tx.get_namespace(label) is None:
                raise InvalidArgument(f"policies[{i}].rules", f'namespace "{label}" does not exist')
    for p in policies:
        await tx.conn.execute(
            "INSERT INTO acl_policies (name, description, rules, create_index, modify_index) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
            "description = excluded.description, rules = excluded.rules, "
            "modify_index = excluded.modify_index",
            (p.name, p.description, p.rules, tx.index, tx.index),
        )
        tx.record(topics.ACL_POLICY.event(p.name, EventType.ACL_POLICY_UPSERTED))
    await touch_table(tx, POLICIES_TABLE)


async def replicate_policies(
    tx: WriteTx, upsert: Sequence[acl_pb2.ACLPolicy], delete: Sequence[str]
) -> None:
    """Make this region's policies the authoritative region's (ACL
    replication, services/state/federation/replication.py): no namespace
    check (namespaces are each region's own; a rule naming one that does
    not exist here grants nothing until it does)."""
    for p in upsert:
        await tx.conn.execute(
            "INSERT INTO acl_policies (name, description, rules, create_index, modify_index) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
            "description = excluded.description, rules = excluded.rules, "
            "modify_index = excluded.modify_index",
            (p.name, p.description, p.rules, tx.index, tx.index),
        )
        tx.record(topics.ACL_POLICY.event(p.name, EventType.ACL_POLICY_UPSERTED))
    if delete:
        await tx.conn.execute("DELETE FROM acl_policies WHERE name = ANY(%s)", (list(delete),))
        for name in delete:
            tx.record(topics.ACL_POLICY.event(name, EventType.ACL_POLICY_DELETED, deleted=True))
    await touch_table(tx, POLICIES_TABLE)


async def delete_policies(tx: WriteTx, names: Sequence[str]) -> None:
    """Delete policies; all must exist, else nothing is deleted. Tokens
    keep naming them (a missing policy grants nothing), as in Nomad."""
    _batch(len(names), "names")
    for i, name in enumerate(names):
        policy_name(name, f"names[{i}]")
    await _delete_all(
        tx, POLICIES_TABLE, "name", names, topics.ACL_POLICY, EventType.ACL_POLICY_DELETED
    )


async def _delete_all(
    tx: WriteTx, table: str, key: str, keys: Sequence[str], topic: topics.Topic, event: str
) -> None:
    """Delete the rows of `table` whose `key` is in `keys`, all or none:
    one missing is NOT_FOUND naming it (the transaction rolls back)."""
    cur = await tx.conn.execute(
        f"DELETE FROM {table} WHERE {key} = ANY(%s) RETURNING {key}", (list(keys),)
    )
    deleted = {r[0] for r in await cur.fetchall()}
    missing = sorted(set(keys) - deleted)
    if missing:
        what = {POLICIES_TABLE: "policy", ROLES_TABLE: "role"}[table]
        raise NotFound(f"ACL {what} not found: {', '.join(missing)}")
    for k in sorted(deleted):
        tx.record(topic.event(k, event, deleted=True))
    await touch_table(tx, table)


async def _insert_token(tx: WriteTx, token: acl_pb2.ACLToken, secret_id: str) -> None:
    token.create_index = token.modify_index = tx.index
    created = from_ns(token.create_time or tx.now)
    expires = from_ns(token.expiration_time)
    # the answer shows the times as stored (PostgreSQL keeps microseconds)
    token.create_time, token.expiration_time = to_ns(created), to_ns(expires)
    await tx.conn.execute(
        "INSERT INTO acl_tokens (accessor_id, secret_hash, name, type, policies, global, "
        "create_time, expiration_time, create_index, modify_index, roles) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            token.accessor_id,
            acl.secret_hash(secret_id),
            token.name,
            token.type,
            list(token.policies),
            token.is_global,
            created,
            expires,
            tx.index,
            tx.index,
            [link.id for link in token.roles],
        ),
    )
    tx.record(topics.ACL_TOKEN.event(token.accessor_id, EventType.ACL_TOKEN_UPSERTED))
    await touch_table(tx, TOKENS_TABLE)


async def _secret_in_use(tx: WriteTx, secret_id: str) -> bool:
    cur = await tx.conn.execute(
        "SELECT 1 FROM acl_tokens WHERE secret_hash = %s", (acl.secret_hash(secret_id),)
    )
    return await cur.fetchone() is not None


def _uuid(value: str, field: str) -> None:
    try:
        uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, "must be a UUID") from None


async def bootstrap(tx: WriteTx, secret_id: str = "") -> tuple[acl_pb2.ACLToken, str]:
    """The first management token, once per cluster: (token, its secret)."""
    if secret_id:
        _uuid(secret_id, "secret_id")
    cur = await tx.conn.execute("SELECT 1 FROM acl_bootstrap WHERE id = 1")
    if await cur.fetchone() is not None:
        raise FailedPrecondition(BOOTSTRAP_DONE)
    secret = secret_id or acl.new_secret()
    if await _secret_in_use(tx, secret):
        raise InvalidArgument("secret_id", "is already the secret of another token")
    token = acl_pb2.ACLToken(
        accessor_id=acl.new_secret(),
        name="Bootstrap Token",
        type=acl.TOKEN_MANAGEMENT,
        is_global=True,
    )
    await _insert_token(tx, token, secret)
    await tx.conn.execute(
        "INSERT INTO acl_bootstrap (id, bootstrap_index, accessor_id, create_time) "
        "VALUES (1, %s, %s, %s)",
        (tx.index, token.accessor_id, from_ns(token.create_time)),
    )
    return token, secret


async def _existing_policies(tx: WriteTx, names: Sequence[str]) -> list[str]:
    """`names` without repeats; every one must exist now (Nomad checks this
    too)."""
    policies = list(dict.fromkeys(names))
    if policies:
        cur = await tx.conn.execute(
            "SELECT name FROM acl_policies WHERE name = ANY(%s)", (policies,)
        )
        found = {r[0] for r in await cur.fetchall()}
        missing = [p for p in policies if p not in found]
        if missing:
            raise InvalidArgument("policies", f"no such ACL policy: {', '.join(missing)}")
    return policies


async def create_token(
    tx: WriteTx, req: acl_pb2.ACLCreateTokenRequest
) -> tuple[acl_pb2.ACLToken, str]:
    """A new token from a validated request: (token, its secret)."""
    policies = await _existing_policies(tx, req.policies)
    roles = await _resolve_role_links(tx, req.roles)
    token = acl_pb2.ACLToken(
        accessor_id=acl.new_secret(),
        name=req.name,
        type=req.type or acl.TOKEN_CLIENT,
        policies=policies,
        roles=roles,
        is_global=req.is_global,
        create_time=tx.now,
        expiration_time=tx.now + req.expiration_ttl if req.expiration_ttl else 0,
    )
    secret = acl.new_secret()
    await _insert_token(tx, token, secret)
    return token, secret


#: the state keeps times in microseconds: a TTL or time read back may be
#: off by that much from the one the token was made with
_TIME_SLACK_NS = 1_000


async def update_token(tx: WriteTx, req: acl_pb2.ACLUpdateTokenRequest) -> acl_pb2.ACLToken:
    """Change a token's name, type, policies and roles in place (its secret, Global
    and expiration stay, as Nomad's ACL.UpsertTokens of an existing token
    keeps them). `req` is validated as a creation's (`validate_token`)."""
    cur = await tx.conn.execute(
        f"SELECT {TOKEN_COLUMNS} FROM acl_tokens WHERE accessor_id = %s FOR UPDATE",
        (req.accessor_id,),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"ACL token {req.accessor_id!r} not found")
    token = token_from_row(row)
    if req.is_global != token.is_global:
        # Nomad's words, naming no field (its API's and ours differ)
        raise InvalidArgument("", "cannot toggle global mode")
    ttl = token.expiration_time - token.create_time if token.expiration_time else 0
    if req.expiration_ttl and abs(req.expiration_ttl - ttl) > _TIME_SLACK_NS:
        raise InvalidArgument("", "cannot update expiration TTL")
    if req.expiration_time and abs(req.expiration_time - token.expiration_time) > _TIME_SLACK_NS:
        raise InvalidArgument("", "cannot update expiration time")
    token.name, token.type = req.name, req.type or acl.TOKEN_CLIENT
    token.policies[:] = await _existing_policies(tx, req.policies)
    del token.roles[:]
    token.roles.extend(await _resolve_role_links(tx, req.roles))
    token.modify_index = tx.index
    await tx.conn.execute(
        "UPDATE acl_tokens SET name = %s, type = %s, policies = %s, roles = %s, "
        "modify_index = %s WHERE accessor_id = %s",
        (
            token.name,
            token.type,
            list(token.policies),
            [link.id for link in token.roles],
            tx.index,
            token.accessor_id,
        ),
    )
    tx.record(topics.ACL_TOKEN.event(token.accessor_id, EventType.ACL_TOKEN_UPSERTED))
    await touch_table(tx, TOKENS_TABLE)
    return token


async def delete_tokens(tx: WriteTx, accessor_ids: Sequence[str]) -> None:
    """Delete tokens by accessor id; all must exist, else nothing is deleted."""
    _batch(len(accessor_ids), "accessor_ids")
    for i, a in enumerate(accessor_ids):
        accessor_id(a, f"accessor_ids[{i}]")
    cur = await tx.conn.execute(
        "DELETE FROM acl_tokens WHERE accessor_id = ANY(%s) RETURNING accessor_id",
        (list(accessor_ids),),
    )
    deleted = {r[0] for r in await cur.fetchall()}
    missing = sorted(set(accessor_ids) - deleted)
    if missing:
        raise NotFound(f"ACL token not found: {', '.join(missing)}")
    for a in sorted(deleted):
        tx.record(topics.ACL_TOKEN.event(a, EventType.ACL_TOKEN_DELETED, deleted=True))
    await touch_table(tx, TOKENS_TABLE)


async def replicate_tokens(
    tx: WriteTx, upsert: Sequence[federation_pb2.ReplicatedToken], delete: Sequence[str]
) -> None:
    """Make this region's global tokens the authoritative region's (ACL
    replication): the same accessor ids, secret hashes, policies and times;
    local tokens are left alone."""
    for rt in upsert:
        t = rt.token
        await tx.conn.execute(
            "INSERT INTO acl_tokens (accessor_id, secret_hash, name, type, policies, global, "
            "create_time, expiration_time, create_index, modify_index, roles) "
            "VALUES (%s, %s, %s, %s, %s, true, %s, %s, %s, %s, %s) ON CONFLICT (accessor_id) "
            "DO UPDATE SET secret_hash = excluded.secret_hash, name = excluded.name, "
            "type = excluded.type, policies = excluded.policies, roles = excluded.roles, "
            "global = true, "
            "create_time = excluded.create_time, expiration_time = excluded.expiration_time, "
            "modify_index = excluded.modify_index",
            (
                t.accessor_id,
                rt.secret_hash,
                t.name,
                t.type,
                list(t.policies),
                from_ns(t.create_time),
                from_ns(t.expiration_time),
                tx.index,
                tx.index,
                [link.id for link in t.roles],
            ),
        )
        tx.record(topics.ACL_TOKEN.event(t.accessor_id, EventType.ACL_TOKEN_UPSERTED))
    if delete:
        await tx.conn.execute(
            "DELETE FROM acl_tokens WHERE global AND accessor_id = ANY(%s)", (list(delete),)
        )
        for a in delete:
            tx.record(topics.ACL_TOKEN.event(a, EventType.ACL_TOKEN_DELETED, deleted=True))
    await touch_table(tx, TOKENS_TABLE)


async def delete_expired_tokens(
    tx: WriteTx, expired_before_ns: int, *, local_only: bool = False
) -> list[str]:
    """Delete every token that expired before `expired_before_ns` (Unix ns);
    their accessor ids. An expired token already answers PERMISSION_DENIED;
    this keeps the table from growing with them (Nomad's expired token GC).
    `local_only` outside the authoritative region: global tokens are
    collected there and their deletion replicated."""
    cur = await tx.conn.execute(
        "DELETE FROM acl_tokens WHERE expiration_time IS NOT NULL AND expiration_time < %s "
        "AND NOT (global AND %s) RETURNING accessor_id",
        (from_ns(expired_before_ns), local_only),
    )
    deleted = sorted(r[0] for r in await cur.fetchall())
    for a in deleted:
        tx.record(topics.ACL_TOKEN.event(a, EventType.ACL_TOKEN_DELETED, deleted=True))
    if deleted:
        await touch_table(tx, TOKENS_TABLE)
    return deleted


# ---------------------------------------------------------------- roles


def role_links(links: Sequence[acl_pb2.ACLTokenRoleLink]) -> None:
    """A token's role links: each names a role by id or by name."""
    if len(links) > MAX_TOKEN_ROLES:
        raise InvalidArgument("roles", f"has more than {MAX_TOKEN_ROLES} entries")
    for i, link in enumerate(links):
        if link.id:
            accessor_id(link.id, f"roles[{i}].id")
        elif link.name:
            policy_name(link.name, f"roles[{i}].name")
        else:
            raise InvalidArgument(f"roles[{i}]", "names no role: give its id or its name")


def validate_roles(roles: Sequence[acl_pb2.ACLRole]) -> None:
    """What Nomad's ACLRole.Validate checks, and no role twice in one call."""
    _batch(len(roles), "roles")
    names: set[str] = set()
    ids: set[str] = set()
    for i, r in enumerate(roles):
        where = f"roles[{i}]"
        if r.id:
            accessor_id(r.id, f"{where}.id")
            if r.id in ids:
                raise InvalidArgument(f"{where}.id", f"{r.id!r} is given twice")
            ids.add(r.id)
        policy_name(r.name, f"{where}.name")
        if r.name in names:
            raise InvalidArgument(f"{where}.name", f"{r.name!r} is given twice")
        names.add(r.name)
        _description(r.description, f"{where}.description")
        if not r.policies:
            raise InvalidArgument(f"{where}.policies", "at least one policy should be specified")
        if len(r.policies) > MAX_ROLE_POLICIES:
            raise InvalidArgument(f"{where}.policies", f"has more than {MAX_ROLE_POLICIES} entries")
        for j, name in enumerate(r.policies):
            policy_name(name, f"{where}.policies[{j}]")


async def _role_row(tx: WriteTx, column: str, value: str) -> acl_pb2.ACLRole | None:
    cur = await tx.conn.execute(
        f"SELECT {ROLE_COLUMNS} FROM acl_roles WHERE {column} = %s FOR UPDATE", (value,)
    )
    row = await cur.fetchone()
    return role_from_row(row) if row is not None else None


async def _put_role(tx: WriteTx, role: acl_pb2.ACLRole) -> None:
    """Insert or replace one role (its create index kept on update), with
    its change-log event."""
    await tx.conn.execute(
        "INSERT INTO acl_roles (id, name, description, policies, create_index, modify_index) "
        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
        "name = excluded.name, description = excluded.description, "
        "policies = excluded.policies, modify_index = excluded.modify_index",
        (role.id, role.name, role.description, list(role.policies), role.create_index, tx.index),
    )
    tx.record(topics.ACL_ROLE.event(role.id, EventType.ACL_ROLE_UPSERTED))


async def upsert_roles(tx: WriteTx, roles: Sequence[acl_pb2.ACLRole]) -> list[acl_pb2.ACLRole]:
    """Create or update each role (validated by `validate_roles`), deciding
    on the rows as this transaction reads them, as Nomad's UpsertRoles: a
    role without an id is new and its name must be free; with an id it must
    exist, and a new name must be free; every linked policy must exist.
    A role that would not change is left alone. The roles as stored."""
    out: list[acl_pb2.ACLRole] = []
    for i, r in enumerate(roles):
        where = f"roles[{i}]"
        policies = list(dict.fromkeys(r.policies))
        cur = await tx.conn.execute(
            "SELECT name FROM acl_policies WHERE name = ANY(%s)", (policies,)
        )
        found = {row[0] for row in await cur.fetchall()}
        missing = [p for p in policies if p not in found]
        if missing:
            raise InvalidArgument(f"{where}.policies", f"cannot find policy {', '.join(missing)}")
        named = await _role_row(tx, "name", r.name)
        if r.id:
            existing = await _role_row(tx, "id", r.id)
            if existing is None:
                raise InvalidArgument(f"{where}.id", f"cannot find role {r.id}")
        else:
            existing = None
        if named is not None and (existing is None or named.id != existing.id):
            raise InvalidArgument(f"{where}.name", f"role with name {r.name} already exists")
        role = acl_pb2.ACLRole(
            id=r.id or str(uuid.uuid4()),
            name=r.name,
            description=r.description,
            policies=policies,
            create_index=existing.create_index if existing else tx.index,
            modify_index=tx.index,
        )
        if existing is not None and (
            (existing.name, existing.description, list(existing.policies))
            == (role.name, role.description, policies)
        ):
            out.append(existing)
            continue
        await _put_role(tx, role)
        out.append(role)
    if tx.change_count:
        await touch_table(tx, ROLES_TABLE)
    return out


async def delete_roles(tx: WriteTx, ids: Sequence[str]) -> None:
    """Delete roles by id; all must exist, else nothing is deleted. Tokens
    keep the link, which then grants nothing and is no longer shown
    (Nomad's fixTokenRoleLinks)."""
    _batch(len(ids), "ids")
    for i, role_id in enumerate(ids):
        accessor_id(role_id, f"ids[{i}]")
    await _delete_all(tx, ROLES_TABLE, "id", ids, topics.ACL_ROLE, EventType.ACL_ROLE_DELETED)


async def replicate_roles(
    tx: WriteTx, upsert: Sequence[acl_pb2.ACLRole], delete: Sequence[str]
) -> None:
    """Make this region's roles the authoritative region's (ACL
    replication): the same ids, names and policy links, written without
    checking the policies exist here (Nomad's AllowMissingPolicies: they
    may arrive a moment later). A local role holding a replicated role's
    name gives way (the authority's names are the federation's)."""
    for r in upsert:
        await tx.conn.execute("DELETE FROM acl_roles WHERE name = %s AND id <> %s", (r.name, r.id))
        await _put_role(
            tx,
            acl_pb2.ACLRole(
                id=r.id,
                name=r.name,
                description=r.description,
                policies=r.policies,
                create_index=tx.index,
            ),
        )
    if delete:
        await tx.conn.execute("DELETE FROM acl_roles WHERE id = ANY(%s)", (list(delete),))
        for role_id in delete:
            tx.record(topics.ACL_ROLE.event(role_id, EventType.ACL_ROLE_DELETED, deleted=True))
    await touch_table(tx, ROLES_TABLE)


async def _resolve_role_links(
    tx: WriteTx, links: Sequence[acl_pb2.ACLTokenRoleLink]
) -> list[acl_pb2.ACLTokenRoleLink]:
    """A token's role links, each by id or name, as the roles now are (id
    and current name), without repeats; an unknown role is refused."""
    out: dict[str, acl_pb2.ACLTokenRoleLink] = {}
    for link in links:
        role = await _role_row(tx, "id", link.id) if link.id else None
        if not link.id:
            role = await _role_row(tx, "name", link.name)
        if role is None:
            raise InvalidArgument("roles", f"cannot find role {link.id or link.name}")
        out.setdefault(role.id, acl_pb2.ACLTokenRoleLink(id=role.id, name=role.name))
    return list(out.values())
