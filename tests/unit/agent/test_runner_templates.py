"""Templates and the Task API in the task runner (services/agent/runner.py)
with the real raw_exec driver: the env template's variables reach the
task, the Task API socket and NOMAD_UNIX_ADDR are there; a template that
fails to execute kills the task before it starts (Nomad's "Template
failed"), one whose source escapes the task fails the start like Nomad's
prestart hook ("Task hook failed") and the restart policy decides. These
templates read nothing from the cluster, so no state is needed; reads with
the task's identity are tests/integration/state_api/test_templates_and_task_api.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from corral.domain.template import block
from corral.runtime.settings import SecuritySettings
from corral.security.acl_resolve import RemoteResolver
from corral.testing import mock
from corral.v1 import node_pb2
from corral.v1 import structs_pb2 as pb
from services.agent.drivers.rawexec import RawExecDriver
from services.agent.runner import AllocRunner
from services.agent.task_api import TaskAPI
from services.agent.template_data import TemplateClient


async def signer(
    alloc_id: str, task: str, names: Sequence[str]
) -> node_pb2.NodeSignIdentitiesResponse:
    out = node_pb2.NodeSignIdentitiesResponse()
    for name in names:
        out.signed.add(alloc_id=alloc_id, task=task, identity=name, jwt=f"jwt-{name}")
    return out


@pytest.fixture
async def unused_channel() -> AsyncIterator[grpc.aio.Channel]:
    """A channel nothing here calls (these templates read no variables)."""
    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    yield channel
    await channel.close()


def job_with(*templates: pb.Template, command: str) -> pb.Job:
    job = mock.batch_job(job_id="t", count=1)
    tg = job.task_groups[0]
    tg.restart_policy.CopyFrom(pb.RestartPolicy(attempts=0, mode="fail"))
    task = tg.tasks[0]
    task.driver = "raw_exec"
    task.config.Clear()
    task.config.update({"command": "/bin/sh", "args": ["-c", command]})
    task.identity.CopyFrom(pb.WorkloadIdentity(name="default", env=True))
    task.templates.extend(templates)
    block.canonicalize(task)
    return job


async def run(
    tmp_path: Path, job: pb.Job, channel: grpc.aio.Channel, task_api: TaskAPI | None = None
) -> AllocRunner:
    runner = AllocRunner(
        mock.alloc(job, mock.node(), client_status="pending"),
        job,
        {"raw_exec": RawExecDriver()},
        tmp_path,
        lambda r: None,
        sign=signer,
        templates=TemplateClient(channel),
        task_api=task_api,
    )
    runner.start()
    await asyncio.wait_for(runner._task, 30)  # type: ignore[arg-type]
    return runner


def events(runner: AllocRunner) -> list[tuple[str, str]]:
    return [(e.type, e.display_message) for e in runner.tasks[0].state.events]


async def test_env_templates_and_the_task_api_reach_the_task(
    tmp_path: Path, unused_channel: grpc.aio.Channel
) -> None:
    env = pb.Template(
        embedded_tmpl='GREETING="hello {{ env "NOMAD_JOB_ID" }}"\n',
        dest_path="secrets/app.env",
        envvars=True,
    )
    conf = pb.Template(embedded_tmpl="conf", dest_path="local/app.conf", perms="0600")
    job = job_with(
        env,
        conf,
        command='echo "$GREETING|$NOMAD_UNIX_ADDR|$(cat $NOMAD_TASK_DIR/app.conf)" '
        "> $NOMAD_TASK_DIR/seen; test -S $NOMAD_SECRETS_DIR/api.sock",
    )
    task_api = TaskAPI(
        "http://127.0.0.1:1", RemoteResolver(unused_channel), security=SecuritySettings()
    )
    try:
        runner = await run(tmp_path, job, unused_channel, task_api)
    finally:
        await task_api.close()
    assert runner.client_status()[0] == "complete", events(runner)
    task_dir = runner.tasks[0].task_dir
    seen = (task_dir.local / "seen").read_text().strip()
    assert seen == f"hello t|unix://{task_dir.secrets}/api.sock|conf"
    assert (task_dir.local / "app.conf").stat().st_mode & 0o777 == 0o600
    # the socket goes with the task
    assert not (task_dir.secrets / "api.sock").exists()


async def test_a_template_that_fails_kills_the_task_before_it_starts(
    tmp_path: Path, unused_channel: grpc.aio.Channel
) -> None:
    bad = pb.Template(embedded_tmpl='{{ index . "x" }}', dest_path="local/x")
    started = time.monotonic()
    runner = await run(tmp_path, job_with(bad, command="true"), unused_channel)
    assert time.monotonic() - started < 20
    assert runner.client_status()[0] == "failed"
    kinds = events(runner)
    killing = [d for k, d in kinds if k == "Killing"]
    assert killing and killing[0].startswith("Template failed: template: :1:3: executing"), kinds
    assert "Started" not in [k for k, _ in kinds]
    assert runner.tasks[0].state.failed


async def test_a_source_outside_the_task_fails_the_start_as_a_hook(
    tmp_path: Path, unused_channel: grpc.aio.Channel
) -> None:
    escaping = pb.Template(source_path="/etc/passwd", dest_path="local/x")
    runner = await run(tmp_path, job_with(escaping, command="true"), unused_channel)
    assert runner.client_status()[0] == "failed"
    kinds = events(runner)
    assert ("Task hook failed", "template: template source path escapes alloc directory") in kinds
    assert "Not Restarting" in [k for k, _ in kinds]  # the restart policy (no attempts) decided
