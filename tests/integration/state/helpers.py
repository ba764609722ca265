"""Small builders for state tests."""

from __future__ import annotations

from corral.domain.structs import EvalStatus, JobType, Trigger, new_id
from corral.v1 import structs_pb2 as pb
from services.state.db.database import Database


def pending_eval(job_id: str = "web", **kw: object) -> pb.Evaluation:
    ev = pb.Evaluation(
        id=new_id(),
        namespace="default",
        priority=50,
        type=JobType.SERVICE,
        triggered_by=Trigger.JOB_REGISTER,
        job_id=job_id,
        status=EvalStatus.PENDING,
    )
    for k, v in kw.items():
        setattr(ev, k, v)
    return ev


CENSUS_TABLES = (
    "jobs",
    "job_versions",
    "job_summaries",
    "nodes",
    "allocs",
    "evals",
    "deployments",
    "periodic_launches",
    "change_log",
)


async def census(db: Database) -> dict[str, object]:
    """The index and, per table, the row count and a digest of every row's
    payload: equal before and after a refused call proves it wrote nothing
    (no index taken, no row added, removed or changed)."""
    out: dict[str, object] = {"index": await db.latest_index()}
    async with db.read(repeatable=True) as conn:
        for table in CENSUS_TABLES:
            cur = await conn.execute(
                f"SELECT count(*), md5(coalesce(string_agg(md5(payload), ',' "
                f"ORDER BY md5(payload)), '')) FROM {table}"
            )
            out[table] = await cur.fetchone()
    return out
