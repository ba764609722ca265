"""How a task's workload identities reach it (services/agent/identity.py):
Nomad's env names and file paths, files 0600, a refused identity failing
the start, a TTL identity rewritten before it expires. The signer here is
a function standing in for the state's Node.SignIdentities (its signing
is tested against a real state in tests/integration/state_api)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from corral.testing import mock
from corral.v1 import node_pb2
from corral.v1 import structs_pb2 as pb
from services.agent.allocdir import AllocDir
from services.agent.drivers.mock import MockDriver
from services.agent.identity import IdentityError, TaskIdentities, exposed, write_secret
from services.agent.runner import AllocRunner
from tests.wait import until

_counter = itertools.count()


async def signer(
    alloc_id: str, task: str, names: Sequence[str]
) -> node_pb2.NodeSignIdentitiesResponse:
    out = node_pb2.NodeSignIdentitiesResponse()
    for name in names:
        if name == "refused":
            out.rejections.add(
                alloc_id=alloc_id, task=task, identity=name, reason="identity not found"
            )
            continue
        ttl = 3 if name == "short" else 0
        out.signed.add(
            alloc_id=alloc_id,
            task=task,
            identity=name,
            jwt=f"jwt-{name}-{next(_counter)}",
            expiration=int((time.time() + ttl) * 1e9) if ttl else 0,
        )
    return out


def task_with(
    *identities: pb.WorkloadIdentity, default: pb.WorkloadIdentity | None = None
) -> pb.Task:
    t = pb.Task(name="web", identities=list(identities))
    if default is not None:
        t.identity.CopyFrom(default)
    return t


async def test_env_and_files_as_nomad_puts_them(tmp_path: Path) -> None:
    task = task_with(
        pb.WorkloadIdentity(name="vault", env=True, file=True, audience=["v"]),
        pb.WorkloadIdentity(name="custom", file=True, filepath="local/id.jwt"),
        pb.WorkloadIdentity(name="unused"),
        default=pb.WorkloadIdentity(name="default", env=True, file=True),
    )
    assert [w.name for w in exposed(task)] == ["default", "vault", "custom"]
    ids = TaskIdentities(signer, "a1", task, tmp_path)
    env = await ids.setup()
    assert set(env) == {"NOMAD_TOKEN", "NOMAD_TOKEN_vault"}
    token = tmp_path / "secrets" / "nomad_token"
    assert token.read_text() == env["NOMAD_TOKEN"]
    assert token.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "secrets" / "nomad_vault.jwt").read_text() == env["NOMAD_TOKEN_vault"]
    assert (tmp_path / "local" / "id.jwt").read_text().startswith("jwt-custom-")
    assert not list((tmp_path / "secrets").glob(".*.tmp"))


async def test_a_task_that_asks_for_nothing_gets_nothing(tmp_path: Path) -> None:
    ids = TaskIdentities(signer, "a1", task_with(), tmp_path)
    assert await ids.setup() == {} and not (tmp_path / "secrets").exists()


async def test_a_refused_identity_fails_the_start(tmp_path: Path) -> None:
    ids = TaskIdentities(
        signer, "a1", task_with(pb.WorkloadIdentity(name="refused", env=True)), tmp_path
    )
    with pytest.raises(IdentityError, match="refused: identity not found"):
        await ids.setup()


async def test_a_ttl_identity_is_rewritten_before_it_expires(tmp_path: Path) -> None:
    task = task_with(pb.WorkloadIdentity(name="short", file=True, ttl=3 * 10**9))
    ids = TaskIdentities(signer, "a1", task, tmp_path)
    await ids.setup()
    path = tmp_path / "secrets" / "nomad_short.jwt"
    first = path.read_text()
    renewing = asyncio.create_task(ids.renew())
    try:
        await until(lambda: path.read_text() != first, timeout=10, what="renewed identity")
    finally:
        renewing.cancel()
    assert path.stat().st_mode & 0o777 == 0o600


def test_write_secret_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "d" / "f"
    write_secret(path, "one")
    write_secret(path, "two")
    assert path.read_text() == "two" and path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(IdentityError, match="does not exist"):
        write_secret(path, "x", user="no-such-user-here")


async def test_alloc_exec_runs_with_the_tokens_the_task_started_with(tmp_path: Path) -> None:
    """A command run by alloc exec sees the task's environment as it was
    started, its workload identity's token included (Nomad's executor runs
    exec'd commands with the task's own environment); a fresh environment
    would have no token."""
    job = mock.job()
    task = job.task_groups[0].tasks[0]
    task.identity.CopyFrom(pb.WorkloadIdentity(name="default", env=True, file=True))
    task.config.Clear()
    task.config.update({"run_for": "1h"})
    alloc = mock.alloc(job, mock.node())
    runner = AllocRunner(alloc, job, {"mock": MockDriver()}, tmp_path, lambda r: None, sign=signer)
    runner.start()
    try:
        await until(lambda: runner.client_status()[0] == "running", timeout=10, what="running")
        _, _, cfg = runner.exec_target(task.name)
        token = AllocDir.of(tmp_path, alloc.id).task(task.name).secrets / "nomad_token"
        assert cfg.env["NOMAD_TOKEN"].startswith("jwt-default-")
        assert cfg.env["NOMAD_TOKEN"] == token.read_text()
        assert cfg.env["NOMAD_ALLOC_ID"] == alloc.id
    finally:
        await runner.stop()
