"""Leaders in tests: holding a role's leader lock as an elected broker or
planner would, so that tests calling the state's fenced writes directly can
name a real leader (the state refuses those writes from anyone else); and
waiting until a started broker or planner has taken office before calling
it directly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.runtime.leader import APP_PREFIX, role_lock_id
from corral.runtime.probe import LEADER_SERVICE
from corral.security import transport
from tests.wait import until

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


async def in_office(address: str, timeout: float = 45.0) -> None:
    """Wait until the broker or planner at `address` leads and has taken
    office (its `LEADER_SERVICE` health is SERVING: elected and restored).

    A leader role writes its ready file once it listens, before its
    election: called at once, it may still be campaigning or restoring
    ("taking office", UNAVAILABLE). Roles follow the leader and retry
    (`corral.runtime.rpc.LeaderChannel`); a test calling one broker with a
    bare stub must wait for this instead (issue 26, finding 9)."""
    async with transport.dial(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def serving() -> bool:
            try:
                reply = await stub.Check(
                    health_pb2.HealthCheckRequest(service=LEADER_SERVICE), timeout=5
                )
            except grpc.aio.AioRpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

        await until(serving, timeout, what=f"the leader at {address} in office")
