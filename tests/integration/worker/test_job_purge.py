"""Purging a job that still has live allocs stops them (`corral job stop
-purge`, Job.Deregister purge=true), through real state, broker, planner and
worker processes: the purge eval's plan carries no job (it is gone), the
planner and the state accept it because it only stops, and the eval
completes instead of failing at the delivery limit with the allocs left
running."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from corral.security import transport
from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.integration.worker.test_worker_process import (
    add_nodes,
    eval_status,
    job,
    register,
    start_servers,
)
from tests.wait import until


def desired_statuses(dsn: str, job_id: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT payload FROM allocs WHERE job_id = %s ORDER BY id", (job_id,)
        ).fetchall()
    return [pb.Allocation.FromString(r[0]).desired_status for r in rows]


def job_exists(dsn: str, job_id: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM jobs WHERE id = %s", (job_id,)).fetchone() is not None


def completed(dsn: str, eval_id: str) -> Callable[[], bool]:
    return lambda: eval_status(dsn, eval_id) == "complete"


async def purge(c: Cluster, job_id: str) -> str:
    async with transport.dial(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).Deregister(
            job_pb2.JobDeregisterRequest(job_id=job_id, namespace="default", purge=True)
        )
    return str(resp.eval_id)


async def test_purging_a_job_with_live_allocs_stops_them(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    start_servers(c)
    c.start("worker", "--num-schedulers", "2")
    await add_nodes(c.dsn, 2)
    system = mock.system_job(job_id="purge-sys")
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        system.ClearField(name)  # type: ignore[arg-type]
    jobs = {"purge-svc": job("purge-svc", count=3), "purge-sys": system}
    for j in jobs.values():
        eval_id = await register(c, j)
        await until(completed(c.dsn, eval_id))
        assert set(desired_statuses(c.dsn, j.id)) == {"run"}

    for job_id in jobs:
        eval_id = await purge(c, job_id)
        assert not job_exists(c.dsn, job_id)
        await until(completed(c.dsn, eval_id))
        statuses = desired_statuses(c.dsn, job_id)
        assert len(statuses) == (3 if job_id == "purge-svc" else 2)
        assert set(statuses) == {"stop"}, statuses
