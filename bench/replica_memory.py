"""Bytes a replica holds per object (issue 19: the goal is <= 2 KB per alloc).

    .venv/bin/python -m bench.replica_memory [--jobs 2000] [--count 5] [--json out.json]

Feeds a `StateStore` the way a replica is fed: every job's registration
(job + eval), then every job's plan (its allocs), each one serialized
`ChangeBatch` parsed from bytes as gRPC parses them, and applied. Every
batch is dropped, so what stays is what the store keeps; the plans' growth
divided by the allocs is the figure per alloc (its map entries and its
three secondary-index entries included), the registrations' divided by
the jobs the figure per job with its eval. Allocs carry the placement
metrics the scheduler writes on a 100-node cluster. Measured twice, each on
a fresh store: as the state service keeps allocs (whole) and as a replica
keeps them (`lean`: without placement metrics, see `corral.domain.store.lean_batch`).
RSS first, then the Python heap (tracemalloc) on another fill: protobuf
messages live in upb arenas outside the Python heap, so RSS is the figure
that counts, and tracemalloc shows the maps and indexes around them.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tracemalloc
from typing import Any

import psutil

from corral.domain import topics
from corral.domain.store import StateStore
from corral.domain.topics import EventType
from corral.testing import mock
from corral.v1 import structs_pb2 as pb


def real_metrics() -> pb.AllocMetric:
    """The placement metrics the scheduler writes on an alloc (100 nodes)."""
    from corral.testing.harness import Harness

    h = Harness()
    h.upsert_nodes(*[mock.node() for _ in range(100)])
    job = mock.job(count=1)
    h.upsert_jobs(job)
    h.process(job.type, mock.eval_for(job))
    return next(iter(h.snapshot().allocs.values())).metrics


def batches(jobs: int, count: int, nodes: list[pb.Node]) -> tuple[list[bytes], list[bytes]]:
    """(registrations: job + eval each, plans: the job's allocs + its eval
    completed each), serialized."""
    regs: list[bytes] = []
    plans: list[bytes] = []
    metrics = real_metrics()
    index = 10
    for j in range(jobs):
        job = mock.job(count=count)
        job.id = f"mem-{j}"
        ev = mock.eval_for(job)
        reg = pb.ChangeBatch(index=index)
        reg.events.add(topic=topics.JOB.name, type=EventType.JOB_REGISTERED, job=job)
        reg.events.add(
            topic=topics.EVALUATION.name, type=EventType.EVALUATION_UPDATED, evaluation=ev
        )
        regs.append(reg.SerializeToString())
        index += 1
    for j in range(jobs):
        plan = pb.ChangeBatch(index=index)
        job_id = f"mem-{j}"
        job = mock.job(count=count)
        job.id = job_id
        for i in range(count):
            a = mock.alloc(job, nodes[(j * count + i) % len(nodes)])
            a.name = f"{job_id}.web[{i}]"
            a.metrics.CopyFrom(metrics)
            plan.events.add(topic=topics.ALLOCATION.name, type=EventType.PLAN_RESULT, allocation=a)
        plans.append(plan.SerializeToString())
        index += 1
    return regs, plans


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def _fill(jobs: int, count: int, *, trace: bool, lean: bool) -> tuple[StateStore, int, int]:
    """A store fed every registration, then every plan; (the store, bytes
    the registrations and the plans each grew it by: RSS, or the Python
    heap when `trace`)."""
    nodes = [mock.node() for _ in range(100)]
    store = StateStore(lean=lean)
    store.apply(
        pb.ChangeBatch(index=1, events=[pb.Event(topic=topics.NODE.name, node=n) for n in nodes])
    )
    regs, plans = batches(jobs, count, nodes)
    gc.collect()
    if trace:
        tracemalloc.start()

    def now() -> int:
        return tracemalloc.get_traced_memory()[0] if trace else rss()

    grown = []
    for payloads in (regs, plans):
        before = now()
        for raw in payloads:
            store.apply(pb.ChangeBatch.FromString(raw))
        payloads.clear()
        gc.collect()
        grown.append(now() - before)
    if trace:
        tracemalloc.stop()
    return store, grown[0], grown[1]


def measure(jobs: int, count: int, *, lean: bool) -> dict[str, Any]:
    """RSS first (tracemalloc's own bookkeeping would inflate it), then the
    Python heap on a second store."""
    store, job_rss, alloc_rss = _fill(jobs, count, trace=False, lean=lean)
    allocs = len(store.snapshot().allocs)
    del store
    gc.collect()
    _, job_heap, alloc_heap = _fill(jobs, count, trace=True, lean=lean)
    return {
        "store": "replica (lean)" if lean else "state (full allocs)",
        "jobs": jobs,
        "allocs": allocs,
        "rss_per_alloc": round(alloc_rss / allocs),
        "heap_per_alloc": round(alloc_heap / allocs),
        "rss_per_job_and_eval": round(job_rss / jobs),
        "heap_per_job_and_eval": round(job_heap / jobs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.replica_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--count", type=int, default=5, help="allocs per job")
    p.add_argument("--json", default="")
    p.add_argument("--store", choices=("full", "lean"), help="measure one store, in this process")
    a = p.parse_args(argv)
    if a.store:
        print(json.dumps(measure(a.jobs, a.count, lean=a.store == "lean")))
        return 0
    results = []
    for store in ("full", "lean"):  # each in a fresh process: RSS is per process
        out = subprocess.run(
            [sys.executable, "-m", "bench.replica_memory", "--jobs", str(a.jobs)]
            + ["--count", str(a.count), "--store", store],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(out.stdout.splitlines()[-1])
        results.append(result)
        print(
            f"{result['store']}: {result['allocs']} allocs of {result['jobs']} jobs: "
            f"{result['rss_per_alloc']} B RSS per alloc (Python heap {result['heap_per_alloc']}); "
            f"{result['rss_per_job_and_eval']} B per job with its eval "
            f"(heap {result['heap_per_job_and_eval']})"
        )
    print(json.dumps(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
