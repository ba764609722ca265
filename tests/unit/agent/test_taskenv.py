"""A task's NOMAD_* environment and `${...}` interpolation (services/agent/taskenv.py),
and the runner giving a real process its resolved config, env and payload."""

from __future__ import annotations

import asyncio
from pathlib import Path

from corral.domain import structs
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.agent import taskenv
from services.agent.drivers.rawexec import RawExecDriver
from services.agent.runner import AllocRunner


def node() -> pb.Node:
    n = mock.node()
    n.id = "node-1234"
    n.name = "client-a"
    n.datacenter = "dc9"
    n.node_class = "gpu"
    n.node_pool = "batch-pool"
    n.attributes["kernel.name"] = "linux"
    n.meta["rack"] = "r12"
    return n


def job() -> pb.Job:
    j = mock.batch_job(job_id="render", count=3)
    j.namespace = "media"
    j.name = "render-name"
    j.meta.update({"owner": "job", "level": "job", "my-key": "dashed"})
    tg = j.task_groups[0]
    tg.meta.update({"level": "group", "group_only": "g"})
    t = tg.tasks[0]
    t.meta.update({"level": "task"})
    t.resources.cpu = 250
    t.resources.memory_mb = 128
    return j


def alloc(j: pb.Job, index: int = 2) -> pb.Allocation:
    a = mock.alloc(j, node())
    a.name = structs.alloc_name(j.id, j.task_groups[0].name, index)
    return a


def dirs(tmp_path: Path) -> taskenv.TaskDirs:
    return taskenv.TaskDirs(str(tmp_path / "a"), str(tmp_path / "t/local"), str(tmp_path / "t/s"))


def build(j: pb.Job, task: pb.Task, tmp_path: Path) -> taskenv.TaskEnv:
    return taskenv.build(alloc(j), j, task, node(), dirs=dirs(tmp_path), home=str(tmp_path))


def test_runtime_values_are_exported(tmp_path: Path) -> None:
    j = job()
    a = alloc(j)
    env = taskenv.build(
        a, j, j.task_groups[0].tasks[0], node(), dirs=dirs(tmp_path), home=str(tmp_path)
    ).env
    assert env["NOMAD_ALLOC_ID"] == a.id and env["NOMAD_SHORT_ALLOC_ID"] == a.id[:8]
    assert env["NOMAD_ALLOC_INDEX"] == "2"
    assert env["NOMAD_ALLOC_NAME"] == "render.web[2]"
    assert env["NOMAD_JOB_ID"] == "render" and env["NOMAD_JOB_NAME"] == "render-name"
    assert env["NOMAD_GROUP_NAME"] == "web" and env["NOMAD_TASK_NAME"] == "web"
    assert env["NOMAD_DC"] == "dc9" and env["NOMAD_REGION"] == "global"
    assert env["NOMAD_NAMESPACE"] == "media"
    assert env["NOMAD_CPU_LIMIT"] == "250" and env["NOMAD_MEMORY_LIMIT"] == "128"
    assert env["NOMAD_ALLOC_DIR"] == str(tmp_path / "a")
    assert env["NOMAD_TASK_DIR"] == str(tmp_path / "t" / "local")
    assert env["NOMAD_SECRETS_DIR"] == str(tmp_path / "t" / "s")
    assert "NOMAD_JOB_PARENT_ID" not in env
    assert "NOMAD_MEMORY_MAX_LIMIT" not in env


def test_meta_merges_job_group_task_with_the_most_specific_winning(tmp_path: Path) -> None:
    j = job()
    env = build(j, j.task_groups[0].tasks[0], tmp_path).env
    assert env["NOMAD_META_level"] == env["NOMAD_META_LEVEL"] == "task"
    assert env["NOMAD_META_owner"] == env["NOMAD_META_OWNER"] == "job"
    assert env["NOMAD_META_group_only"] == env["NOMAD_META_GROUP_ONLY"] == "g"
    assert env["NOMAD_META_my_key"] == env["NOMAD_META_MY_KEY"] == "dashed"


def test_interpolation_of_env_and_config(tmp_path: Path) -> None:
    j = job()
    task = j.task_groups[0].tasks[0]
    task.env.update(
        {
            "ITEM": "${NOMAD_ALLOC_INDEX}",
            "WHERE": "${node.unique.name}/${node.datacenter}/${node.class}/${node.pool}",
            "HOST": "${attr.kernel.name}:${meta.rack}:${node.unique.id}",
            "NOMAD_DC": "overridden by the task",
        }
    )
    te = build(j, task, tmp_path)
    assert te.env["ITEM"] == "2"
    assert te.env["WHERE"] == "client-a/dc9/gpu/batch-pool"
    assert te.env["HOST"] == "linux:r12:node-1234"
    assert te.env["NOMAD_DC"] == "overridden by the task"
    config = te.config(
        {
            "command": "/bin/echo",
            "args": ["${NOMAD_JOB_ID}-${NOMAD_ALLOC_INDEX}", "${ITEM}", 3, True],
            "nested": {"dir": "${NOMAD_TASK_DIR}/x", "meta": "${NOMAD_META_owner}"},
        }
    )
    assert config == {
        "command": "/bin/echo",
        "args": ["render-2", "2", 3, True],
        "nested": {"dir": f"{tmp_path / 't' / 'local'}/x", "meta": "job"},
    }


def test_unknown_references_are_left_as_written() -> None:
    variables = {"NOMAD_ALLOC_INDEX": "0"}
    assert (
        taskenv.interpolate(
            "${NOMAD_ALOC_INDEX} ${attr.nope} $HOME ${NOMAD_ALLOC_INDEX}", variables
        )
        == "${NOMAD_ALOC_INDEX} ${attr.nope} $HOME 0"
    )
    assert taskenv.interpolate("${ NOMAD_ALLOC_INDEX }", variables) == "0"


def test_a_dispatched_child_knows_its_parent(tmp_path: Path) -> None:
    j = job()
    j.parent_id = "render-parent"
    j.dispatched = True
    env = build(j, j.task_groups[0].tasks[0], tmp_path).env
    assert env["NOMAD_JOB_PARENT_ID"] == "render-parent"


async def test_the_process_gets_resolved_config_env_and_payload(tmp_path: Path) -> None:
    j = job()
    j.dispatched = True
    j.parent_id = "render"
    j.payload = b"payload bytes\n"
    tg = j.task_groups[0]
    tg.restart_policy.CopyFrom(pb.RestartPolicy(attempts=0, mode="fail"))
    task = tg.tasks[0]
    task.driver = "raw_exec"
    task.dispatch_payload.file = "in/payload.txt"
    task.env["ITEM"] = "${NOMAD_ALLOC_INDEX}"
    task.config.Clear()
    task.config.update(
        {
            "command": "/bin/sh",
            "args": [
                "-c",
                'echo "arg=${NOMAD_ALLOC_INDEX} item=$ITEM rack=${meta.rack}'
                ' meta=$NOMAD_META_LEVEL"; cat "$NOMAD_TASK_DIR/in/payload.txt"',
            ],
        }
    )
    a = alloc(j, index=1)
    runner = AllocRunner(a, j, {"raw_exec": RawExecDriver()}, tmp_path, lambda r: None, node=node())
    runner.start()
    await asyncio.wait_for(runner._task, 10)  # type: ignore[arg-type]
    assert runner.client_status()[0] == "complete"
    alloc_dir = tmp_path / "allocs" / a.id
    assert (alloc_dir / task.name / "local/in/payload.txt").read_bytes() == b"payload bytes\n"
    out = (alloc_dir / "alloc/logs" / f"{task.name}.stdout.0").read_text()
    assert out == "arg=1 item=1 rack=r12 meta=task\npayload bytes\n"


def test_memory_max_limit_comes_from_what_the_scheduler_allocated(tmp_path: Path) -> None:
    j = job()
    task = j.task_groups[0].tasks[0]
    task.resources.memory_max_mb = 512  # asked for; granted only with oversubscription
    a = alloc(j)
    granted = taskenv.build(
        a,
        j,
        task,
        node(),
        dirs=dirs(tmp_path),
        home=str(tmp_path),
        resources=pb.Resources(cpu=250, memory_mb=128, memory_max_mb=512),
    ).env
    assert granted["NOMAD_MEMORY_LIMIT"] == "128" and granted["NOMAD_MEMORY_MAX_LIMIT"] == "512"
    refused = taskenv.build(
        a,
        j,
        task,
        node(),
        dirs=dirs(tmp_path),
        home=str(tmp_path),
        resources=pb.Resources(cpu=250, memory_mb=128),
    ).env
    assert "NOMAD_MEMORY_MAX_LIMIT" not in refused
