"""The exec and raw_exec driver configs as the parser and the agent check
them (corral/domain/driver_config.py), and the exec driver's capability sets."""

from __future__ import annotations

import pytest

from corral.domain import driver_config
from corral.domain.driver_config import CapabilityError, problems, task_capabilities


def test_a_good_exec_config_has_no_problems() -> None:
    config = {
        "command": "/bin/sh",
        "args": ["-c", "echo ${NOMAD_ALLOC_ID}"],
        "pid_mode": "host",
        "ipc_mode": "private",
        "cap_add": ["CAP_NET_RAW"],
        "cap_drop": ["all"],
        "work_dir": "/local",
    }
    assert problems("exec", config) == []
    assert problems("raw_exec", {"command": "x", "args": [], "work_dir": "/tmp"}) == []


@pytest.mark.parametrize(
    ("driver", "config", "key", "problem"),
    [
        ("exec", {}, "command", "the exec driver needs a command"),
        ("exec", {"command": 5}, "command", "must be a string"),
        ("exec", {"command": "x", "args": "-v"}, "args", "must be a list of strings"),
        ("exec", {"command": "x", "pid_mode": "shared"}, "pid_mode", 'must be "private"'),
        ("exec", {"command": "x", "cap_add": ["fly"]}, "cap_add", "unknown capabilities: fly"),
        ("exec", {"command": "x", "work_dir": "local"}, "work_dir", "must be absolute"),
        ("exec", {"command": "x", "image": "busybox"}, "image", "not an option of the exec"),
        ("raw_exec", {"command": "x", "oom_score_adj": 5}, "oom_score_adj", "not supported"),
        ("raw_exec", {"command": "x", "pid_mode": "host"}, "pid_mode", "not an option"),
    ],
)  # fmt: skip
def test_problems_name_the_key(
    driver: str, config: dict[str, object], key: str, problem: str
) -> None:
    found = problems(driver, config)
    assert [k for k, _ in found] == [key], found
    assert problem in found[0][1]


def test_values_resolved_on_the_client_are_not_judged_early() -> None:
    assert problems("exec", {"command": "x", "pid_mode": "${meta.pid_mode}"}) == []


def test_other_drivers_are_not_checked() -> None:
    assert problems("docker", {"image": "x", "anything": [1, 2]}) == []
    assert problems("mock", {"run_for": "1s"}) == []


def test_task_capabilities_follow_nomads_calculation() -> None:
    defaults = driver_config.DEFAULT_CAPABILITIES
    assert task_capabilities(defaults, [], []) == sorted(defaults)
    assert "kill" not in task_capabilities(defaults, [], ["CAP_KILL"])
    assert task_capabilities(defaults, ["chown"], ["all"]) == ["chown"]
    with pytest.raises(CapabilityError, match="does not allow the following capabilities: net_raw"):
        task_capabilities(defaults, ["net_raw"], [])
    assert "net_raw" in task_capabilities([*defaults, "net_raw"], ["NET_RAW"], [])
    assert driver_config.ROOT_CAPABILITIES[-1] == "audit_read"
