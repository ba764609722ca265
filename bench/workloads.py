"""The workloads of perf-anchors §6.2, each against a running `BenchCluster`.

Every workload follows the same steps: note the index, start the CPU/RSS
window and the profilers, drive the load through the public API (as
`corral job run` would), wait until the cluster is quiet (no pending eval,
broker queues empty), then read its figures from the database's commit
times (`bench.measure`) and check the invariants.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg

from bench import jobs, ledger, measure, openloop
from bench.cluster import BenchCluster
from bench.profiler import Profiler
from bench.report import (
    achieved_rate,
    cpu_ms_by_role,
    percentiles,
    rss_per_1000_allocs_mb,
    steady_rate,
    w1l_rates,
)
from corral.security import transport
from corral.testing import invariants
from corral.v1 import (
    eval_pb2,
    eval_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    plan_pb2,
    plan_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb

QUIET_POLL_S = 0.25


@dataclass(frozen=True)
class Profile:
    """Sizes of one benchmark run. `quick` divides the full counts by ten."""

    name: str
    nodes: int
    w1_jobs: int
    w2_jobs: int
    w2_per_group: int
    w3_allocs: int
    w5_updates: int
    w5b_system_jobs: int
    w6_workers: tuple[int, ...]
    baseline_seconds: float
    baseline_repeats: int
    w1l_seconds: float = 60.0  # open-loop registration at each W1L load
    scaling_nodes: tuple[int, ...] = (500, 2000, 5000, 10_000)
    scaling_w2_jobs: int = 10  # W2 jobs (1,000 allocs each) at every S1 size
    replica_memory_jobs: int = 2000  # bench.replica_memory's jobs (5 allocs each)
    heartbeat_args: tuple[str, ...] = ()
    in_flight: int = 32
    timeout_s: float = 600.0


FULL = Profile(
    name="full",
    nodes=5000,
    w1_jobs=1000,
    w2_jobs=20,
    w2_per_group=200,
    w3_allocs=10_000,
    w5_updates=500,
    w5b_system_jobs=10,
    w6_workers=(1, 2, 4),
    baseline_seconds=2.0,
    baseline_repeats=3,
)

QUICK = Profile(
    name="quick",
    nodes=500,
    w1_jobs=100,
    w2_jobs=2,
    w2_per_group=200,
    w3_allocs=1000,
    w5_updates=50,
    w5b_system_jobs=10,
    w6_workers=(1, 2),
    baseline_seconds=1.0,
    baseline_repeats=2,
    w1l_seconds=15.0,
    scaling_nodes=(200, 500),
    scaling_w2_jobs=2,
    replica_memory_jobs=400,
    # a 500-node cluster would get a 10 s minimum TTL and 10 s grace; shorter
    # ones keep the node-failure workloads inside the 5-minute budget
    heartbeat_args=("--heartbeat-min-ttl", "5", "--heartbeat-grace", "5"),
    timeout_s=180.0,
)


@dataclass
class Context:
    cluster: BenchCluster
    profile: Profile
    results_dir: Path
    log: Callable[[str], None]
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def channel(self, addr: str) -> grpc.aio.Channel:
        if addr not in self._channels:
            self._channels[addr] = transport.dial(
                addr, options=[("grpc.max_receive_message_length", 256 * 2**20)]
            )
        return self._channels[addr]

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    def db(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.cluster.dsn, autocommit=True)

    @property
    def jobs(self) -> job_pb2_grpc.JobAsyncStub:
        return job_pb2_grpc.JobStub(self.channel(self.cluster.state_addr))  # type: ignore[return-value]

    async def broker_stats(self) -> eval_pb2.BrokerStats:
        stub = eval_pb2_grpc.EvalStub(self.channel(self.cluster.addr("broker")))
        stats: eval_pb2.BrokerStats = await stub.Stats(eval_pb2.BrokerStatsRequest(), timeout=10)
        return stats

    async def plan_stats(self) -> plan_pb2.PlanStats:
        stub = plan_pb2_grpc.PlanStub(self.channel(self.cluster.addr("planner")))
        stats: plan_pb2.PlanStats = await stub.Stats(plan_pb2.PlanStatsRequest(), timeout=10)
        return stats

    async def workers(self, pause: bool) -> None:
        for addr in self.cluster.worker_addrs():
            stub = worker_pb2_grpc.WorkerStub(self.channel(addr))
            req = worker_pb2.WorkerControlRequest()
            await (stub.Pause(req, timeout=10) if pause else stub.Resume(req, timeout=10))


# ------------------------------------------------------------------ driving


async def register_all(ctx: Context, batch: list[pb.Job], in_flight: int) -> list[str]:
    """Register every job with at most `in_flight` calls outstanding; the
    errors (there should be none) are returned, not raised."""
    sem = asyncio.Semaphore(in_flight)
    errors: list[str] = []
    stub = ctx.jobs

    async def one(job: pb.Job) -> None:
        async with sem:
            try:
                await stub.Register(job_pb2.JobRegisterRequest(job=job), timeout=60)
            except grpc.aio.AioRpcError as exc:
                errors.append(f"{job.id}: {exc.code().name} {exc.details()}")

    await asyncio.gather(*(one(j) for j in batch))
    return errors


async def wait_quiet(ctx: Context, timeout: float, settle: float = 1.0) -> float:
    """Wait until no eval is pending in the database and the broker has
    nothing ready, in flight or delayed, for `settle` seconds; returns the
    monotonic time quiet began."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    with ctx.db() as conn:
        while time.monotonic() < deadline:
            ctx.cluster.check_alive()
            s = await ctx.broker_stats()
            busy = s.total_ready + s.total_unacked + s.total_pending + s.total_waiting
            busy += s.delayed_evals + measure.unfinished_evals(conn)
            if busy == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= settle:
                    return quiet_since
            else:
                quiet_since = None
            await asyncio.sleep(QUIET_POLL_S)
    raise TimeoutError(f"the cluster was still busy after {timeout:.0f}s")


async def wait_for(
    what: str, check: Callable[[], Awaitable[bool]], timeout: float, poll: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


# ------------------------------------------------------------------ measuring


@dataclass
class Window:
    """What a workload measures around its load: index, planner counters,
    CPU/RSS and profiles."""

    ctx: Context
    label: str
    start_index: int = 0
    plan_before: plan_pb2.PlanStats | None = None
    profiler: Profiler | None = None
    ledger_before: dict[str, ledger.Scrape] = field(default_factory=dict)

    async def __aenter__(self) -> Window:
        with self.ctx.db() as conn:
            self.start_index = measure.latest_index(conn)
        self.plan_before = await self.ctx.plan_stats()
        self.ledger_before = await scrape_ledger(self.ctx)
        self.ctx.cluster.mark()
        self.profiler = Profiler(self.ctx.results_dir / "profiles")
        self.profiler.start(self.ctx.cluster.pids(), self.label)
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def finish(self, job_like: str, out: dict[str, Any]) -> dict[str, Any]:
        """Fill `out` with every figure of the jobs matching `job_like`."""
        assert self.profiler is not None and self.plan_before is not None
        ledger_after = await scrape_ledger(self.ctx)
        out["processes"] = self.ctx.cluster.process_figures()
        out["profile_top"] = self.profiler.stop()
        if self.profiler.error:
            out["profile_error"] = self.profiler.error
        plan_after = await self.ctx.plan_stats()
        with self.ctx.db() as conn:
            end_index = measure.latest_index(conn)
            p = measure.placements(conn, job_like, self.start_index)
            lat = measure.eval_latencies_ms(conn, job_like, self.start_index)
            counts = measure.eval_counts(conn, job_like, self.start_index)
            kinds = measure.commit_kinds(conn, self.start_index, end_index)
            used = measure.nodes_used(conn, job_like, self.start_index)
        rejected = plan_after.nodes_rejected - self.plan_before.nodes_rejected
        evals = sum(counts.values())
        out.update(
            {
                "placements": p.count,
                "evals": evals,
                "evals_by_status": counts,
                "duration_s": round(p.duration_s(), 3),
                "placements_per_s": round(p.count / p.duration_s(), 1) if p.duration_s() else 0.0,
                "eval_latency_ms": {k: round(v, 1) for k, v in percentiles(lat).items()},
                "mean_plan_size": round(p.count / p.plan_indexes, 1) if p.plan_indexes else 0.0,
                "indexes": end_index - self.start_index,
                "commits": int(plan_after.commits - self.plan_before.commits),
                "plans_applied": int(plan_after.plans_applied - self.plan_before.plans_applied),
                "plans_partial": int(plan_after.plans_partial - self.plan_before.plans_partial),
                "plans_submitted": p.node_plans + int(rejected),
                "plans_rejected": int(rejected),
                "timeline": p.timeline(),
            }
        )
        out["commits_per_eval"] = round(out["indexes"] / evals, 2) if evals else 0.0
        out["commit_kinds"] = kinds
        out["nodes_used"] = used
        out["steady_placements_per_s"] = round(steady_rate(out["timeline"]), 1)
        cpu = sum(f["cpu_s"] for name, f in out["processes"].items() if name != "sim")
        out["cpu_ms_per_placement"] = round(cpu * 1000 / p.count, 3) if p.count else 0.0
        out["cpu_ms_by_role"] = cpu_ms_by_role(out["processes"], p.count)
        deltas = {
            name: ledger.diff(self.ledger_before[name], after)
            for name, after in ledger_after.items()
            if name in self.ledger_before
        }
        out["ledger"] = ledger.build(deltas, p.count, out)
        out["invariants"] = await check_invariants(self.ctx)
        return out


async def scrape_ledger(ctx: Context) -> dict[str, ledger.Scrape]:
    """Every role's ledger counters now (bench/ledger.py)."""

    def scrape_all() -> dict[str, ledger.Scrape]:
        return {name: ledger.scrape(addr) for name, addr in ctx.cluster.metrics_addrs().items()}

    return await asyncio.to_thread(scrape_all)


async def check_invariants(ctx: Context) -> dict[str, Any]:
    snap = await invariants.fetch_snapshot(ctx.cluster.state_addr)
    found = invariants.errors(invariants.check_snapshot(snap) + invariants.check_placed(snap))
    return {"ok": not found, "violations": [str(v) for v in found[:20]], "count": len(found)}


def state_call_costs(d: ledger.Scrape, cpu_s: float, elapsed_s: float) -> dict[str, Any]:
    """What the calls the state served in an idle window (N1: heartbeats,
    client alloc polls, feed streams) cost it: calls per second by method,
    CPU-ms and SQL statements per call (issue 30: client traffic)."""
    calls = {m: n for m, n in d.rpc_server.items() if m not in ledger.PROBE_METHODS and n > 0}
    total = sum(calls.values())
    sql = sum(d.sql.values())
    return {
        "state_calls_per_s": round(total / elapsed_s, 1) if elapsed_s else 0.0,
        "state_calls_by_method": {
            m.rsplit(".", 1)[-1]: int(n)  # "Node/UpdateStatus"
            for m, n in sorted(calls.items(), key=lambda kv: -kv[1])
        },
        "state_cpu_ms_per_call": round(cpu_s * 1000 / total, 3) if total else 0.0,
        "state_sql_per_call": round(sql / total, 3) if total else 0.0,
    }


# ------------------------------------------------------------------ workloads


async def n1_heartbeats(ctx: Context) -> dict[str, Any]:
    """N1: the whole cluster idles while every node heartbeats; no node may
    leave `ready` (issue 7: 5,000 nodes without flapping). Heartbeats write
    nothing, so any node row written during the hold is a status change."""
    p = ctx.profile
    hold = 60.0 if p.name == "full" else 10.0
    out: dict[str, Any] = {
        "name": "heartbeats: every node idle and ready",
        "params": {"nodes": p.nodes, "hold_s": hold},
    }
    with ctx.db() as conn:
        start = measure.latest_index(conn)
    ledger_before = await scrape_ledger(ctx)
    ctx.cluster.mark()
    profiler = Profiler(ctx.results_dir / "profiles")
    profiler.start(ctx.cluster.pids(), "N1")
    worst_ready = p.nodes
    t0 = time.monotonic()
    with ctx.db() as conn:
        while time.monotonic() - t0 < hold:
            ctx.cluster.check_alive()
            worst_ready = min(worst_ready, measure.node_statuses(conn).get("ready", 0))
            await asyncio.sleep(1.0)
        row = conn.execute(
            "SELECT count(*) FROM nodes WHERE modify_index > %s", (start,)
        ).fetchone()
        changed = int(row[0]) if row else 0
        end = measure.latest_index(conn)
    elapsed = time.monotonic() - t0
    ledger_after = await scrape_ledger(ctx)
    out["processes"] = ctx.cluster.process_figures()
    out["profile_top"] = profiler.stop()
    if profiler.error:
        out["profile_error"] = profiler.error
    if "state" in ledger_before and "state" in ledger_after:
        out.update(
            state_call_costs(
                ledger.diff(ledger_before["state"], ledger_after["state"]),
                out["processes"]["state"]["cpu_s"],
                elapsed,
            )
        )
    out["min_ready_nodes"] = worst_ready
    out["node_status_changes"] = changed
    out["indexes"] = end - start
    out["state_cpu_share"] = round(out["processes"]["state"]["cpu_s"] / elapsed, 3)
    out["sim_cpu_share"] = round(out["processes"]["sim"]["cpu_s"] / elapsed, 3)
    out["invariants"] = {
        "ok": changed == 0 and worst_ready == p.nodes,
        "violations": [] if changed == 0 else [f"{changed} nodes changed status while idle"],
        "count": changed,
    }
    return out


async def w1_throughput(ctx: Context, prefix: str = "w1") -> dict[str, Any]:
    """W1: many small service jobs (10 allocs each), 32 registrations in flight."""
    p = ctx.profile
    batch = [jobs.service(f"{prefix}-{i:05d}", 10) for i in range(p.w1_jobs)]
    out: dict[str, Any] = {
        "name": "throughput: small service jobs",
        "params": {"jobs": p.w1_jobs, "allocs_per_job": 10, "in_flight": p.in_flight},
    }
    async with Window(ctx, prefix) as w:
        errors = await register_all(ctx, batch, p.in_flight)
        await wait_quiet(ctx, p.timeout_s)
        await w.finish(f"{prefix}-%", out)
    out["jobs"] = len(batch) - len(errors)
    out["jobs_per_s"] = round(out["jobs"] / out["duration_s"], 1) if out["duration_s"] else 0.0
    if errors:
        out["register_errors"] = errors[:10]
    return out


async def w2_c1m(ctx: Context, prefix: str = "w2", count: int = 0) -> dict[str, Any]:
    """W2: C1M-shaped — jobs of 5 groups, each group constrained to one class
    (`count` jobs; the profile's W2 count when 0)."""
    p = ctx.profile
    count = count or p.w2_jobs
    batch = [
        jobs.job(
            f"{prefix}-{i:03d}",
            [jobs.Group(f"g{c}", p.w2_per_group, f"class-{c}") for c in range(5)],
        )
        for i in range(count)
    ]
    out: dict[str, Any] = {
        "name": "C1M-shaped: 5 class-constrained groups per job",
        "params": {"jobs": count, "groups": 5, "allocs_per_group": p.w2_per_group},
    }
    async with Window(ctx, prefix) as w:
        errors = await register_all(ctx, batch, p.in_flight)
        await wait_quiet(ctx, p.timeout_s)
        await w.finish(f"{prefix}-%", out)
    out["jobs"] = len(batch) - len(errors)
    out["jobs_per_s"] = round(out["jobs"] / out["duration_s"], 1) if out["duration_s"] else 0.0
    return out


async def w1l_offered_load(
    ctx: Context, saturated_jobs_per_s: float, source: str
) -> dict[str, Any]:
    """W1L: W1's jobs registered open-loop (`bench.openloop`: each at its
    scheduled time, whatever the earlier ones are doing) at 50% and 80% of
    W1's saturated jobs/s, `w1l_seconds` each; then the cluster drains and
    every alloc is reported running before the next load. Latencies are
    commit times: register → first plan (eval latency) and plan → the
    client's `running` update (placement → running)."""
    p = ctx.profile
    out: dict[str, Any] = {
        "name": "latency at an offered load: small service jobs, open loop",
        "params": {"seconds": p.w1l_seconds, "allocs_per_job": 10},
        "saturated_jobs_per_s": round(saturated_jobs_per_s, 2),
        "rate_source": source,
        "by_load": {},
    }
    template = jobs.service("w1l-template", 10)
    for load, rate in w1l_rates(saturated_jobs_per_s).items():
        prefix = f"w1l{load}"
        ctx.log(f"W1L {load}%: {rate:.1f} jobs/s for {p.w1l_seconds:g}s, open loop")
        batch = []
        for i in range(len(openloop.schedule(rate, p.w1l_seconds))):
            job = pb.Job()
            job.CopyFrom(template)
            job.id = job.name = f"{prefix}-{i:06d}"
            batch.append(job)
        r: dict[str, Any] = {"load": float(load) / 100}
        try:
            async with Window(ctx, prefix) as w:
                stub = ctx.jobs

                async def call(
                    i: int, stub: job_pb2_grpc.JobAsyncStub = stub, batch: list[pb.Job] = batch
                ) -> None:
                    await stub.Register(job_pb2.JobRegisterRequest(job=batch[i]), timeout=60)

                driver = await openloop.run(call, rate, p.w1l_seconds)
                await wait_quiet(ctx, p.timeout_s)
                await wait_running(ctx, prefix, p.timeout_s)
                await w.finish(f"{prefix}-%", r)
                with ctx.db() as conn:
                    regs = measure.register_commit_times(conn, f"{prefix}-%", w.start_index)
                    to_running, never = measure.placement_to_running_ms(
                        conn, prefix + "-", w.start_index
                    )
        except Exception as exc:
            out["by_load"][load] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        r["driver"] = driver.as_dict()
        if driver.errors:
            r["register_errors"] = driver.errors[:10]
        t0 = regs[0] if regs else None
        r["jobs"] = len(regs)
        r["achieved_jobs_per_s"] = round(
            achieved_rate([(t - t0).total_seconds() for t in regs]) if t0 else 0.0, 2
        )
        r["placement_to_running_ms"] = {k: round(v, 1) for k, v in percentiles(to_running).items()}
        r["never_running"] = never
        out["by_load"][load] = r
    return out


async def wait_running(ctx: Context, prefix: str, timeout: float) -> None:
    """Until every live alloc of the jobs starting with `prefix` is
    reported running (the simulator batches its updates every 200 ms)."""

    async def all_running() -> bool:
        ctx.cluster.check_alive()
        with ctx.db() as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE client_status <> 'running'), count(*) "
                "FROM allocs WHERE job_id LIKE %s AND desired_status = 'run'",
                (prefix + "-%",),
            ).fetchone()
        return row is not None and int(row[0]) == 0

    await wait_for(f"the {prefix} allocs to run", all_running, timeout, poll=0.25)


async def s1_scaling_point(ctx: Context) -> dict[str, Any]:
    """One point of S1's curve: W2's shape with `scaling_w2_jobs` jobs on
    this (fresh) cluster, plus how much each replica's RSS grew per 1,000
    allocs it came to hold."""
    nodes = ctx.cluster.spec.nodes
    out = await w2_c1m(ctx, prefix=f"s1n{nodes}", count=ctx.profile.scaling_w2_jobs)
    out["nodes"] = nodes
    placed = int(out.get("placements", 0))
    growth: dict[str, float] = {}
    for name, f in (out.get("processes") or {}).items():
        if name in ("broker", "planner") or name.startswith("worker"):
            per = rss_per_1000_allocs_mb(
                f.get("rss_start_mb", 0.0), f.get("rss_end_mb", 0.0), placed
            )
            if per is not None:
                growth[name] = round(per, 3)
    out["replica_rss_per_1000_allocs_mb"] = growth
    return out


async def w3_big_job(ctx: Context) -> dict[str, Any]:
    """W3: one job, one eval, one huge plan."""
    p = ctx.profile
    out: dict[str, Any] = {"name": "big job", "params": {"allocs": p.w3_allocs}}
    async with Window(ctx, "w3") as w:
        errors = await register_all(ctx, [jobs.service("w3-big", p.w3_allocs)], 1)
        await wait_quiet(ctx, p.timeout_s)
        await w.finish("w3-%", out)
    out["jobs"] = 1 - len(errors)
    return out


async def w4_node_failure(ctx: Context) -> dict[str, Any]:
    """W4: a system job on every node, then 10% of the nodes stop
    heartbeating at once; every lost service alloc must be replaced."""
    p = ctx.profile
    out: dict[str, Any] = {
        "name": "system job, then 10% of nodes fail",
        "params": {"nodes": p.nodes, "failed_fraction": 0.1},
    }
    async with Window(ctx, "w4") as w:
        await register_all(ctx, [jobs.job("w4-sys", [jobs.Group("g", 1)], type_="system")], 1)
        await wait_quiet(ctx, p.timeout_s)
        with ctx.db() as conn:
            out["system_allocs"] = measure.live_allocs(conn, "w4-sys")
            fail_index = measure.latest_index(conn)
        t_fail = time.monotonic()
        ctx.cluster.fail_nodes()
        expected = int(p.nodes * 0.1)

        async def all_down() -> bool:
            ctx.cluster.check_alive()
            with ctx.db() as conn:
                return len(measure.nodes_down(conn)) >= expected

        # the TTL of a node is between one and two base TTLs, plus the grace
        await wait_for("the failed nodes to be marked down", all_down, p.timeout_s + 300)
        out["detect_s"] = round(time.monotonic() - t_fail, 1)
        await wait_quiet(ctx, p.timeout_s, settle=2.0)
        await w.finish("%", out)
        with ctx.db() as conn:
            down = measure.nodes_down(conn)
            lost, repl = measure.replacements(conn, down, fail_index)
    secs = [r.seconds_after_down for r in repl]
    out["nodes_down"] = len(down)
    out["lost_allocs"] = lost
    out["replaced"] = len(repl)
    out["replacement_p50_s"] = round(percentiles(secs)["p50"], 3) if secs else 0.0
    out["replacement_p99_s"] = round(percentiles(secs)["p99"], 3) if secs else 0.0
    out["replacement_max_s"] = round(max(secs), 3) if secs else 0.0
    return out


async def w5_eval_storm(ctx: Context) -> dict[str, Any]:
    """W5: a burst of updates to one job; the cancelable set should make
    them cost about two scheduler runs."""
    p = ctx.profile
    await register_all(ctx, [jobs.service("w5-storm", 10)], 1)
    await wait_quiet(ctx, p.timeout_s)
    out: dict[str, Any] = {"name": "eval storm: updates to one job", "params": {}}
    updates = [
        jobs.service("w5-storm", 10 + (k % 5) + 1, meta={"rev": str(k)})
        for k in range(p.w5_updates)
    ]
    out["params"] = {"updates": len(updates)}
    async with Window(ctx, "w5") as w:
        t0 = time.monotonic()
        errors = await register_all(ctx, updates, p.in_flight)
        burst = time.monotonic() - t0
        quiet = await wait_quiet(ctx, p.timeout_s)
        await w.finish("w5-%", out)
    counts = out["evals_by_status"]
    out["scheduler_runs"] = sum(n for s, n in counts.items() if s != "canceled")
    out["evals_cancelled"] = counts.get("canceled", 0)
    # runs ~ 1 + the burst's length / one run's length: runs are serial per job
    out["burst_s"] = round(burst, 2)
    out["quiescence_s"] = round(quiet - t0, 2)
    if errors:
        out["register_errors"] = errors[:10]
    return out


async def w5b_reregister_storm(ctx: Context) -> dict[str, Any]:
    """W5b: workers paused; system jobs registered; every node misses its
    heartbeats and comes back; then the workers resume. Measures how long
    the pile of node-update evals takes to drain and how many scheduler
    runs each job costs (Nomad #14621)."""
    p = ctx.profile
    cl = ctx.cluster
    out: dict[str, Any] = {
        "name": "re-register storm with workers paused",
        "params": {"system_jobs": p.w5b_system_jobs, "nodes": p.nodes},
    }
    async with Window(ctx, "w5b") as w:
        await ctx.workers(pause=True)
        sys_jobs = [
            jobs.job(f"w5b-sys-{i:02d}", [jobs.Group("g", 1)], type_="system", cpu=20, memory=32)
            for i in range(p.w5b_system_jobs)
        ]
        await register_all(ctx, sys_jobs, p.in_flight)
        cl.freeze_nodes()
        try:

            async def all_down() -> bool:
                cl.check_alive()
                with ctx.db() as conn:
                    return measure.node_statuses(conn).get("down", 0) >= p.nodes

            await wait_for("every node to be marked down", all_down, p.timeout_s + 300)
        finally:
            cl.thaw_nodes()

        async def all_ready() -> bool:
            with ctx.db() as conn:
                return measure.node_statuses(conn).get("ready", 0) >= p.nodes

        await wait_for("every node to come back", all_ready, p.timeout_s)
        stats = await ctx.broker_stats()
        out["evals_queued"] = stats.total_ready + stats.total_pending + stats.total_blocked
        t0 = time.monotonic()
        resumed_at = time.time()
        await ctx.workers(pause=False)
        quiet = await wait_quiet(ctx, p.timeout_s)
        await w.finish("w5b-%", out)
        with ctx.db() as conn:
            # the quiet time split: the last plan commit (the scheduling) and
            # the last cancel write (the broker's write-back), after the resume
            after = measure.last_commit_seconds_after(conn, "w5b-%", resumed_at, w.start_index)
    counts = out["evals_by_status"]
    runs = sum(n for s, n in counts.items() if s != "canceled")
    out["scheduler_runs"] = runs
    out["runs_per_job"] = round(runs / max(1, p.w5b_system_jobs), 2)
    out["evals_cancelled"] = counts.get("canceled", 0)
    out["quiescence_s"] = round(quiet - t0, 2)  # from the workers' resume
    out["placed_after_resume_s"] = after["placed_s"]
    out["canceled_after_resume_s"] = after["canceled_s"]
    return out
