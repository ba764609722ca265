"""Every file in examples/ parses to the job it documents."""

from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict

from corral.domain.jobspec.load import load_job

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
S = 1_000_000_000


def test_every_example_is_covered():
    names = sorted(p.name for p in EXAMPLES.iterdir())
    assert names == [
        "batch.nomad.hcl",
        "disconnect.nomad.hcl",
        "hello-east.nomad.hcl",
        "hello.json",
        "hello.nomad.hcl",
        "mock.nomad.hcl",
        "sysbatch.nomad.hcl",
        "system.nomad.hcl",
        "variables.nomad.hcl",
    ]


@pytest.mark.parametrize(
    ("name", "job_id", "job_type", "groups"),
    [
        ("hello.nomad.hcl", "hello", "service", {"hello": 1}),
        ("hello-east.nomad.hcl", "hello-east", "service", {"hello": 1}),
        ("hello.json", "hello-json", "service", {"hello": 1}),
        ("batch.nomad.hcl", "batch", "batch", {"work": 3}),
        ("system.nomad.hcl", "node-agent", "system", {"agent": 1}),
        ("sysbatch.nomad.hcl", "inventory", "sysbatch", {"inventory": 1}),
        ("disconnect.nomad.hcl", "sticky", "service", {"cache": 2}),
        ("mock.nomad.hcl", "mock", "service", {"web": 3}),
        ("variables.nomad.hcl", "greeter", "service", {"greeter": 1}),
    ],
)
def test_example_parses(name, job_id, job_type, groups):
    job = load_job(str(EXAMPLES / name))
    assert job.id == job_id
    assert job.type == job_type
    assert {tg.name: tg.count for tg in job.task_groups} == groups
    for tg in job.task_groups:
        for task in tg.tasks:
            assert task.driver in ("raw_exec", "mock")
            assert task.resources.cpu > 0 and task.resources.memory_mb > 0


def test_hello_runs_a_shell_loop():
    job = load_job(str(EXAMPLES / "hello.nomad.hcl"))
    task = job.task_groups[0].tasks[0]
    config = MessageToDict(task.config)
    assert config["command"] == "/bin/sh"
    args = config["args"]
    assert args[0] == "-c" and "hello" in args[1]
    assert "${NOMAD_ALLOC_ID}" in args[1]  # passed through for the client to interpolate
    assert list(job.datacenters) == ["*"]


def test_hello_east_names_its_region():
    assert load_job(str(EXAMPLES / "hello-east.nomad.hcl")).region == "east"


def test_disconnect_example_maps_max_client_disconnect():
    tg = load_job(str(EXAMPLES / "disconnect.nomad.hcl")).task_groups[0]
    assert tg.max_client_disconnect == 120 * S
    assert tg.disconnect.lost_after == 120 * S
    assert tg.update.max_parallel == 1
    assert tg.update.min_healthy_time == 5 * S
    assert tg.update.healthy_deadline == 60 * S
    assert tg.update.progress_deadline == 600 * S  # default filled in


def test_system_and_sysbatch_are_not_rescheduled():
    for name in ("system.nomad.hcl", "sysbatch.nomad.hcl"):
        tg = load_job(str(EXAMPLES / name)).task_groups[0]
        assert not tg.HasField("reschedule_policy")
