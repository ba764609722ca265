import os
from pathlib import Path

import pytest

from cli.supervisor import RoleProcess, StartError, module_exists, stop_all

ROOT = Path(__file__).resolve().parents[3]


def role(tmp_path: Path, mode: str) -> RoleProcess:
    return RoleProcess(
        mode,
        "tests.unit.cli.role_proc",
        [mode],
        tmp_path / f"{mode}.log",
        tmp_path / f"{mode}.json",
    )


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT)
    return e


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_ready_and_stop(tmp_path):
    r = role(tmp_path, "ok")
    r.start(env())
    info = r.wait_ready(timeout=30)
    assert info["address"] == "127.0.0.1:1" and info["pid"] == r.pid
    assert stop_all([r], grace=10) == []
    assert r.proc is not None and r.proc.returncode is not None
    assert not alive(r.pid)
    assert not r.ready_path.exists()


def test_stubborn_child_is_killed_after_grace(tmp_path):
    r = role(tmp_path, "stubborn")
    r.start(env())
    r.wait_ready(timeout=30)
    assert stop_all([r], grace=0.5) == ["stubborn"]
    assert not alive(r.pid)


def test_crash_before_ready_names_role_and_log(tmp_path):
    r = role(tmp_path, "crash")
    r.start(env())
    with pytest.raises(StartError) as info:
        r.wait_ready(timeout=30)
    message = str(info.value)
    assert "role crash exited with code 3 before it was ready" in message
    assert "boom: cannot bind" in message
    stop_all([r])


def test_missing_role_module_is_reported_without_starting(tmp_path):
    r = RoleProcess("ghost", "services.ghost", [], tmp_path / "g.log", tmp_path / "g.json")
    with pytest.raises(StartError, match=r"role ghost: module services.ghost does not exist yet"):
        r.start(env())
    assert r.proc is None


def test_module_exists_does_not_need_imports():
    assert module_exists("services.state")
    assert not module_exists("services.nothing_here")
