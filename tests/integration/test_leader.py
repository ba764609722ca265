"""Advisory-lock leader election against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from corral.runtime.leader import LeaderElection, find_leader
from tests.wait import until


async def test_one_leader_standby_takes_over_and_address_is_published(fresh_pg_dsn: str) -> None:
    events: list[str] = []

    def callbacks(name: str) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
        async def elected() -> None:
            events.append(f"{name}+")

        async def lost() -> None:
            events.append(f"{name}-")

        return elected, lost

    a = LeaderElection(
        fresh_pg_dsn, "testrole", "10.0.0.1:4647", retry_interval=0.1, keepalive_interval=0.1
    )
    b = LeaderElection(
        fresh_pg_dsn, "testrole", "10.0.0.2:4647", retry_interval=0.1, keepalive_interval=0.1
    )
    ta = asyncio.create_task(a.run(*callbacks("a")))
    await until(lambda: a.is_leader)
    tb = asyncio.create_task(b.run(*callbacks("b")))
    await asyncio.sleep(0.3)
    assert a.is_leader and not b.is_leader
    assert await b.leader_address() == "10.0.0.1:4647"
    assert await find_leader(fresh_pg_dsn, "testrole") == "10.0.0.1:4647"

    # the leader's connection dies (as when its process is killed): the
    # standby wins the lock and the old leader notices it lost it
    with psycopg.connect(fresh_pg_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            ("corral:testrole:10.0.0.1:4647",),
        )
    await until(lambda: b.is_leader)
    await until(lambda: "a-" in events)
    assert await find_leader(fresh_pg_dsn, "testrole") == "10.0.0.2:4647"
    # the old leader steps down within its keepalive interval; writes made
    # in that window are fenced by the state service (leader_id checks)

    await a.stop()
    await b.stop()
    await asyncio.gather(ta, tb)
    assert events[-1] == "b-"
    assert await find_leader(fresh_pg_dsn, "testrole") == ""


async def test_a_failed_takeover_steps_down_and_campaigns_again(fresh_pg_dsn: str) -> None:
    attempts: list[str] = []

    async def elected() -> None:
        attempts.append("+")
        if len(attempts) == 1:
            raise ConnectionError("restore failed")

    async def lost() -> None:
        attempts.append("-")

    e = LeaderElection(
        fresh_pg_dsn, "flaky", "10.0.0.3:4647", retry_interval=0.1, keepalive_interval=0.1
    )
    task = asyncio.create_task(e.run(elected, lost))
    await until(lambda: attempts[:3] == ["+", "-", "+"] and e.is_leader)
    assert await find_leader(fresh_pg_dsn, "flaky") == "10.0.0.3:4647"
    await e.stop()
    await task
    assert attempts == ["+", "-", "+", "-"]


async def test_a_stalled_leader_keeps_its_lock(fresh_pg_dsn: str) -> None:
    """A busy machine must not cost a leader its lock (issue 26, finding
    9): the process stalls longer than the keepalive timeout while a
    keepalive is in flight (a long callback; a starved CPU looks the same
    from inside), yet the answer waiting in its socket is read before the
    timeout fires, and it stays leader with the same connection."""
    events: list[str] = []

    async def elected() -> None:
        events.append("+")

    async def lost() -> None:
        events.append("-")

    a = LeaderElection(
        fresh_pg_dsn,
        "stallrole",
        "10.0.0.1:4647",
        retry_interval=0.1,
        keepalive_interval=0.05,
        keepalive_timeout=0.5,
    )
    task = asyncio.create_task(a.run(elected, lost))
    await until(lambda: a.is_leader)
    conn = a._conn
    assert conn is not None
    loop = asyncio.get_running_loop()
    real_execute = conn.execute
    answered: list[int] = []

    async def stalled_execute(*args: Any, **kwargs: Any) -> Any:
        if len(answered) < 3:  # block the loop just after the query is sent
            loop.call_soon(time.sleep, 1.5)
        result = await real_execute(*args, **kwargs)
        answered.append(1)
        return result

    conn.execute = stalled_execute  # type: ignore[method-assign]
    # three stalled keepalives, then two plain ones on the same connection
    await until(lambda: len(answered) >= 5 or not a.is_leader, what="five keepalives")
    assert a.is_leader and a._conn is conn and events == ["+"]
    assert await find_leader(fresh_pg_dsn, "stallrole") == "10.0.0.1:4647"
    await a.stop()
    await task
