"""Micro-benchmark of the selection stack: `GenericStack.select` over a
large cluster, the kernel of one eval's placement loop (perf-anchors §2,
modelled on Nomad's BenchmarkServiceScheduler grid: nodes with
`meta.rack = r{i % racks}` in 2 datacenters, a job of 6,000 MHz / 6,000 MB
allocs constrained with `set_contains_any` to half the racks, with and
without a spread over racks).

Each scenario places `count` allocs of one job, appending each placement to
the plan as the generic scheduler does, and reports placements/s and select
latency percentiles. No plan submission, no gRPC, no database.

    .venv/bin/python -m bench.micro_select [--nodes 5000] [--count 1000]
        [--racks 25] [--scenarios service,batch,service-spread,system]
        [--repeats 1] [--out bench/results]

Prints a table and writes `micro_select-<utc time>.json` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from corral.domain import structs
from corral.domain.store import StateStore
from corral.domain.structs import ClientStatus, DesiredStatus, Eligibility, JobType, NodeStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.stack import GenericStack, SelectOptions, SystemStack
from services.worker.scheduler.util import ready_nodes_in_dcs

SCENARIOS = ("service", "batch", "service-spread", "system")


def build_nodes(n: int, racks: int) -> list[pb.Node]:
    nodes: list[pb.Node] = []
    for i in range(n):
        nid = f"00000000-0000-4000-8000-{i:012d}"
        node = pb.Node(
            id=nid,
            name=f"node-{i}",
            datacenter=f"dc{i % 2 + 1}",
            node_pool=structs.DEFAULT_NODE_POOL,
            attributes={
                "kernel.name": "linux",
                "driver.mock": "1",
                "unique.hostname": f"host-{i}",
            },
            meta={"rack": f"r{i % racks}"},
            drivers={"mock": pb.DriverInfo(detected=True, healthy=True)},
            node_resources=pb.NodeResources(
                cpu=64000,
                total_cores=16,
                memory_mb=32000,
                disk_mb=100 * 1024,
                min_dynamic_port=20000,
                max_dynamic_port=32000,
            ),
            reserved_resources=pb.NodeReservedResources(cpu=100, memory_mb=256),
            status=NodeStatus.READY,
            scheduling_eligibility=Eligibility.ELIGIBLE,
        )
        node.computed_class = structs.computed_class(node)
        nodes.append(node)
    return nodes


def build_job(scenario: str, count: int, racks: int) -> pb.Job:
    job_type = {
        "service": JobType.SERVICE,
        "batch": JobType.BATCH,
        "service-spread": JobType.SERVICE,
        "system": JobType.SYSTEM,
    }[scenario]
    task = pb.Task(name="web", driver="mock", resources=pb.Resources(cpu=6000, memory_mb=6000))
    tg = pb.TaskGroup(
        name="web",
        count=count,
        tasks=[task],
        ephemeral_disk=pb.EphemeralDisk(size_mb=150),
        networks=[pb.NetworkResource(dynamic_ports=[pb.Port(label="http")])],
    )
    half = ",".join(f"r{i}" for i in range(0, racks, 2))
    tg.constraints.add(l_target="${meta.rack}", r_target=half, operand="set_contains_any")
    if scenario == "service-spread":
        tg.spreads.add(attribute="${meta.rack}", weight=100)
    return pb.Job(
        id=f"bench-{scenario}",
        namespace=structs.DEFAULT_NAMESPACE,
        name=f"bench-{scenario}",
        type=job_type,
        priority=50,
        datacenters=["dc1", "dc2"],
        node_pool=structs.DEFAULT_NODE_POOL,
        task_groups=[tg],
        version=0,
        job_modify_index=10,
    )


@dataclass
class Result:
    scenario: str
    nodes: int
    count: int
    placed: int
    seconds: float
    placements_per_s: float
    select_p50_us: float
    select_p99_us: float
    select_max_us: float
    mean_nodes_evaluated: float


def run_scenario(scenario: str, nodes: list[pb.Node], count: int, racks: int) -> Result:
    job = build_job(scenario, count, racks)
    snap = StateStore.build(1000, nodes=nodes, jobs=[job])
    plan = pb.Plan(eval_id=f"bench-eval-{scenario}", job=job)
    ctx = EvalContext(snap, plan)
    ready, _, _ = ready_nodes_in_dcs(snap, job.datacenters, job.node_pool)
    tg = job.task_groups[0]
    system = scenario == "system"
    stack: GenericStack | SystemStack
    stack = SystemStack(False, ctx) if system else GenericStack(scenario == "batch", ctx)
    stack.set_job(job)
    latencies: list[int] = []
    evaluated = 0
    placed = 0
    targets = ready[:count] if system else [None] * count
    start = time.perf_counter()
    if not system:
        stack.set_nodes(ready)
    for i, target in enumerate(targets):
        if target is not None:
            stack.set_nodes([target])
        t0 = time.perf_counter_ns()
        opt = stack.select(tg, SelectOptions(alloc_name=f"{job.id}.web[{i}]"))
        latencies.append(time.perf_counter_ns() - t0)
        evaluated += ctx.metrics.nodes_evaluated
        if opt is None:
            continue
        placed += 1
        plan.node_allocation[opt.node.id].allocs.add(
            id=f"alloc-{i}",
            namespace=job.namespace,
            eval_id=plan.eval_id,
            name=f"{job.id}.web[{i}]",
            node_id=opt.node.id,
            job_id=job.id,
            task_group=tg.name,
            resources=opt.alloc_resources,
            desired_status=DesiredStatus.RUN,
            client_status=ClientStatus.PENDING,
        )
    seconds = time.perf_counter() - start
    latencies.sort()
    return Result(
        scenario=scenario,
        nodes=len(nodes),
        count=count,
        placed=placed,
        seconds=round(seconds, 4),
        placements_per_s=round(placed / seconds, 1) if seconds > 0 else 0.0,
        select_p50_us=round(statistics.median(latencies) / 1000, 1),
        select_p99_us=round(latencies[int(len(latencies) * 0.99) - 1] / 1000, 1),
        select_max_us=round(latencies[-1] / 1000, 1),
        mean_nodes_evaluated=round(evaluated / max(len(latencies), 1), 1),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--racks", type=int, default=25)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--repeats", type=int, default=1, help="best of N runs per scenario")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    nodes = build_nodes(args.nodes, args.racks)
    print(f"built {len(nodes)} nodes in {time.perf_counter() - t0:.2f}s", flush=True)
    results: list[Result] = []
    for scenario in args.scenarios.split(","):
        if scenario not in SCENARIOS:
            ap.error(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
        runs = [run_scenario(scenario, nodes, args.count, args.racks) for _ in range(args.repeats)]
        best = max(runs, key=lambda r: r.placements_per_s)
        results.append(best)
        print(
            f"{best.scenario:15s} placed {best.placed:5d}/{best.count:<5d} "
            f"{best.placements_per_s:9.1f} placements/s  "
            f"p50 {best.select_p50_us:8.1f} us  p99 {best.select_p99_us:8.1f} us  "
            f"nodes/select {best.mean_nodes_evaluated:6.1f}",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out / f"micro_select-{stamp}.json"
    payload = {
        "benchmark": "micro_select",
        "time": stamp,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "args": vars(args),
        "results": [asdict(r) for r in results],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
