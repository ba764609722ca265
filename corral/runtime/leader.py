"""Leader election with a PostgreSQL advisory lock.

The candidate holds `pg_try_advisory_lock(role lock)` on a dedicated,
non-pooled connection (STYLE.md: a session lock on a pooled connection
survives its return to the pool). Losing the connection loses the lock, so
a keepalive query detects it and the leader steps down. Standbys retry.

The leader's address is published without a table: the leader's connection
sets `application_name` to `corral:<role>:<address>`, and anyone can find it
through `pg_locks` joined to `pg_stat_activity` for that advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from corral.runtime import telemetry

log = logging.getLogger(__name__)

APP_PREFIX = "corral:"


def role_lock_id(role: str) -> int:
    """A stable 63-bit advisory lock key per role."""
    digest = hashlib.sha256(f"corral-leader:{role}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


async def find_leader(dsn: str, role: str, lock_id: int | None = None) -> str:
    """The address of the current holder of the role's lock, or ''."""
    key = role_lock_id(role) if lock_id is None else lock_id
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await _holder(conn, key)


async def _holder(conn: psycopg.AsyncConnection[Any], key: int) -> str:
    # advisory locks are per database: another database on the same server
    # (another cluster, another test module) may have a leader of its own
    cur = await conn.execute(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND ((l.classid::bigint << 32) | l.objid::bigint) = %s",
        (key,),
    )
    row = await cur.fetchone()
    if row is None or not row[0]:
        return ""
    name = str(row[0])
    # corral:<role>:<host:port>
    parts = name.split(":", 2)
    return parts[2] if len(parts) == 3 and name.startswith(APP_PREFIX) else ""


class LeaderElection:
    def __init__(
        self,
        dsn: str,
        role: str,
        address: str,
        *,
        lock_id: int | None = None,
        retry_interval: float = 1.0,
        keepalive_interval: float = 1.0,
        keepalive_timeout: float = 5.0,
    ) -> None:
        self.dsn = dsn
        self.role = role
        self.address = address
        self.lock_id = role_lock_id(role) if lock_id is None else lock_id
        self.retry_interval = retry_interval
        self.keepalive_interval = keepalive_interval
        #: a keepalive unanswered this long means the lock's connection is
        #: gone: step down. A process stalled meanwhile (a long callback, a
        #: starved CPU) does not lose it: the answer waiting in the socket is
        #: read before the timeout is (tests/integration/test_leader.py)
        self.keepalive_timeout = keepalive_timeout
        self._leader = False
        self._stop = asyncio.Event()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._query_conn: psycopg.AsyncConnection[Any] | None = None
        self._leader_gauge = telemetry.LEADER.labels(role)
        self._leader_gauge.set(0)

    @property
    def is_leader(self) -> bool:
        return self._leader

    async def run(
        self,
        on_elected: Callable[[], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
    ) -> None:
        """Campaign until stop(): call on_elected when the lock is won and
        on_lost when it is lost (connection gone) or released."""
        while not self._stop.is_set():
            try:
                won = await self._campaign()
            except (psycopg.Error, OSError) as exc:
                log.warning("%s election: %s", self.role, exc)
                won = False
            if won:
                self._leader = True
                self._leader_gauge.set(1)
                log.info("%s: elected leader at %s", self.role, self.address)
                try:
                    await on_elected()
                    await self._hold()
                except Exception as exc:
                    # a leader that cannot take office (e.g. its restore
                    # failed) steps down and campaigns again
                    log.error("%s: leadership setup failed, stepping down: %s", self.role, exc)
                finally:
                    self._leader = False
                    self._leader_gauge.set(0)
                    await self._close()
                    log.info("%s: leadership lost", self.role)
                    await on_lost()
            else:
                await self._close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.retry_interval)

    async def _campaign(self) -> bool:
        app_name = f"{APP_PREFIX}{self.role}:{self.address}"[:63]
        self._conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, application_name=app_name
        )
        cur = await self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.lock_id,))
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _hold(self) -> None:
        """Keep the lock until the connection fails or stop() is called."""
        assert self._conn is not None
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(
                    self._conn.execute("SELECT 1"), timeout=self.keepalive_timeout
                )
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.error("%s: leader connection lost: %s", self.role, exc)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.keepalive_interval)

    async def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    async def stop(self) -> None:
        """Stop campaigning and release the lock (closing its connection)."""
        self._stop.set()
        await self._close()
        if self._query_conn is not None:
            with contextlib.suppress(Exception):
                await self._query_conn.close()
            self._query_conn = None

    async def leader_address(self) -> str:
        """Where the current leader listens ('' during an election)."""
        if self._leader:
            return self.address
        try:
            if self._query_conn is None or self._query_conn.closed:
                self._query_conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            return await _holder(self._query_conn, self.lock_id)
        except (psycopg.Error, OSError) as exc:
            log.debug("%s: leader lookup failed: %s", self.role, exc)
            self._query_conn = None
            return ""
