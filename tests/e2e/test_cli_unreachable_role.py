"""`corral job run` names an unreachable role within seconds and exits 1,
instead of monitoring a pending eval forever (cli/monitor.py): with no eval
broker started, or with the broker leader killed, or with no worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from tests.cluster import Cluster
from tests.e2e.test_cli_dev import EXAMPLES, ROOT

#: the monitor notices after 5 s of a pending eval; the rest is the CLI's
#: start-up and registration on a loaded machine (it used to wait forever)
LIMIT_S = 45


def job_run(c: Cluster) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "CORRAL_ADDR": c.state_addr}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "job", "run", str(EXAMPLES / "mock.nomad.hcl")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc, time.monotonic() - started


def test_no_broker_started(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.start("state")
    proc, took = job_run(c)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("Error: no eval broker is running (none registered"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Monitoring evaluation" in proc.stdout
    assert took < LIMIT_S


def test_broker_killed_then_worker_missing(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    c.start("state")
    c.start("broker")
    c.start("planner")
    c.kill("broker")
    proc, took = job_run(c)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("Error: no eval broker is running (1 registered, none answers"), (
        proc.stderr
    )
    assert took < LIMIT_S
    c.restart("broker")
    proc, took = job_run(c)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("Error: no scheduler worker is running"), proc.stderr
    assert took < LIMIT_S
