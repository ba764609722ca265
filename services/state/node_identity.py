"""Node identity: a client node proves who it is with its secret id.

Every node RPC (Register, UpdateStatus, UpdateAlloc, GetClientAllocs)
carries the secret the node registered with; an empty or different one is
PERMISSION_DENIED. Before this check was mandatory, an empty secret skipped
it: anyone who knew a node id could read that node's allocs, fail them, or
re-register the node with made-up resources.

The state keeps only a SHA-256 of each secret (`Node.secret_hash`), in its
nodes table and nowhere else: `WriteTx.put_node` replaces a secret by its
hash, records the change-log event without it, and the snapshot dump drops
it, so neither the change log, `State.Snapshot`/`Subscribe`,
`Event.Stream`, the feed's in-memory copy, nor any replica ever holds it. A
database dump holds no usable secret (the node keeps its secret in its own
data dir). Hashes are compared with `hmac.compare_digest`.

Writes check the secret on the row they read inside their transaction
(`check`). Reads and the heartbeat's timer reset are served from the feed's
snapshot, which holds no hash: they ask `NodeSecrets`, which reads the hash
from the table once per node incarnation (id and create index) and
remembers it.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

from corral.domain.errors import InvalidArgument, NotFound, PermissionDenied
from corral.v1 import structs_pb2 as pb

#: longer secrets are refused; Nomad's (and ours) are UUIDs
SECRET_MAX_LENGTH = 128
#: node incarnations `NodeSecrets` remembers before it starts over
CACHE_MAX_NODES = 100_000


def hash_secret(secret_id: str) -> str:
    return hashlib.sha256(secret_id.encode()).hexdigest()


def require_secret(secret_id: str, node_id: str, field: str = "secret_id") -> None:
    """Refuse a node RPC that carries no secret, before anything is read."""
    if not secret_id:
        raise PermissionDenied(f"node {node_id}: {field} is required")
    if len(secret_id) > SECRET_MAX_LENGTH:
        raise InvalidArgument(field, f"must be at most {SECRET_MAX_LENGTH} characters")


def stored_hash(node: pb.Node) -> str:
    """The hash a stored node row holds (a row written before secrets were
    hashed holds the secret itself until its next write)."""
    if node.secret_hash:
        return node.secret_hash
    return hash_secret(node.secret_id) if node.secret_id else ""


def _matches(want: str, secret_id: str) -> bool:
    return bool(want) and hmac.compare_digest(want, hash_secret(secret_id))


def check(stored: pb.Node, secret_id: str) -> None:
    """The caller holds `stored`'s secret (`stored` read from the table)."""
    require_secret(secret_id, stored.id)
    if not _matches(stored_hash(stored), secret_id):
        raise PermissionDenied(f"node {stored.id}: secret id does not match")


def seal(node: pb.Node) -> None:
    """Replace the node's secret by its hash (what the table stores)."""
    if node.secret_id:
        node.secret_hash = hash_secret(node.secret_id)
        node.secret_id = ""


def redact(node: pb.Node) -> None:
    """Drop the secret and its hash: what every reader gets."""
    node.secret_id = ""
    node.secret_hash = ""


class NodeTable(Protocol):
    """Where `NodeSecrets` reads a node's row (the state's `Database`,
    whose writes seal node rows with this module)."""

    async def get_node(self, node_id: str) -> pb.Node | None: ...


class NodeSecrets:
    """Secret checks for what is served from the feed's snapshot (which
    holds no hashes): the hash is read from the nodes table once per node
    incarnation, then remembered."""

    def __init__(self, db: NodeTable) -> None:
        self.db = db
        self._hashes: dict[str, tuple[int, str]] = {}

    def forget(self) -> None:
        """The state was replaced (a snapshot restore)."""
        self._hashes.clear()

    async def check(self, node: pb.Node, secret_id: str) -> None:
        """The caller holds the secret of `node` (as the snapshot shows it)."""
        require_secret(secret_id, node.id)
        known = self._hashes.get(node.id)
        if known is None or known[0] != node.create_index:
            stored = await self.db.get_node(node.id)
            if stored is None:
                raise NotFound(f"node {node.id} not found")
            known = (stored.create_index, stored_hash(stored))
            if len(self._hashes) >= CACHE_MAX_NODES:
                self._hashes.clear()
            self._hashes[node.id] = known
        if not _matches(known[1], secret_id):
            raise PermissionDenied(f"node {node.id}: secret id does not match")
