"""ACL replication: the state leader of every region but the authoritative
one copies the authoritative region's ACL policies, roles and global tokens
into its own database (Nomad's `replicateACLPolicies` /
`replicateACLRoles` / `replicateACLTokens`).

Three loops, one per table, each a blocking query on the authoritative
region (`Federation.ReplicatePolicies` / `ReplicateRoles` /
`ReplicateTokens`, answered once that region's table index passes the one
last copied, or after 5 minutes): the answer is the whole table (every
policy with its rules; every role; every global token with the SHA-256 of
its secret, never the secret, and its role links by id), compared by digest
with what this region holds, and the difference written in one
transaction: missing and changed ones upserted, ones the authority no longer
has deleted. Local tokens are never touched; policies and roles are the
authority's only (writes of policies, roles and global tokens in this region
are forwarded to the authoritative region by the ACL handlers, so nothing
written here is lost). A role may arrive before a policy it names, a token
before a role it links: until then the missing one grants nothing. A
failure is recorded, logged and tried again after
`--acl-replication-backoff` seconds.

The loops' status (`ReplicationStatus`) is this process's; the state app
publishes it in its member record, so any state process of the region, and
`corral operator members`, can show the leader's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format

from corral.v1 import acl_pb2, federation_pb2, query_pb2
from services.state import acl as acl_reads
from services.state import metrics
from services.state.db.database import Database
from services.state.federation.links import Federation
from services.state.writes import acl as acl_writes

log = logging.getLogger(__name__)

POLICIES = "/corral.v1.Federation/ReplicatePolicies"
TOKENS = "/corral.v1.Federation/ReplicateTokens"
ROLES = "/corral.v1.Federation/ReplicateRoles"
#: what each replication loop copies: its RPC, the answer's type and list
#: field, and the `ReplicationStatus` field of the index it copied last
COPIED: dict[str, tuple[str, Any, str, str]] = {
    "policies": (POLICIES, federation_pb2.ReplicatedPolicies, "policies", "policies_index"),
    "roles": (ROLES, federation_pb2.ReplicatedRoles, "roles", "roles_index"),
    "tokens": (TOKENS, federation_pb2.ReplicatedTokens, "tokens", "tokens_index"),
}
#: a blocking query's wait on the authoritative region (Nomad's default)
WAIT_MS = 5 * 60 * 1000
#: the member tag carrying the replication status
TAG = "acl_replication"


def policy_digest(p: acl_pb2.ACLPolicy) -> str:
    h = hashlib.sha256()
    for part in (p.name, p.description, p.rules):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def role_digest(r: acl_pb2.ACLRole) -> str:
    h = hashlib.sha256()
    for part in (r.id, r.name, r.description, "\x1f".join(r.policies)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def token_digest(t: federation_pb2.ReplicatedToken) -> str:
    tok = t.token
    h = hashlib.sha256()
    for part in (
        tok.accessor_id,
        t.secret_hash,
        tok.name,
        tok.type,
        "\x1f".join(tok.policies),
        "\x1f".join(link.id for link in tok.roles),
        str(tok.create_time),
        str(tok.expiration_time),
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def diff(local: dict[str, str], remote: dict[str, str]) -> tuple[list[str], list[str]]:
    """(to upsert, to delete) by key, from each side's digests: what the
    authority has that is missing or different here, and what is here but
    no longer there."""
    upsert = sorted(k for k, d in remote.items() if local.get(k) != d)
    delete = sorted(k for k in local if k not in remote)
    return upsert, delete


async def global_tokens(db: Database) -> list[federation_pb2.ReplicatedToken]:
    """Every global token of this region, with its secret's hash."""
    async with db.read() as conn:
        cur = await conn.execute(
            f"SELECT {acl_reads.TOKEN_COLUMNS}, secret_hash FROM acl_tokens WHERE global "
            "ORDER BY accessor_id"
        )
        rows = await cur.fetchall()
    # role links by id only: the same ids in every region, names read there
    return [
        federation_pb2.ReplicatedToken(token=acl_reads.token_from_row(r), secret_hash=r[10])
        for r in rows
    ]


def status_tag(status: federation_pb2.ReplicationStatus) -> str:
    return json_format.MessageToJson(status, indent=None)


def status_from_tag(text: str) -> federation_pb2.ReplicationStatus | None:
    try:
        return json_format.Parse(text, federation_pb2.ReplicationStatus())
    except json_format.ParseError:
        return None


class Replicator:
    """The two replication loops, run by the state leader while in office."""

    def __init__(
        self, federation: Federation, db: Database, write: Any, invalidate: Any, backoff: float
    ) -> None:
        self.federation = federation
        self.db = db
        self.write = write  # StateContext.write: returns once this process holds the index
        self.invalidate = invalidate
        self.backoff = backoff
        self.status = federation.replication

    async def run(self, leader: str) -> None:
        s = self.status
        s.enabled, s.status, s.leader = True, "starting", leader
        s.source_region = self.federation.authoritative_region
        log.info("ACL replication from region %s starting", s.source_region)
        try:
            await asyncio.gather(*(self._loop(what) for what in COPIED))
        finally:
            s.status = "stopped"

    async def _loop(self, what: str) -> None:
        """Copy one table (`what`, a key of `COPIED`) for as long as it runs."""
        method, answer_type, items, index_field = COPIED[what]
        apply = getattr(self, f"apply_{what}")
        index = 0
        source = self.federation.authoritative_region
        request = federation_pb2.ReplicationRequest(query=query_pb2.QueryOptions(wait_ms=WAIT_MS))
        while True:
            request.query.min_index = index
            try:
                answer = await self.federation.call(
                    source, method, request, answer_type.FromString, timeout=WAIT_MS / 1000 + 30
                )
                await apply(getattr(answer, items))
                index = answer.index
                setattr(self.status, index_field, index)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                reason = getattr(exc, "message", None) or (
                    exc.details() if hasattr(exc, "details") else str(exc)
                )
                log.warning("ACL %s replication from region %s failed: %s", what, source, reason)
                self.status.status = "failed"
                self.status.last_error = f"{what}: {reason}"
                self.status.last_error_time = time.time_ns()
                await asyncio.sleep(self.backoff)
                continue
            now = time.time_ns()
            self.status.status = "replicating"
            self.status.last_success = now
            metrics.ACL_REPLICATION_LAST_SUCCESS.set(now / 1e9)

    async def apply_policies(self, remote: Sequence[acl_pb2.ACLPolicy]) -> None:
        local = await acl_reads.list_policies(self.db, with_rules=True)
        upsert, delete = diff(
            {p.name: policy_digest(p) for p in local},
            {p.name: policy_digest(p) for p in remote},
        )
        if not upsert and not delete:
            return
        by_name = {p.name: p for p in remote}
        async with self.write() as tx:
            await acl_writes.replicate_policies(tx, [by_name[n] for n in upsert], delete)
        self.invalidate()
        log.info("ACL policies replicated: %d upserted, %d deleted", len(upsert), len(delete))

    async def apply_roles(self, remote: Sequence[acl_pb2.ACLRole]) -> None:
        local = await acl_reads.list_roles(self.db)
        upsert, delete = diff(
            {r.id: role_digest(r) for r in local},
            {r.id: role_digest(r) for r in remote},
        )
        if not upsert and not delete:
            return
        by_id = {r.id: r for r in remote}
        async with self.write() as tx:
            await acl_writes.replicate_roles(tx, [by_id[i] for i in upsert], delete)
        self.invalidate()
        log.info("ACL roles replicated: %d upserted, %d deleted", len(upsert), len(delete))

    async def apply_tokens(self, remote: Sequence[federation_pb2.ReplicatedToken]) -> None:
        local = await global_tokens(self.db)
        upsert, delete = diff(
            {t.token.accessor_id: token_digest(t) for t in local},
            {t.token.accessor_id: token_digest(t) for t in remote},
        )
        if not upsert and not delete:
            return
        by_id = {t.token.accessor_id: t for t in remote}
        async with self.write() as tx:
            await acl_writes.replicate_tokens(tx, [by_id[a] for a in upsert], delete)
        self.invalidate()
        log.info("global ACL tokens replicated: %d upserted, %d deleted", len(upsert), len(delete))
