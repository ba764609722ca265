"""Worker.List shows the pool to operator:read, and the eval a worker runs
only to a caller who may read-job in that eval's namespace (found while
building issue 26's namespace audit: an operator reader of one namespace
saw the ids of other namespaces' evals while they were scheduled; the
audit's own calls only catch it when a worker is busy at that moment)."""

from __future__ import annotations

from typing import Any

from corral.security import acl
from services.worker.config import WorkerSettings
from services.worker.pool import WorkerPool
from services.worker.worker import Worker


def _pool() -> WorkerPool:
    nothing: Any = None
    settings = WorkerSettings(
        state_addr="127.0.0.1:1", broker_addrs=["127.0.0.1:2"], planner_addrs=["127.0.0.1:3"]
    )
    pool = WorkerPool(settings, nothing, nothing, nothing, nothing)
    for name, namespace in (("w-a", "team-a"), ("w-b", "team-b")):
        w = Worker(pool, name)
        w.current_eval_id = f"eval-of-{namespace}"
        w.current_eval_namespace = namespace
        pool.workers.append(w)
    return pool


def test_the_running_eval_shows_only_where_the_caller_may_read_jobs() -> None:
    pool = _pool()
    reader = acl.compile_acl(
        [acl.parse_policy('namespace "team-a" { policy = "read" }\noperator { policy = "read" }')]
    )
    token = acl.CURRENT.set(reader)
    try:
        shown = {w.id: w.current_eval_id for w in pool.info()}
    finally:
        acl.CURRENT.reset(token)
    assert shown == {"w-a": "eval-of-team-a", "w-b": ""}
    # a management token (and ACLs off) sees every one
    assert {w.current_eval_id for w in pool.info()} == {"eval-of-team-a", "eval-of-team-b"}
    pool.executor.shutdown()
