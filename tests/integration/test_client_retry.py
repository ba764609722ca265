"""Every channel from `corral.security.transport.dial` retries UNAVAILABLE with
backoff (the gRPC retry policy in its service config): a call made while
the state process restarts on the same port, or while its database
connections are being replaced, succeeds without the caller retrying."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import psycopg

from corral.security import transport
from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc
from tests.cluster import Cluster


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_a_call_to_a_restarting_state_is_retried_and_succeeds(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    address = free_address()
    c.start("state", "--listen", address)
    async with transport.dial(address) as ch:
        jobs = job_pb2_grpc.JobStub(ch)
        await jobs.Register(job_pb2.JobRegisterRequest(job=mock.job(job_id="before")))
        c.kill("state")
        # the call starts while nothing listens on the port (its first
        # attempts are refused) and ends on the state started after it
        call = asyncio.ensure_future(
            jobs.Register(job_pb2.JobRegisterRequest(job=mock.job(job_id="during")), timeout=30)
        )
        await c.start_async("state", "--listen", address)
        resp = await call
        assert resp.eval_id
        listed = await jobs.List(job_pb2.JobListRequest())
        assert {j.id for j in listed.jobs} == {"before", "during"}


async def test_a_call_over_a_dropped_database_connection_is_retried_and_succeeds(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    c.start("state")
    async with transport.dial(c.state_addr) as ch:
        jobs = job_pb2_grpc.JobStub(ch)
        await jobs.Register(job_pb2.JobRegisterRequest(job=mock.job(job_id="before")))
        # what a database restart does to every pooled connection
        with psycopg.connect(c.dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        resp = await jobs.Register(job_pb2.JobRegisterRequest(job=mock.job(job_id="after")))
        assert resp.eval_id
    # the state answered UNAVAILABLE at least once; the channel tried again
    assert "the state database is unavailable" in c.log("state")
