"""One-time tokens (Nomad's OneTimeToken, behind `nomad ui -authenticate`):
a secret valid for 10 minutes that exchanges once for the ACL token that
made it, so a URL can carry it where the real secret should not go.

The state never stores an ACL secret, only its hash, yet an exchange must
answer the token with its secret. So the one-time token keeps the caller's
ACL secret sealed (AES-256-GCM) under a key derived (HKDF-SHA256) from the
one-time secret, which itself is stored as its SHA-256 only: a dump of the
table neither exchanges nor authenticates, and the holder of the one-time
secret is the only one who can open it. Nomad's table holds both secrets
in the clear; ours keeps the rule that no usable secret reaches the
database.

An exchange is one write transaction that deletes the row it answers from
(`DELETE ... RETURNING`, expired rows excluded), so a secret exchanges at
most once, however many exchanges race. As in Nomad, an ACL token has at
most one one-time token (a new one replaces it); deleting the ACL token
deletes it (a foreign key with ON DELETE CASCADE).
"""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from corral.domain import topics
from corral.domain.errors import PermissionDenied
from corral.domain.topics import EventType
from corral.security import acl
from corral.security.keyring import KeyringError, seal, unseal
from corral.v1 import acl_pb2
from services.state.acl import TOKEN_COLUMNS, from_ns, to_ns, token_from_row
from services.state.db.database import WriteTx
from services.state.writes.acl import touch_table

TABLE = "acl_one_time_tokens"
#: Nomad's lifetime of a one-time token
TTL_NS = 10 * 60 * 1_000_000_000
#: an exchange's refusal (Nomad answers only "Permission denied"; which of
#: the three it was is no secret to the holder of the one-time secret)
NOT_EXCHANGEABLE = "Permission denied: one-time token not found, already exchanged or expired"


def _key(one_time_secret: str) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"corral one-time token"
    ).derive(one_time_secret.encode())


def _aad(accessor_id: str) -> bytes:
    """What the sealed secret is bound to: it opens for its own row only."""
    return b"corral-one-time-token\x00" + accessor_id.encode()


async def upsert(tx: WriteTx, acl_secret: str) -> acl_pb2.ACLOneTimeToken:
    """A new one-time token for the ACL token whose secret is `acl_secret`
    (the caller's own), replacing an earlier one of that token; the answer
    holds the one-time secret, which is nowhere else. An unknown or expired
    ACL token is refused (PERMISSION_DENIED), as Nomad does."""
    cur = await tx.conn.execute(
        "SELECT accessor_id, expiration_time FROM acl_tokens WHERE secret_hash = %s FOR SHARE",
        (acl.secret_hash(acl_secret),),
    )
    row = await cur.fetchone()
    if row is None:
        raise PermissionDenied("Permission denied: ACL token not found")
    accessor_id, expiration = str(row[0]), row[1]
    if expiration is not None and to_ns(expiration) <= tx.now:
        raise PermissionDenied("Permission denied: ACL token expired")
    secret = acl.new_secret()
    expires = from_ns(tx.now + TTL_NS)
    await tx.conn.execute(
        "INSERT INTO acl_one_time_tokens (accessor_id, secret_hash, sealed_secret, expires_at, "
        "create_index, modify_index) VALUES (%s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (accessor_id) DO UPDATE SET secret_hash = excluded.secret_hash, "
        "sealed_secret = excluded.sealed_secret, expires_at = excluded.expires_at, "
        "create_index = excluded.create_index, modify_index = excluded.modify_index",
        (
            accessor_id,
            acl.secret_hash(secret),
            seal(_key(secret), acl_secret.encode(), _aad(accessor_id)),
            expires,
            tx.index,
            tx.index,
        ),
    )
    tx.record(topics.ONE_TIME_TOKEN.event(accessor_id, EventType.ONE_TIME_TOKEN_UPSERTED))
    await touch_table(tx, TABLE)
    return acl_pb2.ACLOneTimeToken(
        one_time_secret_id=secret,
        accessor_id=accessor_id,
        expires_at=to_ns(expires),
        create_index=tx.index,
        modify_index=tx.index,
    )


async def exchange(tx: WriteTx, one_time_secret: str) -> acl_pb2.ACLToken:
    """The ACL token (its secret set, role links by id) the one-time secret
    stands for; the one-time token is deleted by this transaction. Unknown,
    exchanged, expired, or its ACL token expired: PERMISSION_DENIED and
    nothing changes (an expired one is left to the GC, as in Nomad)."""
    cur = await tx.conn.execute(
        "DELETE FROM acl_one_time_tokens WHERE secret_hash = %s AND expires_at > %s "
        "RETURNING accessor_id, sealed_secret",
        (acl.secret_hash(one_time_secret), from_ns(tx.now)),
    )
    row = await cur.fetchone()
    if row is None:
        raise PermissionDenied(NOT_EXCHANGEABLE)
    accessor_id, sealed = str(row[0]), bytes(row[1])
    cur = await tx.conn.execute(
        f"SELECT {TOKEN_COLUMNS}, secret_hash FROM acl_tokens WHERE accessor_id = %s",
        (accessor_id,),
    )
    token_row = await cur.fetchone()
    if token_row is None:  # the cascade deletes it with its token: not reached
        raise PermissionDenied(NOT_EXCHANGEABLE)
    token = token_from_row(token_row)
    if token.expiration_time and token.expiration_time <= tx.now:
        raise PermissionDenied("Permission denied: ACL token expired")
    try:
        secret = unseal(_key(one_time_secret), sealed, _aad(accessor_id)).decode()
    except KeyringError:
        raise PermissionDenied(NOT_EXCHANGEABLE) from None
    if acl.secret_hash(secret) != token_row[-1]:
        raise PermissionDenied(NOT_EXCHANGEABLE)
    tx.record(
        topics.ONE_TIME_TOKEN.event(accessor_id, EventType.ONE_TIME_TOKEN_DELETED, deleted=True)
    )
    await touch_table(tx, TABLE)
    token.secret_id = secret
    return token


async def delete_expired(tx: WriteTx, before_ns: int) -> list[str]:
    """Delete the one-time tokens expired before `before_ns` (Nomad's
    ExpireOneTimeTokens, run by the expired-token GC); the accessor ids
    they were for."""
    cur = await tx.conn.execute(
        "DELETE FROM acl_one_time_tokens WHERE expires_at <= %s RETURNING accessor_id",
        (from_ns(before_ns),),
    )
    deleted = sorted(str(r[0]) for r in await cur.fetchall())
    for a in deleted:
        tx.record(topics.ONE_TIME_TOKEN.event(a, EventType.ONE_TIME_TOKEN_DELETED, deleted=True))
    if deleted:
        await touch_table(tx, TABLE)
    return deleted
