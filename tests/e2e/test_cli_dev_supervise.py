"""`corral dev` supervises its roles and PostgreSQL as an init system
would: one killed with SIGKILL comes back (a line on the terminal says so)
and jobs still run; one that keeps dying makes `corral dev` give up with its
log tail and exit 1; Ctrl-C still stops everything."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.devprocess import start_dev, stop_dev
from tests.e2e.test_cli_dev import (
    EXAMPLES,
    Dev,
    corral,
    corral_json,
    statuses,
)
from tests.wait import wait_for

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def dev() -> Iterator[Dev]:
    """A `corral dev` of this module's own, in a directory the embedded
    PostgreSQL's own user can reach (pytest's base temp is private to root)."""
    data_dir = Path(tempfile.mkdtemp(prefix="corral-dev-supervise-"))
    started = start_dev(data_dir)
    d = Dev(started.proc, data_dir, started.info["address"], started.info, started.output)
    wait_for(
        "the dev client node",
        lambda: [n for n in corral_json(d, "node", "status") if n["status"] == "ready"],
    )
    yield d
    stop_dev(started)
    shutil.rmtree(data_dir, ignore_errors=True)


def role_pid(d: Dev, role: str) -> int:
    """The pid of the role's current process (restarts get new ones)."""
    for child in psutil.Process(d.proc.pid).children():
        try:
            if f"services.{role}" in child.cmdline():
                return int(child.pid)
        except psutil.NoSuchProcess:
            continue
    return 0


def said(d: Dev, text: str) -> bool:
    return any(text in line for line in d.output)


def test_killed_roles_and_postgres_come_back_and_jobs_run(dev: Dev) -> None:
    for role in ("state", "broker"):
        pid = role_pid(dev, role)
        assert pid, "".join(dev.output)
        os.kill(pid, signal.SIGKILL)
        wait_for(
            f"the restart line for {role}",
            lambda r=role: said(dev, f"==> {r} exited with code -9; restarting in 1s"),  # type: ignore[misc]
        )
        wait_for(f"{role} running again", lambda r=role: said(dev, f"==> {r} is running again"))  # type: ignore[misc]
    run = corral(dev, "job", "run", "-detach", str(EXAMPLES / "hello.nomad.hcl"))
    assert run.returncode == 0, run.stdout + run.stderr
    wait_for("hello running", lambda: statuses(dev, "hello") == ["running"])

    # the embedded PostgreSQL too: every role reconnects by itself
    postmaster = int((dev.data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)
    wait_for("the restart line for postgres", lambda: said(dev, "==> postgres exited"))
    wait_for("postgres running again", lambda: said(dev, "==> postgres is running again"))
    spec = (EXAMPLES / "hello.nomad.hcl").read_text().replace('job "hello"', 'job "after-pg"')
    f = dev.data_dir / "after-pg.nomad.hcl"
    f.write_text(spec)

    def runs() -> bool:
        return corral(dev, "job", "run", "-detach", str(f)).returncode == 0

    wait_for("a job registration after the PostgreSQL restart", runs)
    wait_for("after-pg running", lambda: statuses(dev, "after-pg") == ["running"])


def test_zz_a_role_that_keeps_dying_makes_dev_give_up(dev: Dev) -> None:
    pids = [role_pid(dev, r) for r in ("state", "broker", "planner", "agent")]
    killed: set[int] = set()

    def kill_worker() -> bool:
        """Kill each new worker process as soon as it appears."""
        if dev.proc.poll() is not None:
            return True
        pid = role_pid(dev, "worker")
        if pid and pid not in killed:
            killed.add(pid)
            os.kill(pid, signal.SIGKILL)
        return False

    wait_for("corral dev to give up on the worker", kill_worker, timeout=120)
    assert dev.proc.wait(60) == 1
    out = "".join(dev.output)
    assert "worker exited with code -9; it died 5 times within 60s, giving up" in out
    assert "Last lines of its log" in out
    for pid in pids:  # everything else was stopped
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
