"""`corral dev` as a subprocess, the way the end-to-end tests start it:
launched with its output collected, waited for until it wrote dev.json
(failing the test with that output if it exits or takes too long), and
stopped with Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 180.0


@dataclass
class DevProcess:
    proc: subprocess.Popen[str]
    data_dir: Path
    #: dev.json: the address, roles, and (with -tls/-acl) what to export
    info: dict[str, Any] = field(default_factory=dict)
    #: every line it printed so far
    output: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def http_addr(self) -> str:
        """The HTTP gateway's base URL (`http://host:port`, https with -tls)."""
        return str(self.info["http_addr"])

    @property
    def token(self) -> str:
        """The management token `-acl` printed ('' without -acl)."""
        for line in self.info.get("exports", []):
            if line.startswith("export CORRAL_TOKEN="):
                return str(line.split("=", 1)[1])
        return ""


def cli(
    address: str,
    *args: str,
    stdin: str | None = None,
    timeout: float = 120,
    token: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`corral ARGS -address ADDRESS`, its output captured; with `token`,
    as that token (CORRAL_TOKEN, the environment's server token left out)."""
    env = None
    if token is not None:
        env = {**os.environ, "CORRAL_TOKEN": token}
        env.pop("CORRAL_SERVER_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "cli", *args, "-address", address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        env=env,
        check=False,
    )


class DevClient:
    """A test's hands on a `corral dev -acl`: Nomad's HTTP API and the CLI,
    as the management token unless told another."""

    def __init__(self, dev: DevProcess, tmp: Path) -> None:
        self.dev = dev
        self.tmp = tmp
        self.url = dev.http_addr
        self.token = dev.token

    def request(
        self, method: str, path: str, token: str | None = None, **kw: Any
    ) -> requests.Response:
        headers = {"X-Nomad-Token": self.token if token is None else token}
        return requests.request(method, self.url + path, headers=headers, timeout=30, **kw)

    def get(self, path: str, token: str | None = None, **params: Any) -> requests.Response:
        return self.request("GET", path, token, params=params)

    def ok(self, path: str, **params: Any) -> Any:
        resp = self.get(path, **params)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def corral(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        return cli(self.dev.info["address"], *args, token=self.token if token is None else token)

    def run(self, name: str, spec: str) -> None:
        """`corral job run -detach` of the job file `spec`."""
        path = self.tmp / f"{name}.nomad.hcl"
        path.write_text(spec)
        done = self.corral("job", "run", "-detach", str(path))
        assert done.returncode == 0, done.stderr


def start_dev(data_dir: Path, *flags: str, env: dict[str, str] | None = None) -> DevProcess:
    """`corral dev -data-dir DATA_DIR -port 0 FLAGS`, once it is up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "dev", "-data-dir", str(data_dir), "-port", "0", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    dev = DevProcess(proc, data_dir)
    stdout = proc.stdout
    assert stdout is not None
    dev.reader = threading.Thread(
        target=lambda: dev.output.extend(iter(stdout.readline, "")), daemon=True
    )
    dev.reader.start()
    summary = data_dir / "dev.json"
    deadline = time.monotonic() + START_TIMEOUT
    while not summary.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            dev.reader.join(5)
            pytest.fail(f"corral dev {' '.join(flags)} did not start:\n" + "".join(dev.output))
        time.sleep(0.2)
    dev.info = json.loads(summary.read_text())
    return dev


def stop_dev(dev: DevProcess) -> None:
    """Ctrl-C, as a person would; killed if it has not stopped in a minute."""
    if dev.proc.poll() is None:
        dev.proc.send_signal(signal.SIGINT)
        try:
            dev.proc.wait(60)
        except subprocess.TimeoutExpired:
            dev.proc.kill()
    if dev.reader is not None:
        dev.reader.join(5)
