"""What every handler of the state service shares: the database, the
batcher that coalesces small node writes, the change feed (with its local
copy of the state) and the shutdown signal."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from services.state.db.database import Database
from services.state.feed import ChangeFeed
from services.state.writes.batch import WriteBatcher


@dataclass
class StateContext:
    db: Database
    feed: ChangeFeed
    address: str = ""
    member_id: str = ""
    shutting_down: asyncio.Event = field(default_factory=asyncio.Event)
    batcher: WriteBatcher = field(init=False)

    def __post_init__(self) -> None:
        self.batcher = WriteBatcher(self.db)
