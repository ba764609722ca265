"""Exit codes and error lines of the `corral` command."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[3]
BAD = (
    'job "x" {\n  group "g" {\n    count = -1\n'
    '    task "t" {\n      driver = "mock"\n    }\n  }\n}\n'
)


def closed_port_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def bad_file(tmp_path):
    p = tmp_path / "bad.nomad.hcl"
    p.write_text(BAD)
    return p


def test_usage_errors_exit_1(capsys):
    assert main(["job", "run"]) == 1
    assert "Error: the following arguments are required: file" in capsys.readouterr().err
    assert main(["job", "status", "-bogus"]) == 1
    assert main(["nope"]) == 1
    assert main([]) == 1


def test_help_exits_0(capsys):
    assert main(["-h"]) == 0
    assert main(["job", "run", "-h"]) == 0
    assert "-check-index" in capsys.readouterr().out


def test_malformed_jobspec_one_line_exit_1(bad_file, capsys):
    # no server is contacted: the address points nowhere
    assert main(["job", "run", "-address", closed_port_address(), str(bad_file)]) == 1
    err = capsys.readouterr().err
    assert err == f'Error: {bad_file}:3: job "x" > group "g" > count: must be >= 0, got -1\n'


def test_plan_errors_exit_255(bad_file, capsys):
    assert main(["job", "plan", "-address", closed_port_address(), str(bad_file)]) == 255
    assert (
        main(["job", "plan", "-address", closed_port_address(), "examples/hello.nomad.hcl"]) == 255
    )
    assert "cannot reach Corral" in capsys.readouterr().err


def test_unreachable_server_is_one_actionable_line(capsys, monkeypatch):
    address = closed_port_address()
    monkeypatch.setenv("CORRAL_ADDR", address)
    assert main(["job", "status"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"Error: cannot reach Corral at {address} (connection refused)")
    assert "CORRAL_ADDR" in err


def test_address_accepts_http_scheme(capsys):
    address = closed_port_address()
    assert main(["node", "status", "-address", f"http://{address}"]) == 1
    assert f"cannot reach Corral at {address}" in capsys.readouterr().err


def test_validate_offline(capsys):
    assert main(["job", "validate", str(ROOT / "examples/hello.nomad.hcl")]) == 0
    assert capsys.readouterr().out == "Job validation successful\n"


def test_keyboard_interrupt_exits_130(monkeypatch):
    import cli.commands.job as job_cmd

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(job_cmd, "read_job_file", interrupted)
    assert main(["job", "validate", "x.hcl"]) == 130


def test_unexpected_errors_never_show_a_traceback(monkeypatch, capsys):
    import cli.commands.job as job_cmd

    def broken(*_args):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(job_cmd, "read_job_file", broken)
    monkeypatch.delenv("CORRAL_CLI_DEBUG", raising=False)
    assert main(["job", "validate", "x.hcl"]) == 1
    err = capsys.readouterr().err
    assert err == "Error: unexpected RuntimeError: disk on fire\n"


def test_as_a_subprocess_no_traceback(bad_file):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "job",
            "run",
            "-address",
            closed_port_address(),
            str(bad_file),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "count: must be >= 0" in proc.stderr


def test_event_topic_parsing():
    from cli.commands.event import parse_topic
    from cli.context import CliError

    assert (parse_topic("Job:hello").topic, parse_topic("Job:hello").key) == ("Job", "hello")
    assert parse_topic("Eval").topic == "Evaluation"
    assert parse_topic("Allocation:*").key == ""
    with pytest.raises(CliError, match="unknown topic"):
        parse_topic("Jobs")


def test_action_checks_its_flags_before_calling(capsys):
    address = closed_port_address()
    assert main(["action", "-address", address, "greet"]) == 1
    assert "a job ID is required" in capsys.readouterr().err
    assert main(["job", "action", "-address", address, "-job", "web"]) == 1
    assert "an action name is required" in capsys.readouterr().err
    assert main(["action", "-address", address, "-job", "web", "-i=false", "-t", "greet"]) == 1
    assert "-i must be enabled if running with tty" in capsys.readouterr().err
    assert main(["action", "-address", address, "-job", "web", "-e", "ab", "greet"]) == 1
    assert "-e requires 'none' or a single character" in capsys.readouterr().err
