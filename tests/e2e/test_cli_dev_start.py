"""`corral dev` start-up failures: a missing role is named and everything
already started is stopped (no PostgreSQL or role left running)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_http_port_in_use_is_an_actionable_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "cli", "dev", "-data-dir", str(tmp_path), "-port", "0",
             "-http-port", str(port)],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"Error: HTTP port {port} on 127.0.0.1 is in use")
    assert "-http-port" in proc.stderr and "Traceback" not in proc.stderr
