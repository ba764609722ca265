"""A database that goes away under the state service is UNAVAILABLE to the
caller (retryable), never INTERNAL, and the database's own text stays in
the log; the next call, on a fresh connection, succeeds."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import psycopg
import pytest

from corral.security import transport
from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc
from services.state.app import StateApp, StateSettings
from tests.wait import until


@pytest.fixture
async def app(fresh_pg_dsn: str) -> AsyncIterator[StateApp]:
    a = StateApp(StateSettings(dsn=fresh_pg_dsn, retention_interval=3600))
    await a.start()
    try:
        yield a
    finally:
        await a.stop()


async def test_a_dropped_database_connection_is_unavailable_then_recovers(
    app: StateApp, fresh_pg_dsn: str
) -> None:
    # retries off: this test looks at the first answer (test_client_retry.py
    # shows a default channel riding over the same failure)
    async with transport.dial(app.server.bound_address, options=[("grpc.enable_retries", 0)]) as ch:
        jobs = job_pb2_grpc.JobStub(ch)
        await jobs.Register(job_pb2.JobRegisterRequest(job=mock.job(job_id="before")))
        # what a database restart does to every pooled connection. The pool
        # may replace a dead connection before the next call takes it (it
        # did once on a loaded machine): kill again until a call meets one
        refused: grpc.aio.AioRpcError | None = None
        for attempt in range(5):
            with psycopg.connect(fresh_pg_dsn, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
            assert killed is not None and killed[0] >= 1
            try:
                await jobs.Register(
                    job_pb2.JobRegisterRequest(job=mock.job(job_id=f"during-{attempt}"))
                )
            except grpc.aio.AioRpcError as exc:
                refused = exc
                break
        assert refused is not None, "no call met a dropped connection in five tries"
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused.details()
        assert "terminat" not in (refused.details() or "")  # no database text

        async def registers() -> bool:
            try:
                await jobs.Register(job_pb2.JobRegisterRequest(job=mock.job(job_id="after")))
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                return False
            return True

        await until(registers, 30, what="a registration after the reconnect")
