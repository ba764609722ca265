"""Input variables, locals and dynamic blocks in whole job files, and where
variable values come from (-var, var files, NOMAD_VAR_*, the API's
Variables), after the jobspec documentation's examples and the behaviour of
Nomad's jobspec2 test fixtures."""

from pathlib import Path

import pytest

from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.hcl import parse_file
from corral.domain.jobspec.language.variables import VarInputs
from corral.domain.jobspec.load import load_job, parse_job, var_inputs

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

HEAD = """
variable "image" {
  type    = string
  default = "redis:7"
}

variable "ports" {
  type = list(object({
    name = string
    to   = optional(number, 0)
  }))
  default = [{ name = "db", to = 6379 }, { name = "metrics" }]
}

variable "datacenters" {
  type    = list(string)
  default = ["dc1"]
}

variables {
  region_name = "global"
}

locals {
  # locals may refer to each other in any order
  full_name = "${local.prefix}-cache"
  prefix    = upper(var.region_name)
}
"""

JOB = (
    HEAD
    + """
job "cache" {
  datacenters = var.datacenters
  meta = {
    name  = local.full_name
    image = var.image
    when  = formatdate("YYYY", "2024-05-01T00:00:00Z")
  }

  group "cache" {
    network {
      dynamic "port" {
        for_each = var.ports
        iterator = p
        labels   = [p.value.name]
        content {
          to = p.value.to
        }
      }
    }

    task "redis" {
      driver = "mock"
      config {
        image = var.image
        args  = [for p in var.ports : "--port=${p.name}:${p.to}"]
      }
      env {
        ALLOC = "${NOMAD_ALLOC_ID}"
        RACK  = "${meta.rack}"
      }
    }
  }
}
"""
)


def test_variables_locals_functions_and_dynamic_blocks():
    job = parse_job(JOB, "cache.nomad.hcl")
    assert list(job.datacenters) == ["dc1"]
    assert dict(job.meta) == {"name": "GLOBAL-cache", "image": "redis:7", "when": "2024"}
    tg = job.task_groups[0]
    ports = {p.label: p.to for p in tg.networks[0].dynamic_ports}
    assert ports == {"db": 6379, "metrics": 0}
    task = tg.tasks[0]
    assert task.config.fields["image"].string_value == "redis:7"
    assert [v.string_value for v in task.config.fields["args"].list_value.values] == [
        "--port=db:6379",
        "--port=metrics:0",
    ]
    # runtime interpolations reach the client unchanged
    assert dict(task.env) == {"ALLOC": "${NOMAD_ALLOC_ID}", "RACK": "${meta.rack}"}


def test_values_from_env_files_and_flags_in_rising_precedence(tmp_path):
    hcl_file = tmp_path / "a.vars.hcl"
    hcl_file.write_text('image = "from-file"\ndatacenters = ["f1", "f2"]\n')
    json_file = tmp_path / "b.vars.json"
    json_file.write_text('{"image": "from-json"}')
    env = {"NOMAD_VAR_image": "from-env", "NOMAD_VAR_region_name": "eu", "OTHER": "x"}

    inputs = var_inputs([], [str(hcl_file)], env)
    job = parse_job(JOB, "j.hcl", inputs)
    assert job.meta["image"] == "from-file" and job.meta["name"] == "EU-cache"
    assert list(job.datacenters) == ["f1", "f2"]

    inputs = var_inputs(["image=from-flag"], [str(hcl_file), str(json_file)], env)
    assert parse_job(JOB, "j.hcl", inputs).meta["image"] == "from-flag"
    inputs = var_inputs([], [str(hcl_file), str(json_file)], env)
    assert parse_job(JOB, "j.hcl", inputs).meta["image"] == "from-json"

    # structured types parse the flag as an HCL expression
    inputs = var_inputs(['datacenters=["x", "y"]', 'ports=[{name = "a", to = 1}]'], [], {})
    job = parse_job(JOB, "j.hcl", inputs)
    assert list(job.datacenters) == ["x", "y"]
    assert [p.label for p in job.task_groups[0].networks[0].dynamic_ports] == ["a"]


def test_undeclared_values_are_errors_when_strict():
    with pytest.raises(JobspecError, match="declares no such variable"):
        parse_job(JOB, "j.hcl", var_inputs(["nope=1"], [], {}))
    parsed = parse_file(JOB, "j.hcl", VarInputs(args=["nope=1"], strict=False))
    assert parsed.decoded.warnings and "nope" in parsed.decoded.warnings[0]
    # an undeclared NOMAD_VAR_ is not ours to judge: ignored
    parse_job(JOB, "j.hcl", var_inputs([], [], {"NOMAD_VAR_nope": "1"}))


def test_api_variables_content():
    inputs = VarInputs(content='image = "from-api"\n', strict=False)
    parsed = parse_file(JOB, "job.nomad.hcl", inputs, allow_fs=False)
    assert parsed.job.meta["image"] == "from-api"
    assert parsed.decoded.variables["image"] == "from-api"


@pytest.mark.parametrize(
    ("inputs", "problem"),
    [
        (VarInputs(args=["datacenters=nope"]), "unknown variable 'nope'"),
        (VarInputs(args=["ports=[{to = 1}]"]), "attribute 'name' is required"),
        (
            VarInputs(args=['datacenters=["a"'], strict=True),
            "cannot read the value of var.datacenters",
        ),
        (VarInputs(content='variable "x" {}\n'), "cannot declare variable 'x'"),
        (VarInputs(content="image = [1]\n"), "string required, got tuple"),
        (VarInputs(content="{nope"), "invalid JSON"),
    ],
)
def test_bad_values(inputs, problem):
    with pytest.raises(JobspecError) as info:
        parse_job(JOB, "j.hcl", inputs)
    assert problem in str(info.value)


VALIDATED = """
variable "env" {
  type = string
  validation {
    condition     = contains(["dev", "prod"], var.env)
    error_message = "The env must be dev or prod."
  }
}
job "j" {
  meta = { env = var.env }
  group "g" {
    task "t" {
      driver = "mock"
    }
  }
}
"""


def test_validation_rules():
    assert parse_job(VALIDATED, "v.hcl", VarInputs(args=["env=dev"])).meta["env"] == "dev"
    with pytest.raises(JobspecError) as info:
        parse_job(VALIDATED, "v.hcl", VarInputs(args=["env=qa"]))
    assert str(info.value) == (
        "v.hcl:5: invalid value for var.env (from -var): The env must be dev or prod."
    )
    with pytest.raises(JobspecError, match='v.hcl:2: variable "env" has no value'):
        parse_job(VALIDATED, "v.hcl")


@pytest.mark.parametrize(
    ("head", "line", "problem"),
    [
        (
            'variable "x" {\n  default = 1\n  sensitive = true\n}\n',
            3,
            "sensitive: unknown argument",
        ),
        ('variable "x" {\n  type = strin\n}\n', 2, "'strin' is not a type"),
        (
            'variable "x" {\n  type = number\n  default = "a"\n}\n',
            3,
            "not compatible with the type",
        ),
        (
            'variable "x" {\n  default = 1\n  validation {\n    condition = var.y > 0\n'
            '    error_message = "m"\n  }\n}\n',
            4,
            "can refer only to the variable itself",
        ),
        ('variable "x" {\n  default = NOMAD_ALLOC_ID\n}\n', 2, "variables are not allowed here"),
        (
            'variable "x" {\n  default = 1\n}\nvariable "x" {\n  default = 2\n}\n',
            4,
            "declared twice",
        ),
        ("locals {\n  a = local.b\n  b = local.a\n}\n", 2, "a cycle"),
        ("locals {\n  a = local.nope\n}\n", 2, "unknown local value local.nope"),
        ("locals {\n  a = 1\n}\nlocals {\n  a = 2\n}\n", 5, "set twice"),
        ('group "g" {\n}\n', 1, "unexpected block at the top level"),
    ],
)
def test_declaration_errors(head, line, problem):
    text = head + 'job "j" {\n  group "g" {\n    task "t" {\n      driver = "mock"\n    }\n  }\n}\n'
    with pytest.raises(JobspecError) as info:
        parse_job(text, "d.hcl")
    assert info.value.line == line, str(info.value)
    assert problem in str(info.value)


def test_errors_inside_the_job_name_the_field_and_line():
    text = 'job "j" {\n  group "g" {\n    count = upper(1, 2)\n  }\n}\n'
    with pytest.raises(JobspecError) as info:
        parse_job(text, "e.hcl")
    assert (
        str(info.value)
        == 'e.hcl:3: job "j" > group "g" > count: upper(): wrong number of arguments'
    )
    text = 'job "j" {\n  meta = { a = nosuch("x") }\n  group "g" {}\n}\n'
    with pytest.raises(JobspecError, match=r'e.hcl:2: job "j" > meta: unknown function nosuch\(\)'):
        parse_job(text, "e.hcl")


def test_file_function_reads_relative_to_the_job_file(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.txt").write_text("hello file\n")
    job_file = tmp_path / "job.nomad.hcl"
    job_file.write_text(
        'job "f" {\n  meta = {\n    conf = trimspace(file("conf/app.txt"))\n'
        '    files = join(",", fileset("conf", "*.txt"))\n'
        '    here = fileexists("job.nomad.hcl")\n  }\n'
        '  group "g" {\n    task "t" {\n      driver = "mock"\n    }\n  }\n}\n'
    )
    job = load_job(str(job_file))
    assert dict(job.meta) == {"conf": "hello file", "files": "app.txt", "here": "true"}
    # the HTTP API parses without file access, as Nomad's
    with pytest.raises(JobspecError, match="filesystem functions are disabled"):
        parse_file(job_file.read_text(), "job.nomad.hcl", allow_fs=False)


def test_dynamic_blocks_nest_and_need_their_parts():
    text = """
job "d" {
  group "g" {
    dynamic "task" {
      for_each = ["a", "b"]
      labels   = ["t-${task.value}"]
      content {
        driver = "mock"
        dynamic "constraint" {
          for_each = { kernel = "linux" }
          content {
            attribute = "${attr.kernel.name}"
            value     = "${constraint.value}-${task.key}"
          }
        }
      }
    }
  }
}
"""
    tasks = parse_job(text, "d.hcl").task_groups[0].tasks
    assert [t.name for t in tasks] == ["t-a", "t-b"]
    assert [(c.l_target, c.r_target) for c in tasks[1].constraints] == [
        ("${attr.kernel.name}", "linux-1")
    ]
    bad = 'job "d" {\n  group "g" {\n    dynamic "task" {\n      for_each = [1]\n    }\n  }\n}\n'
    with pytest.raises(JobspecError, match='d.hcl:3: .*dynamic "task": needs exactly one content'):
        parse_job(bad, "d.hcl")


def test_the_variables_example():
    job = load_job(str(EXAMPLES / "variables.nomad.hcl"), var_inputs([], [], {}))
    assert job.id == "greeter" and job.task_groups[0].count == 1
    assert dict(job.meta) == {"team": "platform", "env": "dev", "greetings": "2"}
    script = job.task_groups[0].tasks[0].config.fields["args"].list_value.values[1].string_value
    assert script.startswith('while true; do\n  echo "Hello, Bonjour from greeter-dev (')
    assert "${NOMAD_ALLOC_ID}" in script
    with pytest.raises(JobspecError, match="The env must be dev, staging or prod"):
        load_job(str(EXAMPLES / "variables.nomad.hcl"), var_inputs(["env=qa"], [], {}))
