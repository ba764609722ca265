"""JSON job files: Nomad's API shape and our proto JSON."""

import json

import pytest

from cli.output import to_dict
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job

NOMAD = {
    "Job": {
        "ID": "api",
        "Type": "batch",
        "Priority": 30,
        "Datacenters": ["dc1"],
        "Region": "global",
        "Vault": None,
        "ConsulToken": "",
        "Constraints": [{"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="}],
        "TaskGroups": [
            {
                "Name": "g",
                "Count": 2,
                "MaxClientDisconnect": 60_000_000_000,
                "RestartPolicy": {
                    "Attempts": 1,
                    "Interval": 600_000_000_000,
                    "Delay": 1_000_000_000,
                    "Mode": "fail",
                },
                "EphemeralDisk": {"SizeMB": 150},
                "Networks": [{"MBits": 10, "DynamicPorts": [{"Label": "http"}]}],
                "Services": None,
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "raw_exec",
                        "Config": {"command": "/bin/true", "args": ["x"]},
                        "Env": {"A": "b"},
                        "Resources": {"CPU": 50, "MemoryMB": 64, "MemoryMaxMB": 128},
                        "KillTimeout": 3_000_000_000,
                        "Templates": [],
                    }
                ],
            }
        ],
    }
}


def test_nomad_api_json():
    job = parse_job(json.dumps(NOMAD), "api.json")
    assert (job.id, job.name, job.type, job.priority) == ("api", "api", "batch", 30)
    assert job.constraints[0].l_target == "${attr.kernel.name}"
    tg = job.task_groups[0]
    assert tg.count == 2 and tg.disconnect.lost_after == 60_000_000_000
    assert tg.restart_policy.attempts == 1 and tg.restart_policy.interval == 600_000_000_000
    assert tg.ephemeral_disk.size_mb == 150
    assert tg.networks[0].mbits == 10 and tg.networks[0].dynamic_ports[0].label == "http"
    t = tg.tasks[0]
    assert (t.resources.cpu, t.resources.memory_mb, t.resources.memory_max_mb) == (50, 64, 128)
    assert t.config["command"] == "/bin/true" and dict(t.env) == {"A": "b"}
    assert t.kill_timeout == 3_000_000_000
    # batch defaults fill what the file left out
    assert tg.reschedule_policy.attempts == 1


def test_nomad_json_unsupported_field_with_a_value():
    data = json.loads(json.dumps(NOMAD))
    data["Job"]["TaskGroups"][0]["Vault"] = {"Policies": ["db"]}
    with pytest.raises(JobspecError) as info:
        parse_job(json.dumps(data), "api.json")
    assert str(info.value) == "api.json: job.task_groups[0].Vault: is not supported by Corral"


def test_nomad_json_wrong_type_names_the_field():
    data = json.loads(json.dumps(NOMAD))
    data["Job"]["TaskGroups"][0]["Count"] = "two"
    with pytest.raises(JobspecError, match=r"job.task_groups\[0\].count: expected a whole number"):
        parse_job(json.dumps(data), "api.json")


def test_validation_applies_to_json():
    data = json.loads(json.dumps(NOMAD))
    data["Job"]["TaskGroups"][0]["Tasks"][0]["Driver"] = ""
    with pytest.raises(JobspecError, match=r"job.task_groups\[0\].tasks\[0\].driver: is required"):
        parse_job(json.dumps(data), "api.json")


def test_proto_json_round_trip():
    """`corral job inspect` output is itself a valid job file."""
    job = parse_job(json.dumps(NOMAD), "api.json")
    again = parse_job(json.dumps({"job": to_dict(job)}), "inspect.json")
    assert again == job
    bare = parse_job(json.dumps(to_dict(job)), "bare.json")
    assert bare == job


def test_invalid_json_has_a_line():
    with pytest.raises(JobspecError) as info:
        parse_job('{\n  "Job": {\n    "ID": "x",,\n  }\n}', "x.json")
    assert info.value.line == 3 and "invalid JSON" in str(info.value)


def test_nomad_json_periodic_specs_become_crons_and_are_checked():
    data = json.loads(json.dumps(NOMAD))
    data["Job"]["Periodic"] = {
        "Enabled": True,
        "Specs": ["@daily", "0 3 * * *"],
        "SpecType": "cron",
        "TimeZone": "Europe/Paris",
        "ProhibitOverlap": True,
    }
    job = parse_job(json.dumps(data), "api.json")
    assert list(job.periodic.crons) == ["@daily", "0 3 * * *"] and job.periodic.prohibit_overlap
    data["Job"]["Periodic"]["Specs"][1] = "0 3 * *"
    with pytest.raises(JobspecError, match=r"job.periodic.crons\[1\]: invalid cron expression"):
        parse_job(json.dumps(data), "api.json")
