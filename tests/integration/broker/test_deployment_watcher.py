"""The deployment watcher inside real broker processes over a real state
process and PostgreSQL: the leader ends a deployment whose allocs are all
healthy (the job version becomes stable) and sends the roll-out eval for
one with healthy allocs; a standby that takes over after the leader is
killed picks up a deployment written while nobody led."""

from __future__ import annotations

from collections.abc import Callable

from corral.domain import deployments
from corral.domain.structs import HOUR, DeploymentStatus, Trigger, now_ns
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.state.db.database import Database
from tests.cluster import Cluster
from tests.integration.broker.test_broker_process import FAST
from tests.wait import until


async def _write(dsn: str, job: pb.Job, d: pb.Deployment) -> None:
    db = Database(dsn, pool_size=1)
    try:
        async with db.write() as tx:
            if await tx.get_job(job.namespace, job.id) is None:
                tx.put_job(job)
            tx.put_deployment(d)
    finally:
        await db.close()


async def _read(
    dsn: str, job: pb.Job, d: pb.Deployment
) -> tuple[pb.Deployment, pb.Job, list[pb.Evaluation]]:
    """The deployment, the job's version and the job's evals as stored."""
    db = Database(dsn, pool_size=1)
    try:
        async with db.write() as tx:
            got = await tx.get_deployment(d.id)
            version = await tx.get_job_version(job.namespace, job.id, job.version)
            evals = await tx.evals_by_job(job.namespace, job.id)
    finally:
        await db.close()
    assert got is not None and version is not None
    return got, version, evals


def _deployment(job: pb.Job, *, healthy: int) -> pb.Deployment:
    d = deployments.new_deployment(job, 0)
    d.task_groups["web"].CopyFrom(
        pb.DeploymentState(
            desired_total=2,
            placed_allocs=2,
            healthy_allocs=healthy,
            progress_deadline=HOUR,
            require_progress_by=now_ns() + HOUR,
        )
    )
    return d


async def _ended(dsn: str, job: pb.Job, d: pb.Deployment) -> bool:
    got, version, _ = await _read(dsn, job, d)
    return got.status == DeploymentStatus.SUCCESSFUL and version.stable


async def test_the_leader_ends_deployments_and_a_new_leader_takes_over(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    c.start("state")
    c.start("broker", *FAST, name="broker")
    job = mock.job(job_id="watched", count=2)
    job.update.CopyFrom(pb.UpdateStrategy(max_parallel=1))

    done = _deployment(job, healthy=2)
    await _write(c.dsn, job, done)
    await until(lambda: _ended(c.dsn, job, done), what="the deployment successful, v0 stable")

    standby = c.start("broker", *FAST, name="broker2")
    c.kill("broker")
    # written while the new leader is (about to be) elected: picked up from
    # its replica when it takes over
    rolling = _deployment(job, healthy=1)
    await _write(c.dsn, job, rolling)

    async def rolled() -> bool:
        _, _, evals = await _read(c.dsn, job, rolling)
        return any(
            e.triggered_by == Trigger.DEPLOYMENT_WATCHER and e.deployment_id == rolling.id
            for e in evals
        )

    await until(rolled, timeout=60, what="the new leader's roll-out eval")
    assert standby.alive
