"""The `lifecycle` and `logs` blocks of a task, in HCL and Nomad's JSON, with
Nomad's defaults and checks, and the state's own check of a job sent
without the parser."""

from __future__ import annotations

import json

import pytest

from corral.domain.errors import InvalidArgument
from corral.domain.jobspec import json as jobspec_json
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job
from services.state.writes.jobs import canonicalize, validate_job

HCL = """
job "web" {
  group "g" {
    ephemeral_disk { size = 300 }
    task "init" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      lifecycle { hook = "prestart" }
    }
    task "proxy" {
      driver = "raw_exec"
      config { command = "/bin/sleep" }
      lifecycle {
        hook    = "prestart"
        sidecar = true
      }
    }
    task "main" {
      driver = "raw_exec"
      config { command = "/bin/sleep" }
      logs {
        max_files     = 3
        max_file_size = 5
      }
    }
    task "extra" {
      driver = "raw_exec"
      config { command = "/bin/sleep" }
      %s
    }
    task "cleanup" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      lifecycle { hook = "poststop" }
      logs { disabled = true }
    }
  }
}
"""


def test_lifecycle_and_logs_in_hcl() -> None:
    job = parse_job(HCL % "", "j.hcl")
    tasks = {t.name: t for t in job.task_groups[0].tasks}
    assert (tasks["init"].lifecycle.hook, tasks["init"].lifecycle.sidecar) == ("prestart", False)
    assert (tasks["proxy"].lifecycle.hook, tasks["proxy"].lifecycle.sidecar) == ("prestart", True)
    assert not tasks["main"].HasField("lifecycle")
    assert tasks["cleanup"].lifecycle.hook == "poststop"
    main = tasks["main"].log_config
    assert (main.max_files, main.max_file_size_mb, main.disabled) == (3, 5, False)
    # Nomad's defaults where the block leaves them out, or there is none
    assert tasks["init"].log_config.max_files == 10
    assert tasks["init"].log_config.max_file_size_mb == 10
    assert tasks["cleanup"].log_config.disabled


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ('lifecycle { hook = "prestop" }', "invalid hook 'prestop'"),
        ("lifecycle { sidecar = true }", "no lifecycle hook provided"),
        ("logs { max_files = 0 }", "minimum number of files is 1; got 0"),
        (
            "logs {\n max_files = 30\n max_file_size = 10\n }",
            "log storage (300 MB) must be less than requested disk capacity (300 MB)",
        ),
        ("logs { enabled = false }", "use disabled = true"),
        ("logs { rotate = true }", "unknown argument 'rotate'"),
    ],
)
def test_bad_blocks_are_refused(extra: str, problem: str) -> None:
    with pytest.raises(JobspecError) as err:
        parse_job(HCL % extra, "j.hcl")
    assert problem in str(err.value)


def test_enabled_true_is_accepted_as_nomad_does() -> None:
    job = parse_job(HCL % "logs { enabled = true }", "j.hcl")
    assert not job.task_groups[0].tasks[3].log_config.disabled


def test_a_group_of_lifecycle_tasks_only_is_refused() -> None:
    text = HCL % 'lifecycle { hook = "poststart" }'
    text = text.replace('task "main" {', 'task "main" {\n lifecycle { hook = "poststart" }')
    with pytest.raises(JobspecError) as err:
        parse_job(text, "j.hcl")
    assert "must have at least one main task" in str(err.value)


def test_lifecycle_and_logs_in_nomad_json() -> None:
    task = {
        "Name": "init",
        "Driver": "raw_exec",
        "Config": {"command": "/bin/true"},
        "Lifecycle": {"Hook": "prestart", "Sidecar": False},
        "LogConfig": {"MaxFiles": 2, "MaxFileSizeMB": 4, "Disabled": False, "Enabled": None},
    }
    main = {"Name": "main", "Driver": "raw_exec", "Config": {"command": "/bin/sleep"}}
    job = jobspec_json.from_nomad({"ID": "j", "TaskGroups": [{"Name": "g", "Tasks": [task, main]}]})
    init = job.task_groups[0].tasks[0]
    assert init.lifecycle.hook == "prestart"
    assert (init.log_config.max_files, init.log_config.max_file_size_mb) == (2, 4)
    assert job.task_groups[0].tasks[1].log_config.max_files == 10
    with pytest.raises(JobspecError) as err:
        jobspec_json.parse(
            json.dumps(
                {
                    "Job": {
                        "ID": "j",
                        "TaskGroups": [
                            {"Name": "g", "Tasks": [{**main, "Lifecycle": {"Hook": "later"}}]}
                        ],
                    }
                }
            )
        )
    assert "invalid hook 'later'" in str(err.value)


def test_the_state_checks_jobs_sent_without_the_parser() -> None:
    job = parse_job(HCL % "", "j.hcl")
    job.task_groups[0].tasks[0].lifecycle.hook = "sometime"
    with pytest.raises(InvalidArgument) as err:
        validate_job(canonicalize(job))
    assert "job.task_groups[0].tasks[0].lifecycle.hook" in str(err.value)
    bare = parse_job(HCL % "", "j.hcl")
    for t in bare.task_groups[0].tasks:
        t.ClearField("log_config")
    filled = canonicalize(bare)  # a gRPC client's job: Nomad's defaults filled in
    assert all(t.log_config.max_files == 10 for t in filled.task_groups[0].tasks)


def test_lifecycle_and_logs_survive_the_apis_json_both_ways() -> None:
    """What the gateway answers for a job (Nomad's api.Job) is a job it takes."""
    from services.gateway.mapping import jobs as job_map

    job = canonicalize(parse_job(HCL % "", "j.hcl"))
    nomad = job_map.job(job)
    init = nomad["TaskGroups"][0]["Tasks"][0]
    assert init["Lifecycle"] == {"Hook": "prestart", "Sidecar": False}
    # Enabled: Nomad's api field deprecated by Disabled, nil as Nomad's servers leave it
    assert init["LogConfig"] == {
        "MaxFiles": 10,
        "MaxFileSizeMB": 10,
        "Disabled": False,
        "Enabled": None,
    }
    main = nomad["TaskGroups"][0]["Tasks"][2]
    assert main["Lifecycle"] is None
    back = jobspec_json.from_nomad(json.loads(json.dumps(nomad)))
    for before, after in zip(job.task_groups[0].tasks, back.task_groups[0].tasks, strict=True):
        assert before.lifecycle == after.lifecycle
        assert before.log_config == after.log_config
