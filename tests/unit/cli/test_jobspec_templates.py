"""`template` blocks: HCL and Nomad's JSON → pb.Template with Nomad's
defaults, Nomad's checks (and the text parsed) at submission, the state's
own check, and env templates' KEY=VALUE lines as go-envparse reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.domain.errors import InvalidArgument
from corral.domain.jobspec import json as jobspec_json
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job
from corral.domain.template import block
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.jobs import job as nomad_job
from services.state.writes.jobs import canonicalize, validate_job

S = 1_000_000_000

JOB = """
job "web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
%s
    }
  }
}
"""

FULL = """
      template {
        data        = <<EOT
DB_PASSWORD={{ with nomadVar "nomad/jobs/web" }}{{ .password }}{{ end }}
EOT
        destination = "secrets/db.env"
        env         = true
      }
      template {
        data            = "[[ env \\"NOMAD_ALLOC_ID\\" ]]"
        destination     = "local/a.conf"
        change_mode     = "signal"
        change_signal   = "sigusr1"
        splay           = "0s"
        perms           = "0600"
        uid             = 1000
        gid             = -1
        left_delimiter  = "[["
        right_delimiter = "]]"
        error_on_missing_key = true
        wait {
          min = "1s"
          max = "3s"
        }
      }
      template {
        source      = "local/in.tpl"
        destination = "../alloc/shared.conf"
        change_mode = "script"
        once        = true
        change_script {
          command       = "/bin/reload"
          args          = ["-v"]
          fail_on_error = true
          run_on_first_render = true
        }
      }
"""


def templates(blocks: str) -> list[pb.Template]:
    return list(parse_job(JOB % blocks, "web.nomad.hcl").task_groups[0].tasks[0].templates)


def refused(blocks: str) -> JobspecError:
    with pytest.raises(JobspecError) as err:
        parse_job(JOB % blocks, "web.nomad.hcl")
    return err.value


def test_every_argument_and_nomads_defaults() -> None:
    env, signal, script = templates(FULL)
    assert env.dest_path == "secrets/db.env" and env.envvars
    assert env.embedded_tmpl.startswith("DB_PASSWORD={{ with nomadVar")
    # api.Template.Canonicalize
    assert env.change_mode == "restart" and env.change_signal == ""
    assert env.splay == 5 * S and env.perms == "0644"
    assert (env.left_delim, env.right_delim) == ("{{", "}}")
    assert not env.HasField("uid") and not env.HasField("wait")

    assert signal.change_mode == "signal" and signal.change_signal == "SIGUSR1"
    assert signal.splay == 0  # written as 0s: not the default
    assert signal.perms == "0600" and signal.uid == 1000 and signal.gid == -1
    assert (signal.left_delim, signal.right_delim) == ("[[", "]]")
    assert signal.err_missing_key
    assert (signal.wait.min, signal.wait.max) == (1 * S, 3 * S)

    assert script.source_path == "local/in.tpl" and script.dest_path == "../alloc/shared.conf"
    assert script.once
    cs = script.change_script
    assert (cs.command, list(cs.args), cs.timeout) == ("/bin/reload", ["-v"], 5 * S)
    assert cs.fail_on_error and cs.run_on_first_render


def test_a_signal_template_without_a_signal_gets_sighup() -> None:
    (t,) = templates('template {\n data = "x"\n destination = "a"\n change_mode = "signal"\n}')
    assert t.change_signal == "SIGHUP"


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ('destination = "a"', "template", "Must specify a source path or have an embedded"),
        ('data = "x"', "template", "Must specify a destination for the template"),
        ('data = "x"\nsource = "y"\ndestination = "a"', "source", "cannot specify both"),
        ('data = "x"\ndestination = "../../../etc/x"', "destination", "escapes allocation"),
        ('data = "x"\ndestination = "a"\nchange_mode = "reload"', "change_mode", "unknown"),
        ('data = "x"\ndestination = "a"\nchange_signal = "SIGNOPE"', "change_signal", "parse"),
        (
            'data = "x"\ndestination = "a"\nchange_mode = "signal"\nenv = true',
            "env",
            "cannot use signals with env var templates",
        ),
        (
            'data = "x"\ndestination = "a"\nchange_mode = "script"',
            "template",
            "must specify change script configuration",
        ),
        (
            'data = "x"\ndestination = "a"\nchange_mode = "script"\nchange_script {\n'
            "fail_on_error = true\n}",
            "command",
            "must specify script path value",
        ),
        ('data = "x"\ndestination = "a"\nperms = "0999"', "perms", "as octal"),
        ('data = "x"\ndestination = "a"\nperms = "17777"', "perms", "out of range"),
        ('data = "x"\ndestination = "a"\nuid = -2', "uid", "must be >= -1"),
        (
            'data = "x"\ndestination = "a"\nwait {\nmin = "5s"\nmax = "1s"\n}',
            "wait",
            "wait min 5s is greater than max 1s",
        ),
        ('data = "x"\ndestination = "a"\nvault_grace = "1s"', "vault_grace", "no Vault"),
        ('data = "{{ if }}"\ndestination = "a"', "data", "template: :1: missing value for if"),
        (
            'data = "{{ key \\"a/b\\" }}"\ndestination = "a"',
            "data",
            'function "key" is not supported by Corral: it reads Consul',
        ),
        ('data = "x"\ndestination = "a"\nsource_path = "b"', "source_path", "unknown argument"),
    ],
)
def test_what_nomad_refuses_is_refused_with_its_words(body: str, field: str, problem: str) -> None:
    err = refused(f"template {{\n{body}\n}}")
    assert problem in err.problem
    assert err.field.endswith(field), err.field
    assert err.line is not None


def test_two_templates_may_not_render_the_same_file() -> None:
    err = refused(
        'template {\n data = "x"\n destination = "local/a"\n}\n'
        'template {\n data = "y"\n destination = "./local/a"\n}'
    )
    assert "already renders to" in err.problem


def test_a_source_outside_the_task_is_left_to_the_client_as_in_nomad() -> None:
    # Nomad's e2e bad_template_paths job is accepted and fails on the client
    (t,) = templates('template {\n source = "/etc/passwd"\n destination = "a"\n}')
    assert t.source_path == "/etc/passwd"


def test_absolute_and_alloc_destinations_stay_inside() -> None:
    assert not block.escapes_alloc_dir("/etc/passwd")  # under the task dir on the client
    assert not block.escapes_alloc_dir("../alloc/x")
    assert not block.escapes_alloc_dir("${NOMAD_SECRETS_DIR}/x")
    assert block.escapes_alloc_dir("../../x")
    assert block.escapes_alloc_dir("local/../../../x")


def nomad_template(**fields: Any) -> dict[str, Any]:
    """One template in Nomad's JSON through our reader, and back out as
    the gateway shows it."""
    task = {
        "Name": "t",
        "Driver": "raw_exec",
        "Config": {"command": "/bin/true"},
        "Templates": [{"DestPath": "local/a", "EmbeddedTmpl": "x", **fields}],
    }
    job = jobspec_json.from_nomad({"ID": "web", "TaskGroups": [{"Name": "g", "Tasks": [task]}]})
    shown = json.loads(json.dumps(nomad_job(job)))
    out: dict[str, Any] = shown["TaskGroups"][0]["Tasks"][0]["Templates"][0]
    return out


def test_nomad_json_defaults_and_a_written_zero_splay() -> None:
    t = nomad_template()
    assert t["Splay"] == 5 * S and t["ChangeMode"] == "restart" and t["Perms"] == "0644"
    assert t["Uid"] is None and t["Wait"] is None
    assert nomad_template(Splay=0)["Splay"] == 0
    assert nomad_template(Uid=None, VaultGrace=0)["Uid"] is None
    script = nomad_template(ChangeMode="script", ChangeScript={"Command": "/bin/x"})
    assert script["ChangeScript"]["Timeout"] == 5 * S
    with pytest.raises(JobspecError, match="VaultGrace"):
        nomad_template(VaultGrace=S)


def test_a_job_round_trips_through_nomads_json() -> None:
    job = parse_job(JOB % FULL, "web.nomad.hcl")
    back = jobspec_json.from_nomad(json.loads(json.dumps(nomad_job(job))))
    assert back.task_groups[0].tasks[0].templates == job.task_groups[0].tasks[0].templates


def test_the_state_checks_templates_too() -> None:
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
                            templates=[pb.Template(dest_path="a", embedded_tmpl="x", splay=0)],
                        )
                    ],
                )
            ],
        )
    )
    t = job.task_groups[0].tasks[0].templates[0]
    assert t.change_mode == "restart" and t.perms == "0644"
    assert t.splay == 0  # the state cannot tell a written zero: kept
    validate_job(job)
    t.dest_path = "../../x"
    with pytest.raises(InvalidArgument, match="escapes allocation directory"):
        validate_job(job)


# --------------------------------------------------------------------------- env templates


def test_env_lines_as_go_envparse_reads_them() -> None:
    text = (
        "# a comment\n"
        "\n"
        "A=1\n"
        "export B = two words  # trailing comment\n"
        'C="quoted # not a comment\\n\\t\\"x\\""\n'
        "D='single $x \\n'\n"
        "E=\n"
        "F=a=b\n"
    )
    assert block.parse_env(text) == {
        "A": "1",
        "B": "two words",
        "C": 'quoted # not a comment\n\t"x"',
        "D": "single $x \\n",
        "E": "",
        "F": "a=b",
    }


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("NOEQUALS", 'error on line 1: missing "="'),
        ("=x", "empty key"),
        ("1A=x", "key must start with [A-Za-z_]"),
        ('A="open', 'unmatched "'),
        ("A='open", "unmatched '"),
        ('A="\\q"', "invalid escape sequence: q"),
        ("OK=1\nA=\x01", "error on line 2: 0x01 is an invalid value character"),
    ],
)
def test_bad_env_lines(text: str, problem: str) -> None:
    with pytest.raises(block.EnvParseError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        block.parse_env(text)
