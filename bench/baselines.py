"""Baselines measured in the same run as the workloads (perf-anchors §6.1),
so results can be read as ratios that survive a noisy machine.

B1 serialized indexed commits/s: the state service's own write path
   (`Database.write`: counter bump, change-log row, NOTIFY) with one eval.
B2 alloc rows/s at plan sizes k: `Database.write` upserting k allocs.
B3 gRPC unary round trip between two processes (health check as echo):
   sequential p50/p99 and rate, and the rate with 8 calls in flight.
B4 NOTIFY -> listener latency (psycopg ping-pong), p50/p99.
B5 CPU speed: a pure-Python placement kernel (random start, scan to 13
   feasible of 5,000 nodes, binpack score, commit), placements/s on one core.

Each baseline reports the best of `repeats` short repetitions.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.domain.structs import new_id
from corral.v1 import structs_pb2 as pb
from services.state.db.database import Database


@dataclass
class Baselines:
    commits_per_s: float = 0.0
    alloc_rows_per_s: dict[int, float] = field(default_factory=dict)
    grpc_seq_rps: float = 0.0
    grpc_seq_p50_ms: float = 0.0
    grpc_seq_p99_ms: float = 0.0
    grpc_8_rps: float = 0.0
    notify_p50_ms: float = 0.0
    notify_p99_ms: float = 0.0
    kernel_placements_per_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "B1_commits_per_s": round(self.commits_per_s, 1),
            "B2_alloc_rows_per_s": {str(k): round(v, 1) for k, v in self.alloc_rows_per_s.items()},
            "B3_grpc_sequential_rps": round(self.grpc_seq_rps, 1),
            "B3_grpc_sequential_p50_ms": round(self.grpc_seq_p50_ms, 3),
            "B3_grpc_sequential_p99_ms": round(self.grpc_seq_p99_ms, 3),
            "B3_grpc_8_in_flight_rps": round(self.grpc_8_rps, 1),
            "B4_notify_p50_ms": round(self.notify_p50_ms, 3),
            "B4_notify_p99_ms": round(self.notify_p99_ms, 3),
            "B5_kernel_placements_per_s": round(self.kernel_placements_per_s, 1),
        }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


# ---------------------------------------------------------------- B1, B2


def _eval() -> pb.Evaluation:
    return pb.Evaluation(
        id=new_id(),
        namespace="default",
        job_id="bench-b1",
        type="service",
        status="complete",
        triggered_by="job-register",
        priority=50,
    )


def _alloc(i: int) -> pb.Allocation:
    a = pb.Allocation(
        id=new_id(),
        namespace="default",
        job_id="bench-b2",
        node_id=f"node-{i % 5000}",
        eval_id="bench",
        name=f"bench-b2.web[{i}]",
        task_group="web",
        desired_status="run",
        client_status="pending",
        job_type="service",
    )
    a.resources.cpu = 100
    a.resources.memory_mb = 256
    a.task_resources["web"].CopyFrom(a.resources)
    return a


async def commits_per_second(dsn: str, seconds: float) -> float:
    db = Database(dsn, pool_size=1)
    try:
        n = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            async with db.write() as tx:
                tx.put_eval(_eval())
            n += 1
        return n / (time.perf_counter() - start)
    finally:
        await db.close()


async def alloc_rows_per_second(dsn: str, k: int, seconds: float) -> float:
    db = Database(dsn, pool_size=1)
    try:
        rows = 0
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < seconds:
            async with db.write() as tx:
                for _ in range(k):
                    tx.put_alloc(_alloc(i))
                    i += 1
            rows += k
        return rows / (time.perf_counter() - start)
    finally:
        await db.close()


# ---------------------------------------------------------------- B3

_ECHO_SERVER = """
import asyncio, sys
from corral.runtime.server import GrpcServer
async def main():
    s = GrpcServer("127.0.0.1:0", name="echo")
    await s.start()
    print(s.port, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def grpc_round_trips(seconds: float) -> tuple[float, float, float, float]:
    proc = subprocess.Popen([sys.executable, "-c", _ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            req = health_pb2.HealthCheckRequest()
            for _ in range(50):
                await stub.Check(req)
            lat: list[float] = []
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                t0 = time.perf_counter()
                await stub.Check(req)
                lat.append(time.perf_counter() - t0)
            seq_rps = len(lat) / (time.perf_counter() - start)
            done = 0
            stop_at = time.perf_counter() + seconds

            async def caller() -> None:
                nonlocal done
                while time.perf_counter() < stop_at:
                    await stub.Check(req)
                    done += 1

            t0 = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(8)))
            par_rps = done / (time.perf_counter() - t0)
        return seq_rps, percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3, par_rps
    finally:
        proc.terminate()
        proc.wait(5)


# ---------------------------------------------------------------- B4


def notify_latency(dsn: str, count: int) -> tuple[float, float]:
    lat: list[float] = []
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as sender,
    ):
        listener.execute("LISTEN corral_bench")
        gen = listener.notifies(timeout=5)
        for i in range(count):
            t0 = time.perf_counter()
            sender.execute("SELECT pg_notify('corral_bench', %s)", (str(i),))
            for _ in gen:
                lat.append(time.perf_counter() - t0)
                break
            gen = listener.notifies(timeout=5)
    return percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3


# ---------------------------------------------------------------- B5


def placement_kernel(seconds: float, nodes: int = 5000, wanted: int = 13) -> float:
    """Random start, scan until `wanted` feasible nodes, binpack-score them,
    commit the best to the arrays (perf-anchors §4.3)."""
    rng = random.Random(42)
    cap_cpu = [4000] * nodes
    cap_mem = [8192] * nodes
    used_cpu = [0] * nodes
    used_mem = [0] * nodes
    klass = [i % 5 for i in range(nodes)]
    ask_cpu, ask_mem = 100, 256
    placed = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            i = rng.randrange(nodes)
            best, best_score, seen = -1, -1.0, 0
            for step in range(nodes):
                n = (i + step) % nodes
                if klass[n] == 4:
                    continue
                free_cpu = cap_cpu[n] - used_cpu[n] - ask_cpu
                free_mem = cap_mem[n] - used_mem[n] - ask_mem
                if free_cpu < 0 or free_mem < 0:
                    continue
                score = 20 - (10 ** (free_cpu / cap_cpu[n]) + 10 ** (free_mem / cap_mem[n]))
                if score > best_score:
                    best, best_score = n, score
                seen += 1
                if seen >= wanted:
                    break
            if best < 0:
                used_cpu = [0] * nodes
                used_mem = [0] * nodes
                continue
            used_cpu[best] += ask_cpu
            used_mem[best] += ask_mem
            placed += 1
    return placed / (time.perf_counter() - start)


# ---------------------------------------------------------------- all


async def measure(dsn: str, *, seconds: float = 2.0, repeats: int = 3) -> Baselines:
    b = Baselines()
    b.commits_per_s = max([await commits_per_second(dsn, seconds) for _ in range(repeats)])
    for k in (10, 100, 1000):
        b.alloc_rows_per_s[k] = max(
            [await alloc_rows_per_second(dsn, k, seconds) for _ in range(repeats)]
        )
    best = max([await grpc_round_trips(seconds) for _ in range(repeats)], key=lambda r: r[0])
    b.grpc_seq_rps, b.grpc_seq_p50_ms, b.grpc_seq_p99_ms, _ = best
    b.grpc_8_rps = max(r[3] for r in [best])
    p = min([notify_latency(dsn, 300) for _ in range(repeats)], key=lambda r: r[0])
    b.notify_p50_ms, b.notify_p99_ms = p
    b.kernel_placements_per_s = max(placement_kernel(seconds) for _ in range(repeats))
    return b


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else 0.0,
        "mean": statistics.fmean(values) if values else 0.0,
    }
