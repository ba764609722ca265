"""A real worker process with a small placement limit (below the state's
own cap, which would refuse the job at the door): an eval asking for more
fails with a description, the worker stays up, and the next job is
scheduled by the same process."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.integration.worker.test_worker_process import (
    add_nodes,
    eval_status,
    job,
    placed,
    register,
    start_servers,
)
from tests.wait import until


def eval_description(dsn: str, eval_id: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT payload FROM evals WHERE id = %s", (eval_id,)).fetchone()
    return pb.Evaluation.FromString(row[0]).status_description if row else ""


async def test_eval_over_the_limit_fails_and_the_worker_lives_on(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    start_servers(c)
    c.start("worker", "--num-schedulers", "1", "--max-placements-per-eval", "50")
    await add_nodes(c.dsn)
    big = await register(c, job("too-big", count=5_000))
    await until(lambda: eval_status(c.dsn, big) == "failed")
    assert "5000 placements" in eval_description(c.dsn, big)
    assert "limit of 50" in eval_description(c.dsn, big)
    assert placed(c.dsn, "too-big") == 0
    small = await register(c, job("small", count=3))
    await until(lambda: eval_status(c.dsn, small) == "complete")
    assert placed(c.dsn, "small") == 3
    assert c.procs["worker"].alive
