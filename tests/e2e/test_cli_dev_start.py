"""`corral dev` start-up failures: a missing role is named and everything
already started is stopped (no PostgreSQL or role left running)."""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_port_in_use_is_an_actionable_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "cli", "dev", "-data-dir", str(tmp_path), "-port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"Error: port {port} on 127.0.0.1 is in use")
    assert "Traceback" not in proc.stderr


def _first_missing_role() -> str | None:
    for role in ("state", "broker", "planner", "worker", "agent"):
        try:
            if find_spec(f"services.{role}.__main__") is None:
                return role
        except ModuleNotFoundError:
            return role
    return None


@pytest.mark.skipif(
    _first_missing_role() is None, reason="every role exists: nothing to report missing"
)
def test_missing_role_is_named_and_nothing_is_left_running(tmp_path: Path) -> None:
    missing = _first_missing_role()
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "dev", "-ephemeral", "-port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"role {missing}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "==> Stopped" in proc.stdout
