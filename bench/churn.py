"""Churn with short GC thresholds: does every role's memory stay flat?

    .venv/bin/python -m bench.churn [--minutes 10] [--rate 4.4] [--nodes 300]
        [--gc-threshold 30] [--gc-interval 10] [--warmup 90] [--json out.json]

A cluster of real processes (bench/cluster.py: embedded PostgreSQL, state,
broker, planner, one worker, the node simulator) runs with every GC
threshold set to `--gc-threshold` seconds and the leader's GC evals every
`--gc-interval` seconds. For `--minutes`, jobs of `--count` allocs are
registered at `--rate` per second and each is stopped `--lifetime` seconds
later, every other one purged (`job stop -purge`) — issue 19's churn, which
grew every role about 3x in 10 minutes when nothing was collected.

Each role's RSS is sampled once the warm-up is over (`--warmup` seconds of
the same churn: imports, caches, gRPC buffers and the steady-state set of
live objects are all in place by then) and at the end, still under churn;
the objects held in the database are counted at both moments too. Prints a
table and one JSON line; exits 1 if any role's RSS ended more than
`--max-growth` (25%) above its start, 2 if the cluster failed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench.cluster import BenchCluster, ClusterSpec
from bench.jobs import service
from corral.security import transport
from corral.v1 import job_pb2, job_pb2_grpc

#: the roles whose memory is judged (PostgreSQL is not ours; its RSS is shared)
ROLES = ("state", "broker", "planner", "worker0", "sim")
#: register/stop calls in flight at most, so a slow cluster backs up here
IN_FLIGHT = 8


@dataclass
class Options:
    minutes: float = 10.0
    rate: float = 4.4
    nodes: int = 300
    count: int = 5
    lifetime: float = 20.0
    cpu: int = 20
    memory: int = 32
    gc_threshold: float = 30.0
    gc_interval: float = 10.0
    warmup: float = 90.0
    max_growth: float = 0.25


@dataclass
class Churn:
    """What the driver did."""

    registered: int = 0
    stopped: int = 0
    purged: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


def gc_env(opts: Options) -> dict[str, str]:
    """Every GC threshold short, and the leader's GC evals frequent."""
    t = str(opts.gc_threshold)
    return {
        "CORRAL_WORKER_EVAL_GC_THRESHOLD": t,
        "CORRAL_WORKER_BATCH_EVAL_GC_THRESHOLD": t,
        "CORRAL_WORKER_JOB_GC_THRESHOLD": t,
        "CORRAL_WORKER_DEPLOYMENT_GC_THRESHOLD": t,
        "CORRAL_WORKER_NODE_GC_THRESHOLD": t,
        "CORRAL_BROKER_CORE_GC_INTERVAL": str(opts.gc_interval),
    }


def rss_mb(cluster: BenchCluster) -> dict[str, float]:
    return rss_of({name: rp.pid for name, rp in cluster.roles.items() if name in ROLES})


def rss_of(pids: dict[str, int]) -> dict[str, float]:
    """Each process's RSS in MB (0 for one that is gone)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            out[name] = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
        except psutil.Error:
            out[name] = 0.0
    return out


def held_objects(dsn: str) -> dict[str, int]:
    """Rows the state holds (what every replica holds too)."""
    import psycopg

    counts: dict[str, int] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("jobs", "job_versions", "evals", "allocs", "deployments"):
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608
            counts[table] = int(row[0]) if row else 0
    return counts


async def drive(
    state_addr: str, opts: Options, churn: Churn, until: float, tick: Callable[[float], None]
) -> None:
    """Register at the rate; stop each job its lifetime later, every other
    one purged; `tick(seconds since the start)` between steps (health
    checks, samples)."""
    async with transport.dial(state_addr) as channel:
        jobs = job_pb2_grpc.JobStub(channel)
        live: collections.deque[tuple[float, str]] = collections.deque()
        slots = asyncio.Semaphore(IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        started = time.monotonic()

        async def call(kind: str, coro: Any) -> None:
            async with slots:
                try:
                    await coro
                except Exception as exc:  # counted and reported, never fatal
                    code = getattr(exc, "code", lambda: None)()
                    churn.errors[f"{kind}:{code.name if code else type(exc).__name__}"] += 1

        def spawn(kind: str, coro: Any) -> None:
            task = asyncio.create_task(call(kind, coro))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        n = 0
        while True:
            now = time.monotonic()
            if now >= until:
                break
            tick(now - started)
            while live and live[0][0] <= now:
                _, job_id = live.popleft()
                purge = churn.stopped % 2 == 1
                churn.stopped += 1
                churn.purged += purge
                spawn(
                    "stop",
                    jobs.Deregister(
                        job_pb2.JobDeregisterRequest(job_id=job_id, purge=purge), timeout=30
                    ),
                )
            due = int((now - started) * opts.rate) + 1
            while n < due:
                job_id = f"churn-{n}"
                n += 1
                churn.registered += 1
                spawn(
                    "register",
                    jobs.Register(
                        job_pb2.JobRegisterRequest(
                            job=service(job_id, opts.count, cpu=opts.cpu, memory=opts.memory)
                        ),
                        timeout=30,
                    ),
                )
                live.append((now + opts.lifetime, job_id))
            await asyncio.sleep(0.05)
        if tasks:
            await asyncio.gather(*tasks)


def run(opts: Options) -> tuple[dict[str, Any], int]:
    spec = ClusterSpec(
        nodes=opts.nodes,
        classes=0,
        racks=0,
        datacenters="dc1",
        sim_register_rate=500.0,
        extra_env=gc_env(opts),
    )
    churn = Churn()
    marks: dict[str, Any] = {}
    with BenchCluster(spec) as cluster:
        booted = rss_mb(cluster)
        t0 = time.monotonic()
        until = t0 + opts.minutes * 60

        def tick(elapsed: float) -> None:
            """The start sample once the warm-up is over."""
            if "warm" not in marks and elapsed >= opts.warmup:
                marks["warm"] = {"rss_mb": rss_mb(cluster), "objects": held_objects(cluster.dsn)}
                marks["warm_t"] = round(elapsed, 1)
            cluster.check_alive()

        asyncio.run(drive(cluster.state_addr, opts, churn, until, tick))
        end: dict[str, Any] = {"rss_mb": rss_mb(cluster), "objects": held_objects(cluster.dsn)}
        elapsed = time.monotonic() - t0
    warm = marks.get("warm", {"rss_mb": booted, "objects": {}})
    rows = []
    worst = 0.0
    for role in ROLES:
        start = warm["rss_mb"].get(role, 0.0)
        last = end["rss_mb"].get(role, 0.0)
        growth = (last - start) / start if start else 0.0
        worst = max(worst, growth)
        rows.append(
            {
                "role": role,
                "booted_mb": booted.get(role, 0.0),
                "start_mb": start,
                "end_mb": last,
                "growth_pct": round(growth * 100, 1),
            }
        )
    result = {
        "options": opts.__dict__,
        "elapsed_s": round(elapsed, 1),
        "warmup_sampled_at_s": marks.get("warm_t"),
        "registered": churn.registered,
        "stopped": churn.stopped,
        "purged": churn.purged,
        "errors": dict(churn.errors),
        "objects_start": warm["objects"],
        "objects_end": end["objects"],
        "roles": rows,
        "max_growth_pct": round(worst * 100, 1),
        "ok": worst <= opts.max_growth,
    }
    return result, 0 if result["ok"] else 1


def table(result: dict[str, Any]) -> str:
    lines = [
        f"churn: {result['registered']} jobs registered, {result['stopped']} stopped "
        f"({result['purged']} purged) in {result['elapsed_s']} s; "
        f"start sampled after {result['warmup_sampled_at_s']} s",
        "",
        "| role | booted MB | start MB | end MB | growth |",
        "|---|---|---|---|---|",
    ]
    for r in result["roles"]:
        lines.append(
            f"| {r['role']} | {r['booted_mb']} | {r['start_mb']} | {r['end_mb']} "
            f"| {r['growth_pct']:+.1f}% |"
        )
    lines += ["", "| objects held | start | end |", "|---|---|---|"]
    for table_name, start in result["objects_start"].items():
        lines.append(f"| {table_name} | {start} | {result['objects_end'].get(table_name, 0)} |")
    if result["errors"]:
        lines += ["", f"errors: {result['errors']}"]
    verdict = "OK" if result["ok"] else "FAIL"
    limit = result["options"]["max_growth"] * 100
    lines += ["", f"{verdict}: largest growth {result['max_growth_pct']:+.1f}% (limit {limit:g}%)"]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> tuple[Options, str]:
    d = Options()
    p = argparse.ArgumentParser(prog="bench.churn", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=d.minutes, help="length of the churn")
    p.add_argument("--rate", type=float, default=d.rate, help="job registrations per second")
    p.add_argument("--nodes", type=int, default=d.nodes, help="simulated nodes")
    p.add_argument("--count", type=int, default=d.count, help="allocs per job")
    p.add_argument("--lifetime", type=float, default=d.lifetime, help="seconds before a stop")
    p.add_argument("--gc-threshold", type=float, default=d.gc_threshold, help="every threshold")
    p.add_argument("--gc-interval", type=float, default=d.gc_interval, help="GC evals every N s")
    p.add_argument("--warmup", type=float, default=d.warmup, help="seconds before the start sample")
    p.add_argument("--max-growth", type=float, default=d.max_growth, help="0.25 = 25%%")
    p.add_argument("--json", default="", help="also write the result here")
    a = p.parse_args(argv)
    opts = Options(
        minutes=a.minutes,
        rate=a.rate,
        nodes=a.nodes,
        count=a.count,
        lifetime=a.lifetime,
        gc_threshold=a.gc_threshold,
        gc_interval=a.gc_interval,
        warmup=min(a.warmup, a.minutes * 60 / 2),
        max_growth=a.max_growth,
    )
    return opts, a.json


def main(argv: list[str] | None = None) -> int:
    opts, json_path = parse(argv)
    try:
        result, code = run(opts)
    except Exception as exc:  # the cluster failed: say so, exit 2
        print(f"churn failed: {exc}", file=sys.stderr)
        return 2
    print(table(result))
    print(json.dumps(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return code


if __name__ == "__main__":
    sys.exit(main())
