"""`corral event stream` against a real state service process (the event
stream is served by the state service alone, so this runs before the other
roles exist): topic/key filters, index order, -index replay, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.security import transport
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.leaders import TEST_LEADER_ADDRESS, hold_leadership

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def state_addr(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("state")
    ready = workdir / "ready.json"
    with open(workdir / "state.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.state", "--dsn", pg_dsn, "--listen", "127.0.0.1:0",
             "--ready-file", str(ready)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, (workdir / "state.log").read_text()
            assert time.monotonic() < deadline, "state service not ready"
            time.sleep(0.1)
        yield json.loads(ready.read_text())["address"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module", autouse=True)
def broker_leader(pg_dsn: str) -> Iterator[str]:
    """The evals below are written as the broker leader would (the state
    refuses eval writes from anyone else)."""
    with hold_leadership(pg_dsn, "broker") as address:
        yield address


def upsert_eval(addr: str, job_id: str) -> int:
    ev = pb.Evaluation(
        id=str(uuid.uuid4()), namespace="default", priority=50, type="service",
        triggered_by="job-register", job_id=job_id, status="pending",
    )  # fmt: skip
    with transport.dial_sync(addr) as ch:
        resp = state_pb2_grpc.StateStub(ch).UpsertEvals(
            state_pb2.UpsertEvalsRequest(evals=[ev], leader_id=TEST_LEADER_ADDRESS), timeout=30
        )
    return int(resp.index)


def current_index(addr: str) -> int:
    with transport.dial_sync(addr) as ch:
        return int(
            state_pb2_grpc.StateStub(ch).GetIndex(state_pb2.GetIndexRequest(), timeout=30).index
        )


def cli(addr: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, CORRAL_ADDR=addr)
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def read_lines(proc: subprocess.Popen[str], n: int, timeout: float = 60) -> list[str]:
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if len(lines) >= n:
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    done.wait(timeout)
    return lines


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def test_stream_filters_by_job_in_index_order(state_addr: str) -> None:
    # -index 0 would mean "from now"; replay from a real index so that no
    # event written while the command starts up is missed
    start = upsert_eval(state_addr, "ev-warmup")
    stream = cli(
        state_addr, "event", "stream", "-json", "-topic", "Eval:ev-a", "-index", str(start)
    )
    try:
        written = []
        for job in ("ev-a", "ev-b", "ev-a", "ev-b", "ev-a"):
            idx = upsert_eval(state_addr, job)
            if job == "ev-a":
                written.append(idx)
        lines = read_lines(stream, 3)
    finally:
        code = stop(stream)
    events: list[dict[str, Any]] = [json.loads(line) for line in lines]
    assert [e["index"] for e in events] == written
    assert all(e["topic"] == "Evaluation" and e["evaluation"]["job_id"] == "ev-a" for e in events)
    assert code == 130
    assert "Traceback" not in (stream.stderr.read() if stream.stderr else "")


def test_replay_from_index_and_human_output(state_addr: str) -> None:
    before = current_index(state_addr)
    idx = upsert_eval(state_addr, "ev-human")
    stream = cli(
        state_addr, "event", "stream", "-topic", "Evaluation:ev-human", "-index", str(before)
    )
    try:
        lines = read_lines(stream, 1)
    finally:
        stop(stream)
    assert lines, "no event replayed"
    fields = lines[0].split()
    assert int(fields[0]) == idx and fields[1] == "Evaluation"
    assert "job=ev-human" in lines[0] and "status=pending" in lines[0]


def test_index_ahead_of_state_is_one_line_error(state_addr: str) -> None:
    proc = cli(state_addr, "event", "stream", "-index", str(current_index(state_addr) + 1000))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.startswith("Error: ") and err.count("\n") == 1, err


def test_unknown_topic_is_refused_before_connecting(state_addr: str) -> None:
    proc = cli(state_addr, "event", "stream", "-topic", "Jobs")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.startswith("Error: unknown topic 'Jobs'")
