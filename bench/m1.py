"""M1: the in-process scheduler micro-benchmark (perf-anchors §2, §6.2).

Mirrors the shape of Nomad's `BenchmarkServiceScheduler`
(scheduler/benchmarks/benchmarks_test.go) on our own scheduler: a cluster of
nodes with `meta.rack = r{i % racks}` split over two datacenters, each node
4 cores x 3,500 MHz / 32,000 MB / 100 GiB; one service job whose allocs ask
6,000 MHz / 6,000 MB, constrained with `set_contains_any` to the first half
of the racks, with or without a job-level even spread over `${meta.rack}`.

One measured operation is one whole `Harness.process("service", eval)`:
reconcile, every placement, plan construction and the (non-committing)
submit, exactly Nomad's `h.Process(NewServiceScheduler, eval)` with
`SetNoSubmit`. The harness state is built once per case; because nothing is
committed, every repeat schedules the same job from the same snapshot.

Unlike `bench.micro_select` (the select stack alone), this includes the
reconciler, the plan, the eval status update and everything else a worker
pays per eval except the RPCs.

    .venv/bin/python -m bench.m1 [--quick] [--repeats N] [--allocs 300,1200]
        [--spread both|yes|no] [--nodes 5000] [--racks 25]
        [--profile] [--digest] [--out bench/results]

Prints a table and writes `m1-<utc time>.json` to `--out`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.domain.store import StateSnapshot
from corral.domain.structs import JobType
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.util import planned_count

NODES = 5000
RACKS = 25
ALLOCS = (300, 1200)
#: Nomad's mock node: 4 cores at 3,500 MHz (MockBasicTopology); the benchmark
#: replaces memory and disk with these.
NODE_CPU_MHZ = 4 * 3500
NODE_MEMORY_MB = 32000
NODE_DISK_MB = 100 * 1024
ALLOC_CPU_MHZ = 6000
ALLOC_MEMORY_MB = 6000
#: A spread block needs a weight in our job model; an even spread (no
#: targets) does not use it, so any positive value gives the same placements.
SPREAD_WEIGHT = 50
FULL_REPEATS = 3
QUICK_REPEATS = 1
#: A case slower than this is called out in the table (Nomad's nack timeout
#: is 60 s: an eval that slow would be redelivered in a real cluster).
SLOW_CASE_S = 60.0


class NoSubmitHarness(Harness):
    """The harness with plan submission disabled (Nomad's `SetNoSubmit`):
    plans are accepted in full and recorded, eval updates are recorded, but
    the state never changes, so the same eval can be processed again."""

    def submit_plan(self, plan: pb.Plan) -> tuple[pb.PlanResult, StateSnapshot | None]:
        self.plans.append(plan)
        result = pb.PlanResult(alloc_index=self.store.index)
        for node_id, allocs in plan.node_allocation.items():
            result.node_allocation[node_id].CopyFrom(allocs)
        for node_id, stops in plan.node_update.items():
            result.node_update[node_id].CopyFrom(stops)
        for node_id, stops in plan.node_preemptions.items():
            result.node_preemptions[node_id].CopyFrom(stops)
        if plan.HasField("deployment"):
            result.deployment.CopyFrom(plan.deployment)
        result.deployment_updates.extend(plan.deployment_updates)
        self.results.append(result)
        return result, None

    def update_eval(self, ev: pb.Evaluation) -> None:
        self.evals.append(ev)

    def create_eval(self, ev: pb.Evaluation) -> None:
        self.create_evals.append(ev)

    def reblock_eval(self, ev: pb.Evaluation) -> None:
        self.reblock_evals.append(ev)


def build_nodes(count: int, racks: int) -> list[pb.Node]:
    """Nodes as Nomad's `upsertNodes`: alternating dc-1/dc-2, one rack each."""
    datacenters = ("dc-1", "dc-2")
    nodes = []
    for i in range(count):
        n = mock.node(
            node_id=f"00000000-0000-4000-8000-{i:012d}",
            datacenter=datacenters[i % 2],
            cpu=NODE_CPU_MHZ,
            memory_mb=NODE_MEMORY_MB,
            disk_mb=NODE_DISK_MB,
            meta={"rack": f"r{i % racks}"},
            attributes={"unique.advertise.address": f"192.168.{i % 10}.{i % 120}"},
        )
        nodes.append(n)
    return nodes


def build_job(allocs: int, racks: int, *, spread: bool) -> pb.Job:
    """The job of Nomad's `generateJob`: `allocs` allocs of 6,000 MHz /
    6,000 MB, only the first half of the racks eligible, optional even
    spread over racks."""
    name = f"m1-{allocs}-{'spread' if spread else 'nospread'}"
    job = mock.job(
        job_id=name,
        count=allocs,
        datacenters=("dc-1", "dc-2"),
        cpu=ALLOC_CPU_MHZ,
        memory_mb=ALLOC_MEMORY_MB,
    )
    del job.constraints[:]
    job.constraints.add(
        l_target="${meta.rack}",
        r_target=",".join(f"r{i}" for i in range(racks // 2)),
        operand="set_contains_any",
    )
    if spread:
        job.spreads.add(attribute="${meta.rack}", weight=SPREAD_WEIGHT)
    return job


@dataclass
class Case:
    nodes: int
    racks: int
    allocs: int
    spread: bool


def default_cases(nodes: int = NODES, racks: int = RACKS) -> list[Case]:
    return [Case(nodes, racks, a, s) for a in ALLOCS for s in (False, True)]


def setup(case: Case, nodes: list[pb.Node]) -> tuple[NoSubmitHarness, pb.Evaluation]:
    """Harness state for one case: the nodes, the job and its pending eval."""
    h = NoSubmitHarness()
    h.upsert_nodes(*nodes)
    job = build_job(case.allocs, case.racks, spread=case.spread)
    h.upsert_jobs(job)
    stored = h.job(job.namespace, job.id)
    ev = mock.eval_for(stored)
    h.upsert_evals(ev)
    return h, ev


def process_once(h: NoSubmitHarness, ev: pb.Evaluation) -> tuple[float, int]:
    """One timed eval; returns (seconds, allocs in the submitted plan)."""
    before = len(h.plans)
    t0 = time.perf_counter()
    h.process(JobType.SERVICE, ev)
    seconds = time.perf_counter() - t0
    placed = sum(planned_count(p) for p in h.plans[before:])
    # keep memory flat over repeats: the recorded plans are not needed
    h.plans.clear()
    h.results.clear()
    h.evals.clear()
    h.create_evals.clear()
    return seconds, placed


def run_case(case: Case, nodes: list[pb.Node], repeats: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    h, ev = setup(case, nodes)
    setup_s = time.perf_counter() - t0
    times: list[float] = []
    cpu: list[float] = []
    placed = 0
    for _ in range(repeats):
        c0 = time.process_time()
        seconds, placed = process_once(h, ev)
        cpu.append(time.process_time() - c0)
        times.append(seconds)
    best = min(times)
    return {
        "nodes": case.nodes,
        "racks": case.racks,
        "allocs": case.allocs,
        "spread": case.spread,
        "placed": placed,
        "eval_s": round(best, 4),
        "eval_median_s": round(statistics.median(times), 4),
        "eval_all_s": [round(t, 4) for t in times],
        # CPU seconds of the process (the eval is in-process and single
        # threaded): steadier than wall time on a shared machine
        "eval_cpu_s": round(min(cpu), 4),
        "eval_cpu_all_s": [round(t, 4) for t in cpu],
        "placements_per_s": round(placed / best, 1) if best > 0 else 0.0,
        "repeats": repeats,
        "setup_s": round(setup_s, 3),
        "slow": best > SLOW_CASE_S,
    }


#: eval id of `placement_digest` runs: it seeds the node shuffle
DIGEST_EVAL_ID = "00000000-0000-4000-8000-00000000e1e1"


def placement_digest(case: Case) -> str:
    """A digest of the nodes one eval of `case` chooses and of every
    placement's metric (nodes evaluated/filtered/exhausted, top-5 scores):
    equal digests mean a scheduler change kept the same choices and scores.
    The node order also depends on string hashing (the state's maps), so
    compare digests taken with the same PYTHONHASHSEED."""
    h, ev = setup(case, build_nodes(case.nodes, case.racks))
    ev.id = DIGEST_EVAL_ID
    h.upsert_evals(ev)
    h.process(JobType.SERVICE, ev)
    placed = [a for p in h.plans for lst in p.node_allocation.values() for a in lst.allocs]
    chosen = sorted(a.node_id for a in placed)
    metrics = sorted(
        (
            a.metrics.nodes_evaluated,
            a.metrics.nodes_filtered,
            a.metrics.nodes_exhausted,
            [(s.node_id, round(s.norm_score, 9)) for s in a.metrics.score_meta_data],
        )
        for a in placed
    )
    return hashlib.sha256(json.dumps([chosen, metrics]).encode()).hexdigest()[:16]


def measure(
    quick: bool,
    *,
    repeats: int | None = None,
    cases: list[Case] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run every case (default: 5,000 nodes x 25 racks x {300, 1,200} allocs
    x {no spread, spread}); `eval_s` is the best of `repeats` whole-eval
    runs, `eval_median_s` the median."""
    n = repeats if repeats is not None else (QUICK_REPEATS if quick else FULL_REPEATS)
    if n < 1:
        raise ValueError("repeats must be >= 1")
    todo = cases if cases is not None else default_cases()
    built: dict[tuple[int, int], list[pb.Node]] = {}
    out: list[dict[str, Any]] = []
    for case in todo:
        key = (case.nodes, case.racks)
        if key not in built:
            built[key] = build_nodes(case.nodes, case.racks)
        result = run_case(case, built[key], n)
        if progress:
            print(format_row(result), flush=True)
        out.append(result)
    return {
        "benchmark": "m1",
        "shape": "nomad BenchmarkServiceScheduler",
        "quick": quick,
        "python": sys.version.split()[0],
        "cases": out,
    }


def format_row(c: dict[str, Any]) -> str:
    spread = "spread" if c["spread"] else "no spread"
    slow = f"  SLOW (> {SLOW_CASE_S:.0f} s)" if c.get("slow") else ""
    return (
        f"{c['nodes']:6d} nodes {c['racks']:3d} racks {c['allocs']:5d} allocs {spread:9s}  "
        f"placed {c['placed']:5d}  best {c['eval_s']:8.3f} s  median {c['eval_median_s']:8.3f} s  "
        f"cpu {c.get('eval_cpu_s', 0.0):8.3f} s  "
        f"{c['placements_per_s']:9.1f} placements/s  (x{c['repeats']}){slow}"
    )


def profile_case(case: Case, nodes: list[pb.Node]) -> str:
    """pyinstrument text report of one eval of `case` (setup excluded)."""
    from pyinstrument import Profiler

    h, ev = setup(case, nodes)
    profiler = Profiler(interval=0.001)
    profiler.start()
    h.process(JobType.SERVICE, ev)
    profiler.stop()
    text: str = profiler.output_text(unicode=False, color=False, show_all=False)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_REPEATS} repeat per case")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--nodes", type=int, default=NODES)
    ap.add_argument("--racks", type=int, default=RACKS)
    ap.add_argument("--allocs", default=",".join(str(a) for a in ALLOCS))
    ap.add_argument("--spread", choices=("both", "yes", "no"), default="both")
    ap.add_argument(
        "--profile", action="store_true", help="also profile the slowest case with pyinstrument"
    )
    ap.add_argument(
        "--digest",
        action="store_true",
        help="also print each case's placement digest (compare under one PYTHONHASHSEED)",
    )
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)

    spreads = {"both": (False, True), "yes": (True,), "no": (False,)}[args.spread]
    try:
        sizes = [int(a) for a in args.allocs.split(",")]
    except ValueError:
        ap.error(f"--allocs: expected comma-separated integers, got {args.allocs!r}")
    cases = [Case(args.nodes, args.racks, a, s) for a in sizes for s in spreads]
    print(
        f"M1: Nomad BenchmarkServiceScheduler shape, {len(cases)} cases "
        f"(python {platform.python_version()}, {platform.machine()})",
        flush=True,
    )
    result = measure(args.quick, repeats=args.repeats, cases=cases, progress=True)
    if args.digest:
        for c, case in zip(result["cases"], cases, strict=True):
            c["digest"] = placement_digest(case)
            print(f"digest {format_row(c).split('placed')[0].strip()}: {c['digest']}", flush=True)
    if args.profile and result["cases"]:
        slowest = max(result["cases"], key=lambda c: c["eval_s"])
        case = Case(slowest["nodes"], slowest["racks"], slowest["allocs"], slowest["spread"])
        print(f"\nprofile of the slowest case ({format_row(slowest).strip()}):")
        report = profile_case(case, build_nodes(case.nodes, case.racks))
        print(report)
        result["profile_text"] = report
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out / f"m1-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
