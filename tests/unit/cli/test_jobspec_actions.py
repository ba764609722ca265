"""Task `action` blocks (Nomad 1.7): HCL and Nomad's JSON → pb.Action,
Nomad's rules (a valid name, a command, no name twice in a task) at
submission and again in the state, Nomad's JSON out (`Actions`, and
`/v1/job/:id/actions`' flattened list) and the job diff `job plan` shows."""

from __future__ import annotations

import json

import pytest

from corral.domain import task_exec
from corral.domain.errors import InvalidArgument
from corral.domain.jobspec import json as jobspec_json
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.jobs import actions as nomad_actions
from services.gateway.mapping.jobs import job as nomad_job
from services.state.writes.job_diff import job_diff
from services.state.writes.jobs import canonicalize, validate_job
from services.worker.scheduler.util import tasks_updated

JOB = """
job "web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["60"]
      }
%s
    }
  }
}
"""

TWO = """
      action "echo-time" {
        command = "/bin/sh"
        args    = ["-c", "date"]
      }
      action "whoami" {
        command = "id"
      }
"""


def _task(job: pb.Job) -> pb.Task:
    return job.task_groups[0].tasks[0]


def test_action_blocks_are_kept_in_the_task_in_order() -> None:
    job = parse_job(JOB % TWO, "web.nomad.hcl")
    assert list(_task(job).actions) == [
        pb.Action(name="echo-time", command="/bin/sh", args=["-c", "date"]),
        pb.Action(name="whoami", command="id"),
    ]


@pytest.mark.parametrize(
    ("block", "line", "problem"),
    [
        ('      action "a" {\n        args = ["x"]\n      }\n', 10, "command cannot be empty"),
        (
            '      action "a" {\n        command = "x"\n      }\n'
            '      action "a" {\n        command = "y"\n      }\n',
            13,
            "action 'a' is defined more than once",
        ),
        ('      action "two words" {\n        command = "x"\n      }\n', 10, "invalid action name"),
        (f'      action "{"n" * 129}" {{\n        command = "x"\n      }}\n', 10, "1 to 128"),
        ('      action {\n        command = "x"\n      }\n', 10, "needs a label"),
        ('      action "a" {\n        command = "x"\n        user = "root"\n      }\n', 12, "user"),
        ('      action "a" {\n        command = "x"\n        args = "-c"\n      }\n', 12, "list"),
    ],
)
def test_a_wrong_action_is_refused_at_its_line(block: str, line: int, problem: str) -> None:
    with pytest.raises(JobspecError) as info:
        parse_job(JOB % block, "web.nomad.hcl")
    assert info.value.line == line, str(info.value)
    assert problem in str(info.value)


def test_an_action_too_long_to_run_is_refused_at_submission() -> None:
    args = ", ".join(['"x"'] * (task_exec.MAX_COMMAND_ARGS + 1))
    block = f'      action "a" {{\n        command = "x"\n        args = [{args}]\n      }}\n'
    with pytest.raises(JobspecError, match="arguments, more than"):
        parse_job(JOB % block, "web.nomad.hcl")


def test_actions_round_trip_through_nomads_json() -> None:
    job = parse_job(JOB % TWO, "web.nomad.hcl")
    out = nomad_job(job)["TaskGroups"][0]["Tasks"][0]["Actions"]
    assert out == [
        {"Name": "echo-time", "Command": "/bin/sh", "Args": ["-c", "date"]},
        {"Name": "whoami", "Command": "id", "Args": None},
    ]
    back = jobspec_json.from_nomad(json.loads(json.dumps(nomad_job(job))))
    assert _task(back).actions == _task(job).actions


def test_a_json_action_without_a_command_names_nomads_field() -> None:
    data = nomad_job(parse_job(JOB % TWO, "web.nomad.hcl"))
    data["TaskGroups"][0]["Tasks"][0]["Actions"][1]["Command"] = ""
    with pytest.raises(JobspecError) as info:
        jobspec_json.from_nomad(data)
    assert "TaskGroups[0].Tasks[0].Actions[1].Command" in str(info.value)
    assert "command cannot be empty" in str(info.value)


def test_the_job_actions_list_is_nomads_flattened_job_actions() -> None:
    job = parse_job(JOB % TWO, "web.nomad.hcl")
    assert nomad_actions(job) == [
        {
            "Name": "echo-time",
            "Command": "/bin/sh",
            "Args": ["-c", "date"],
            "TaskName": "t",
            "TaskGroupName": "g",
        },
        {"Name": "whoami", "Command": "id", "Args": None, "TaskName": "t", "TaskGroupName": "g"},
    ]
    assert nomad_actions(parse_job(JOB % "", "web.nomad.hcl")) == []


def test_the_state_checks_actions_too() -> None:
    job = canonicalize(
        pb.Job(
            id="web",
            task_groups=[
                pb.TaskGroup(
                    name="g",
                    count=1,
                    tasks=[
                        pb.Task(
                            name="t",
                            driver="raw_exec",
                            actions=[pb.Action(name="a", command="date")],
                        )
                    ],
                )
            ],
        )
    )
    validate_job(job)
    job.task_groups[0].tasks[0].actions.add(name="a", command="id")
    with pytest.raises(InvalidArgument, match="defined more than once"):
        validate_job(job)
    del job.task_groups[0].tasks[0].actions[1]
    job.task_groups[0].tasks[0].actions[0].args.append("bad\x00")
    with pytest.raises(InvalidArgument):
        validate_job(job)


def test_the_plan_diff_shows_an_action_as_nomad_does() -> None:
    old = parse_job(JOB % TWO, "web.nomad.hcl")
    new = parse_job(JOB % TWO.replace('"date"', '"uptime"'), "web.nomad.hcl")
    task = job_diff(old, new).task_groups[0].objects[-1]
    assert task.type == "Edited"
    (action,) = [o for o in task.objects if o.name == "Action"]  # the unchanged one left out
    assert action.type == "Edited"
    assert [(f.name, f.type) for f in action.fields] == [("Command", "None"), ("Name", "None")]
    (args,) = action.objects
    assert args.name == "Args" and args.type == "Edited"
    assert {(f.type, f.old, f.new) for f in args.fields} == {
        ("None", "-c", "-c"),
        ("Deleted", "date", ""),
        ("Added", "", "uptime"),
    }
    added = job_diff(parse_job(JOB % "", "web.nomad.hcl"), old).task_groups[0].objects[-1]
    assert [(o.name, o.type) for o in added.objects if o.name == "Action"] == [
        ("Action", "Added"),
        ("Action", "Added"),
    ]
    assert job_diff(old, old).type == "None"


def test_changing_actions_updates_allocs_in_place() -> None:
    """As Nomad's tasksUpdated: actions are not among what makes an update
    destructive (the agent reads them from the alloc's current version)."""
    old = parse_job(JOB % TWO, "web.nomad.hcl")
    new = parse_job(JOB % TWO.replace('"date"', '"uptime"'), "web.nomad.hcl")
    assert tasks_updated(new, old, "g") == ""
    assert tasks_updated(parse_job(JOB % "", "web.nomad.hcl"), old, "g") == ""
