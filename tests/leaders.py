"""Holding a role's leader lock in a test, as an elected broker or planner
would, so that tests calling the state's fenced writes directly can name a
real leader (the state refuses those writes from anyone else)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg

from corral.runtime.leader import APP_PREFIX, role_lock_id

TEST_LEADER_ADDRESS = "test-leader.invalid:1"


@contextlib.contextmanager
def hold_leadership(dsn: str, role: str, address: str = TEST_LEADER_ADDRESS) -> Iterator[str]:
    """Take `role`'s advisory lock under `address` (the way
    `corral.runtime.leader.LeaderElection` does) until the block ends; yields the
    address to send as `leader_id`."""
    app_name = f"{APP_PREFIX}{role}:{address}"[:63]
    with psycopg.connect(dsn, autocommit=True, application_name=app_name) as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (role_lock_id(role),)).fetchone()
        assert row is not None and row[0], f"the {role} leader lock is held by someone else"
        yield address
