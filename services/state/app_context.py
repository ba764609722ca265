"""What every handler of the state service shares: the database, the
batcher that coalesces small writes, the change feed (with its local copy of
the state), the ACL token resolver, the node secret checks for what is
read from that copy, the keyring and workload identities, and the shutdown
signal.

Handlers write through `write()` or `batcher.submit()`, never
`db.write()` directly: both return only once the feed holds the index the
write committed at, which is what makes every read on this process reflect
every write it acknowledged (read-your-writes, docs/consistency.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from corral.runtime.slow_readers import STALL_TIMEOUT_S
from services.state.acl import DatabaseResolver
from services.state.call_limits import CallLimits
from services.state.config import KeyringSettings
from services.state.db.database import Database, WriteTx
from services.state.federation.links import Federation
from services.state.feed import ChangeFeed
from services.state.identities import Identities
from services.state.keyring import Keyring
from services.state.node_identity import NodeSecrets
from services.state.writes.batch import WriteBatcher


@dataclass
class StateContext:
    db: Database
    feed: ChangeFeed
    address: str = ""
    member_id: str = ""
    #: the largest job submission kept (StateSettings.job_max_source_size)
    job_max_source_size: int = 1_000_000
    #: the largest snapshot a restore accepts (StateSettings.snapshot_max_bytes)
    snapshot_max_bytes: int = 2 * 2**30
    shutting_down: asyncio.Event = field(default_factory=asyncio.Event)
    #: bounds on the calls that wait (blocking queries, streams)
    limits: CallLimits = field(default_factory=CallLimits)
    #: a stream reader taking nothing this long is dropped (slow_readers)
    stream_stall_timeout: float = STALL_TIMEOUT_S
    keyring_settings: KeyringSettings = field(default_factory=KeyringSettings)
    region: str = "global"
    #: the links to the other regions of a federation (set by the state app)
    federation: Federation | None = None
    batcher: WriteBatcher = field(init=False)
    #: tokens to ACLs, from the database (the access interceptor's Resolver)
    acl: DatabaseResolver = field(init=False)
    node_secrets: NodeSecrets = field(init=False)
    #: root keys: Variables' encryption, workload identities' signatures
    keyring: Keyring = field(init=False)
    identities: Identities = field(init=False)

    def __post_init__(self) -> None:
        self.batcher = WriteBatcher(self.db, visible=self.feed.wait_visible)
        self.acl = DatabaseResolver(self.db)
        self.node_secrets = NodeSecrets(self.db)
        self.keyring = Keyring(self.db, self.keyring_settings)
        self.identities = Identities(self.keyring, self.feed, self.write, region=self.region)
        if self.keyring.configured:
            self.acl.workloads = self.identities

    @contextlib.asynccontextmanager
    async def write(self, count: int = 1) -> AsyncIterator[WriteTx]:
        """`Database.write`, returning once this process's state shows it."""
        async with self.db.write(count) as tx:
            yield tx
        await self.feed.wait_visible(tx.index)
