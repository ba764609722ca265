"""A benchmark cluster: embedded PostgreSQL and every role as its own
process, the way `corral dev` runs them, plus the node simulator.

Roles start through `cli.supervisor.RoleProcess` (ready files, their own
session, PR_SET_PDEATHSIG), so a benchmark killed half-way leaves nothing
running. Each process is watched by a `ProcStats` sampler (psutil) for CPU
seconds and peak RSS, the per-process figures every workload reports.

The state service keeps a large change log (`--log-retention`), because
eval latency is read afterwards from the change log's commit times.

Start clusters from the main thread: PR_SET_PDEATHSIG fires when the
*thread* that started a child exits, so a role started from a short-lived
thread is sent SIGTERM as soon as that thread ends.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pydantic import SecretStr

from cli.supervisor import RoleProcess, StartError, stop_all
from corral.security import transport

LOG_RETENTION = 5_000_000
#: on the roles' PYTHONPATH, it loads the ledger's counters into each
#: (bench/ledger_site/corral_ledger_probe.py)
LEDGER_SITE = Path(__file__).resolve().parent / "ledger_site"


@dataclass
class ProcStats:
    """CPU seconds since `mark()` and peak RSS of one process."""

    proc: psutil.Process
    cpu_mark: float = 0.0
    peak_rss: int = 0
    rss_mark: int = 0  # RSS when the window began (replica growth per alloc)

    def cpu_total(self) -> float:
        try:
            t = self.proc.cpu_times()
            return float(t.user + t.system)
        except psutil.Error:
            return self.cpu_mark

    def mark(self) -> None:
        self.cpu_mark = self.cpu_total()
        self.peak_rss = 0
        self.sample()
        self.rss_mark = self.peak_rss

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)

    def rss(self) -> int:
        try:
            return int(self.proc.memory_info().rss)
        except psutil.Error:
            return 0

    def figures(self) -> dict[str, float]:
        return {
            "cpu_s": round(self.cpu_total() - self.cpu_mark, 2),
            "peak_rss_mb": round(self.peak_rss / 2**20, 1),
            "rss_start_mb": round(self.rss_mark / 2**20, 1),
            "rss_end_mb": round(self.rss() / 2**20, 1),
        }


class PostgresStats(ProcStats):
    """CPU of a PostgreSQL server: the postmaster, its live backends and
    (through the postmaster's children times) the backends that already
    exited. RSS is left out: backends share their buffers, so a sum would
    count them many times."""

    def cpu_total(self) -> float:
        try:
            t = self.proc.cpu_times()
            total = float(t.user + t.system + t.children_user + t.children_system)
            for child in self.proc.children():
                with contextlib.suppress(psutil.Error):
                    c = child.cpu_times()
                    total += float(c.user + c.system)
            return total
        except psutil.Error:
            return self.cpu_mark

    def sample(self) -> None:
        return None

    def figures(self) -> dict[str, float]:
        return {"cpu_s": round(self.cpu_total() - self.cpu_mark, 2)}


def postmaster_pid(data_dir: Path) -> int | None:
    """The PID in PostgreSQL's `postmaster.pid` (its first line)."""
    try:
        return int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def role_paths(ledger: bool, code_root: Path | None, pythonpath: str = "") -> dict[str, str]:
    """The environment that makes the roles import the ledger's counters
    (`ledger`) and their code from `code_root`: that tree first on
    PYTHONPATH, and PYTHONSAFEPATH so the working directory (this tree)
    does not come before it."""
    paths = []
    env: dict[str, str] = {}
    if code_root is not None:
        paths.append(str(code_root))
        env["PYTHONSAFEPATH"] = "1"
    if ledger:
        paths.append(str(LEDGER_SITE))
    if not paths:
        return env
    env["PYTHONPATH"] = os.pathsep.join([*paths, *([pythonpath] if pythonpath else [])])
    return env


@dataclass
class ClusterSpec:
    nodes: int = 5000
    workers: int = 1  # worker processes
    loops: int = 0  # scheduler loops per worker process (0: the worker's default)
    classes: int = 5
    racks: int = 25
    datacenters: str = "dc1,dc2"
    node_cpu: int = 4000
    node_memory: int = 8192
    sim_register_rate: float = 1000.0
    state_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    #: count the ledger in every role (bench/ledger.py)
    ledger: bool = True
    #: run the roles from this source tree (`bench.ab`: an older revision
    #: checked out elsewhere) instead of this one
    code_root: Path | None = None
    #: and with this interpreter (its virtualenv's packages; "": this one)
    python: str = ""


class BenchCluster:
    """Start with `start()`, stop with `stop()` (or use as a context manager)."""

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        data_dir: Path | None = None,
        dsn: str = "",
        postgres_pid: int | None = None,
    ) -> None:
        self.spec = spec
        self._own_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="corral-bench-"))
        self.logs = self.data_dir / "logs"
        self.run_dir = self.data_dir / "run"
        self.dsn = dsn
        self._pg: Any = None
        self.roles: dict[str, RoleProcess] = {}
        self.stats: dict[str, ProcStats] = {}
        self._postgres_pid = postgres_pid
        self._sampler_stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.env = dict(os.environ)
        self.env.update(
            {"PYTHONUNBUFFERED": "1", "CORRAL_LOG_FORMAT": "text", "CORRAL_LOG_LEVEL": "WARNING"}
        )
        self.env.update(spec.extra_env)
        self.env.update(role_paths(spec.ledger, spec.code_root, self.env.get("PYTHONPATH", "")))
        # the roles' shared server token (plaintext cluster); this process
        # uses it too, for the internal reads it measures with
        token = self.env.get("CORRAL_SERVER_TOKEN") or secrets.token_urlsafe(32)
        self.env["CORRAL_SERVER_TOKEN"] = token
        transport.configure(
            transport.current().model_copy(update={"server_token": SecretStr(token)})
        )

    # ------------------------------------------------------------ addresses

    def addr(self, role: str) -> str:
        return self.roles[role].address

    @property
    def state_addr(self) -> str:
        return self.addr("state")

    def worker_addrs(self) -> list[str]:
        return [r.address for name, r in self.roles.items() if name.startswith("worker")]

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> BenchCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if not self.dsn:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from corral.devtools.pgserver import EmbeddedPostgres

                self._pg = EmbeddedPostgres(self.data_dir / "pg", delete_on_stop=True)
                self.dsn = self._pg.start()
                self._postgres_pid = postmaster_pid(self.data_dir / "pg")
        self.env["CORRAL_DSN"] = self.dsn
        self._migrate()
        self._role(
            "state",
            "services.state",
            ["--dsn", self.dsn, "--log-retention", str(LOG_RETENTION), *self.spec.state_args],
        )
        self.env["CORRAL_STATE_ADDR"] = self.state_addr
        self._role("broker", "services.broker", ["--dsn", self.dsn])
        self.env["CORRAL_BROKER_ADDR"] = self.addr("broker")
        self._role("planner", "services.planner", ["--dsn", self.dsn])
        self.env["CORRAL_PLANNER_ADDR"] = self.addr("planner")
        self.set_workers(self.spec.workers)
        if self.spec.nodes:
            self.start_sim()
        if self._postgres_pid:
            with contextlib.suppress(psutil.Error):
                self.stats["postgres"] = PostgresStats(psutil.Process(self._postgres_pid))
                self.stats["postgres"].mark()
        self._sampler = threading.Thread(target=self._sample, daemon=True, name="bench-sampler")
        self._sampler.start()

    def start_sim(self) -> None:
        s = self.spec
        self._role(
            "sim",
            "services.agent.sim",
            [
                "--count",
                str(s.nodes),
                "--cpu",
                str(s.node_cpu),
                "--memory",
                str(s.node_memory),
                "--classes",
                str(s.classes),
                "--racks",
                str(s.racks),
                "--datacenters",
                s.datacenters,
                "--register-rate",
                str(s.sim_register_rate),
                "--stats-interval",
                "5",
            ],
            # registering thousands of nodes at a bounded rate takes a while
            ready_timeout=max(120.0, s.nodes / max(1.0, s.sim_register_rate) * 4 + 60),
        )
        self.wait_nodes_ready(timeout=120.0)

    def wait_nodes_ready(self, timeout: float) -> None:
        """Registered nodes turn `ready` with their first heartbeat (the
        simulator spreads those over a few seconds); a workload started
        before would see a smaller cluster."""
        import psycopg

        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT count(*) FROM nodes WHERE status = 'ready'").fetchone()
                ready = int(row[0]) if row else 0
                if ready >= self.spec.nodes:
                    return
                if time.monotonic() > deadline:
                    raise StartError(
                        f"only {ready} of {self.spec.nodes} simulated nodes "
                        f"ready after {timeout:.0f}s"
                    )
                self.check_alive()
                time.sleep(0.25)

    def set_workers(self, count: int) -> None:
        """Run exactly `count` worker processes of `spec.loops` loops each."""
        current = sorted(n for n in self.roles if n.startswith("worker"))
        for name in current[count:]:
            self._stop_role(name)
        for i in range(len(current), count):
            loops = ["--num-schedulers", str(self.spec.loops)] if self.spec.loops else []
            self._role(f"worker{i}", "services.worker", loops)

    def _role(
        self, name: str, module: str, argv: list[str], ready_timeout: float = 90.0
    ) -> RoleProcess:
        if module != "services.agent.sim":
            argv = [*argv, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
        rp = RoleProcess(
            name,
            module,
            argv,
            self.logs / f"{name}.log",
            self.run_dir / f"{name}.json",
            python=self.spec.python,
        )
        self.roles[name] = rp
        rp.start(self.env)
        rp.wait_ready(ready_timeout)
        self.stats[name] = ProcStats(psutil.Process(rp.pid))
        self.stats[name].mark()
        return rp

    def _stop_role(self, name: str) -> None:
        rp = self.roles.pop(name)
        self.stats.pop(name, None)
        stop_all([rp])

    def _migrate(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / "migrate.log", "ab") as log:
            proc = subprocess.run(
                [self.spec.python or sys.executable]
                + ["-m", "services.state", "migrate", "--dsn", self.dsn],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        if proc.returncode != 0:
            raise StartError(f"migrations failed; see {self.logs / 'migrate.log'}")

    def _sample(self) -> None:
        while not self._sampler_stop.wait(0.5):
            for st in list(self.stats.values()):
                st.sample()

    def mark(self) -> None:
        """Start a new measurement window for CPU and peak RSS."""
        for st in self.stats.values():
            st.mark()

    def process_figures(self) -> dict[str, dict[str, float]]:
        return {name: st.figures() for name, st in self.stats.items()}

    def metrics_addrs(self) -> dict[str, str]:
        """host:port of each role's Prometheus /metrics (the simulator has none)."""
        return {
            name: str(rp.info["metrics"])
            for name, rp in self.roles.items()
            if rp.info.get("metrics")
        }

    def pids(self) -> dict[str, int]:
        """The role processes (PostgreSQL is not Python: not profiled)."""
        return {name: rp.pid for name, rp in self.roles.items()}

    def signal_sim(self, sig: int) -> None:
        self.roles["sim"].signal(sig)

    def fail_nodes(self) -> None:
        """The simulator stops heartbeating `--fail-fraction` of its nodes."""
        self.signal_sim(signal.SIGUSR1)

    def revive_nodes(self) -> None:
        self.signal_sim(signal.SIGUSR2)

    def freeze_nodes(self) -> None:
        """Stop the simulator process: every node misses its heartbeats."""
        self.signal_sim(signal.SIGSTOP)

    def thaw_nodes(self) -> None:
        self.signal_sim(signal.SIGCONT)

    def check_alive(self) -> None:
        for name, rp in self.roles.items():
            if rp.proc is not None and rp.proc.poll() is not None:
                raise StartError(
                    f"{name} exited with code {rp.proc.returncode}; "
                    f"last lines of {rp.log_path}:\n{rp.tail(20)}"
                )

    def stop(self) -> None:
        self._sampler_stop.set()
        stop_all(list(self.roles.values()))
        self.roles.clear()
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._pg.stop()
            self._pg = None
        if self._own_dir and not os.environ.get("CORRAL_BENCH_KEEP"):
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check_alive()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
