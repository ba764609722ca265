"""HCL stanzas → pb.Job, Nomad's defaults, and malformed files → one
`file:line: field: problem` error."""

import pytest
from google.protobuf.json_format import MessageToDict

from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job

S = 1_000_000_000
M = 60 * S
H = 60 * M

FULL = """
job "web" {
  region      = "global"
  namespace   = "prod"
  type        = "service"
  priority    = 70
  all_at_once = true
  datacenters = ["dc1", "dc2"]
  node_pool   = "large"

  meta {
    team = "infra"
    n    = 3
  }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  affinity {
    attribute = "${node.datacenter}"
    value     = "dc1"
    weight    = -30
  }

  spread {
    attribute = "${meta.rack}"
    weight    = 80
    target "r1" {
      percent = 60
    }
    target "r2" {
      percent = 40
    }
  }

  update {
    max_parallel     = 2
    min_healthy_time = "15s"
    auto_revert      = true
  }

  group "api" {
    count = 4

    constraint {
      distinct_hosts = true
    }
    constraint {
      attribute = "${node.class}"
      operator  = "regexp"
      value     = "^big-"
    }
    constraint {
      distinct_property = "${meta.rack}"
      value             = 2
    }

    restart {
      attempts = 0
      interval = "10m"
      delay    = "5s"
      mode     = "delay"
    }

    reschedule {
      delay          = "10s"
      delay_function = "fibonacci"
      max_delay      = "2m"
      unlimited      = true
    }

    update {
      canary = 1
    }

    migrate {
      max_parallel = 3
    }

    ephemeral_disk {
      size   = 500
      sticky = true
    }

    network {
      mode = "host"
      port "http" {}
      port "admin" {
        static = 9000
      }
    }

    disconnect {
      lost_after = "5m"
      replace    = false
      reconcile  = "keep_original"
    }

    prevent_reschedule_on_lost = true

    task "server" {
      driver       = "docker"
      user         = "nobody"
      leader       = true
      kill_timeout = "20s"
      kill_signal  = "SIGINT"

      config {
        command = "/usr/bin/server"
        args    = ["-port", "${NOMAD_PORT_http}"]
        nested {
          depth = 2
        }
      }

      env {
        PORT = "${NOMAD_PORT_http}"
        MODE = "prod"
      }

      env = { EXTRA = 1 }

      meta = {
        owner = "api"
      }

      resources {
        cpu        = 500
        memory     = 256
        memory_max = 512
        device "nvidia/gpu" {
          count = 2
        }
      }

      restart {
        attempts = 5
      }

      affinity {
        attribute = "${attr.cpu.arch}"
        value     = "amd64"
      }
    }

    task "sidecar" {
      driver = "mock"
      config {
        run_for = "10s"
      }
    }
  }
}
"""


def test_every_stanza():
    # `env` twice (block and argument) is an HCL duplicate; drop the argument form here.
    job = parse_job(FULL.replace("      env = { EXTRA = 1 }\n", ""), "full.hcl")
    assert (job.id, job.name, job.namespace, job.type) == ("web", "web", "prod", "service")
    assert job.priority == 70 and job.all_at_once
    assert list(job.datacenters) == ["dc1", "dc2"] and job.node_pool == "large"
    assert dict(job.meta) == {"team": "infra", "n": "3"}
    assert job.constraints[0].l_target == "${attr.kernel.name}"
    assert (job.constraints[0].operand, job.constraints[0].r_target) == ("=", "linux")
    assert job.affinities[0].weight == -30
    sp = job.spreads[0]
    assert sp.attribute == "${meta.rack}" and sp.weight == 80
    assert [(t.value, t.percent) for t in sp.spread_target] == [("r1", 60), ("r2", 40)]

    tg = job.task_groups[0]
    assert tg.name == "api" and tg.count == 4
    ops = [(c.operand, c.l_target, c.r_target) for c in tg.constraints]
    assert ops == [
        ("distinct_hosts", "", ""),
        ("regexp", "${node.class}", "^big-"),
        ("distinct_property", "${meta.rack}", "2"),
    ]
    # restart: attempts = 0 written explicitly is kept, not defaulted to 2
    assert (tg.restart_policy.attempts, tg.restart_policy.interval) == (0, 10 * M)
    assert (tg.restart_policy.delay, tg.restart_policy.mode) == (5 * S, "delay")
    rp = tg.reschedule_policy
    assert (rp.delay, rp.delay_function, rp.max_delay, rp.unlimited) == (
        10 * S,
        "fibonacci",
        2 * M,
        True,
    )
    # group update merges over the job's update, the rest from Nomad's defaults
    up = tg.update
    assert (up.canary, up.max_parallel, up.min_healthy_time, up.auto_revert) == (1, 2, 15 * S, True)
    assert (up.healthy_deadline, up.progress_deadline, up.health_check) == (5 * M, 10 * M, "checks")
    assert tg.migrate.max_parallel == 3 and tg.migrate.healthy_deadline == 5 * M
    assert tg.ephemeral_disk.size_mb == 500 and tg.ephemeral_disk.sticky
    net = tg.networks[0]
    assert [p.label for p in net.dynamic_ports] == ["http"]
    assert [(p.label, p.value) for p in net.reserved_ports] == [("admin", 9000)]
    assert tg.disconnect.lost_after == 5 * M
    assert tg.disconnect.HasField("replace") and tg.disconnect.replace is False
    assert tg.disconnect.reconcile == "keep_original"
    assert tg.prevent_reschedule_on_lost

    server, sidecar = tg.tasks
    assert (server.driver, server.user, server.leader) == ("docker", "nobody", True)
    assert (server.kill_timeout, server.kill_signal) == (20 * S, "SIGINT")
    config = MessageToDict(server.config)
    assert config["command"] == "/usr/bin/server"
    assert config["args"] == ["-port", "${NOMAD_PORT_http}"]
    assert config["nested"] == [{"depth": 2}]
    assert dict(server.env) == {"PORT": "${NOMAD_PORT_http}", "MODE": "prod"}
    assert dict(server.meta) == {"owner": "api"}
    r = server.resources
    assert (r.cpu, r.memory_mb, r.memory_max_mb) == (500, 256, 512)
    assert (r.devices[0].name, r.devices[0].count) == ("nvidia/gpu", 2)
    # task restart overrides attempts, inherits the group's other fields
    assert server.restart_policy.attempts == 5 and server.restart_policy.mode == "delay"
    assert server.affinities[0].weight == 50  # Nomad's default weight
    # defaults for a bare task
    assert (sidecar.resources.cpu, sidecar.resources.memory_mb) == (100, 300)
    assert sidecar.kill_timeout == 5 * S


MINIMAL = (
    'job "j" {\n  %s\n  group "g" {\n    %s\n    task "t" {\n      driver = "mock"\n    }\n  }\n}\n'
)


def minimal(job_extra: str = "", group_extra: str = "") -> str:
    return MINIMAL % (job_extra, group_extra)


def test_defaults_like_nomad():
    job = parse_job(minimal(), "m.hcl")
    # no node_pool: the server gives the job its namespace's default pool
    assert (job.type, job.priority, job.namespace, job.node_pool) == (
        "service",
        50,
        "default",
        "",
    )
    assert list(job.datacenters) == ["*"]
    tg = job.task_groups[0]
    assert tg.count == 1
    assert (tg.restart_policy.attempts, tg.restart_policy.interval) == (2, 30 * M)
    assert (tg.restart_policy.delay, tg.restart_policy.mode) == (15 * S, "fail")
    rp = tg.reschedule_policy
    assert (rp.delay, rp.delay_function, rp.max_delay, rp.unlimited) == (
        30 * S,
        "exponential",
        H,
        True,
    )
    assert not tg.HasField("update")  # no update block: no rolling limit
    assert tg.ephemeral_disk.size_mb == 300


def test_batch_defaults():
    tg = parse_job(minimal('type = "batch"'), "b.hcl").task_groups[0]
    assert (tg.restart_policy.attempts, tg.restart_policy.interval) == (3, 24 * H)
    rp = tg.reschedule_policy
    assert (rp.attempts, rp.interval, rp.delay, rp.delay_function) == (1, 24 * H, 5 * S, "constant")
    assert not rp.unlimited


def test_seed_era_disconnect_fields():
    tg = parse_job(minimal("", 'stop_after_client_disconnect = "90s"'), "d.hcl").task_groups[0]
    assert tg.stop_after_client_disconnect == 90 * S
    assert tg.disconnect.stop_on_client_after == 90 * S
    assert not tg.HasField("max_client_disconnect")


def test_job_level_reschedule_applies_to_groups():
    job = parse_job(
        minimal(
            'reschedule {\n attempts = 4\n interval = "1h"\n'
            ' unlimited = false\n delay_function = "constant"\n }'
        ),
        "r.hcl",
    )
    rp = job.task_groups[0].reschedule_policy
    assert (rp.attempts, rp.interval, rp.unlimited) == (4, H, False)


def test_periodic_and_parameterized():
    job = parse_job(
        minimal('type = "batch"\n periodic {\n cron = "*/5 * * * *"\n prohibit_overlap = true\n }'),
        "p.hcl",
    )
    assert (
        job.periodic.enabled
        and job.periodic.spec == "*/5 * * * *"
        and job.periodic.prohibit_overlap
    )
    job = parse_job(
        minimal(
            'type = "sysbatch"\n periodic {\n crons = ["0 3 * * *", "30 15 * * 1-5"]\n'
            ' time_zone = "Europe/Paris"\n }'
        ),
        "p.hcl",
    )
    assert list(job.periodic.crons) == ["0 3 * * *", "30 15 * * 1-5"] and not job.periodic.spec
    assert job.periodic.time_zone == "Europe/Paris" and job.periodic.enabled
    job = parse_job(
        minimal(
            'type = "batch"\n parameterized {\n payload = "required"\n meta_required = ["x"]\n }'
        ),
        "p.hcl",
    )
    assert job.parameterized.payload == "required" and list(job.parameterized.meta_required) == [
        "x"
    ]


def test_dispatch_payload_is_parsed_and_must_stay_in_the_local_dir():
    text = minimal('type = "batch"\n parameterized {}').replace(
        'driver = "mock"', 'driver = "mock"\n      dispatch_payload {\n file = "in/data.json"\n }'
    )
    job = parse_job(text, "d.hcl")
    assert job.parameterized.payload == "optional"
    assert job.task_groups[0].tasks[0].dispatch_payload.file == "in/data.json"
    with pytest.raises(JobspecError) as err:
        parse_job(text.replace("in/data.json", "../../etc/x"), "d.hcl")
    assert "dispatch_payload > file: '../../etc/x' escapes the task's local directory" in str(
        err.value
    )


def test_env_as_argument_map():
    text = minimal("", "").replace(
        'driver = "mock"', 'driver = "mock"\n      env = { A = 1, B = true }'
    )
    task = parse_job(text, "e.hcl").task_groups[0].tasks[0]
    assert dict(task.env) == {"A": "1", "B": "true"}


@pytest.mark.parametrize(
    ("text", "line", "field", "problem"),
    [
        (minimal("", "count = -1"), 4, 'job "j" > group "g" > count', "must be >= 0"),
        (minimal("", "cuont = 2"), 4, 'job "j" > group "g" > cuont', "unknown argument"),
        (minimal("priority = 500"), 2, 'job "j" > priority', "between 1 and 100"),
        (minimal('type = "cron"'), 2, 'job "j" > type', "unknown value 'cron'"),
        (
            minimal("", "count = var.n"),
            4,
            'job "j" > group "g" > count',
            'unknown variable var.n: no `variable "n"` block declares it',
        ),
        (minimal("", 'count = "many"'), 4, 'job "j" > group "g" > count', "whole number"),
        (
            minimal("", 'restart {\n delay = "5 minutes"\n }'),
            5,
            "restart > delay",
            "invalid duration",
        ),
        (minimal("", "restart {\n delay = 30\n }"), 5, "restart > delay", "duration string"),
        (minimal("", 'restart {\n mode = "sometimes"\n }'), 5, "restart > mode", "unknown value"),
        (
            minimal("", 'service {\n name = "x"\n }'),
            4,
            'group "g" > service',
            'Consul is not available in Corral: set provider = "nomad"',
        ),
        (minimal("", "spread {\n weight = 10\n }"), 4, "spread > attribute", "is required"),
        (
            minimal("", 'max_client_disconnect = "1m"\n disconnect {\n lost_after = "2m"\n }'),
            5,
            "disconnect",
            "not both",
        ),
        (minimal('datacenters = "dc1"'), 2, 'job "j" > datacenters', "list of strings"),
        (minimal('periodic {\n cron = "* * * * *"\n }'), 2, "periodic", "batch and sysbatch"),
        (
            minimal('type = "batch"\n periodic {\n cron = "61 * * * *"\n }'),
            4,
            "periodic > cron",
            "invalid cron expression '61 * * * *'",
        ),
        (
            minimal('type = "batch"\n periodic {\n crons = ["@daily", "* *"]\n }'),
            4,
            "periodic > crons",
            "invalid cron expression '* *'",
        ),
        (
            minimal('type = "batch"\n periodic {\n cron = "@daily"\n time_zone = "Mars/Base"\n }'),
            5,
            "periodic > time_zone",
            "unknown time zone 'Mars/Base'",
        ),
        (
            minimal('type = "batch"\n periodic {\n cron = "@daily"\n crons = ["@daily"]\n }'),
            5,
            "periodic > crons",
            "not both",
        ),
        (
            minimal("", 'constraint {\n attribute = "${attr.x}"\n operator = "like"\n }'),
            6,
            "constraint > operator",
            "unknown value 'like'",
        ),
        (
            # as the state service refuses it: only distinct_hosts needs no attribute
            minimal("", 'constraint {\n operator = "is_set"\n }'),
            4,
            "constraint",
            "is_set needs an attribute",
        ),
        (minimal("", 'task "t" {\n driver = "mock"\n }'), 7, 'task "t" > name', "defined twice"),
        (
            minimal("", 'network {\n port "p" {\n static = 70000\n }\n }'),
            6,
            'port "p" > static',
            "port number",
        ),
    ],
)
def test_malformed(text, line, field, problem):
    with pytest.raises(JobspecError) as info:
        parse_job(text, "bad.hcl")
    err = info.value
    message = str(err)
    assert "\n" not in message
    assert message.startswith(f"bad.hcl:{line}: "), message
    assert field in err.field, message
    assert problem in err.problem, message


def test_task_without_driver_points_at_the_task():
    text = 'job "j" {\n  group "g" {\n    task "t" {\n      user = "x"\n    }\n  }\n}\n'
    with pytest.raises(JobspecError) as info:
        parse_job(text, "t.hcl")
    assert str(info.value) == (
        't.hcl:3: job "j" > group "g" > task "t" > driver: is required (e.g. driver = "raw_exec")'
    )


def test_raw_exec_needs_a_command():
    text = minimal().replace('driver = "mock"', 'driver = "raw_exec"')
    with pytest.raises(
        JobspecError, match=r"t.hcl:5: .*config > command: the raw_exec driver needs a command"
    ):
        parse_job(text, "t.hcl")


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ('job "j" {\n  group "g" {\n    count = \n  }\n}\n', 3, "syntax error"),
        ('job "j" {\n  group "g" {\n', 3, "end of file"),
        ("", None, "no job found"),
        ('job "a" {\n}\njob "b" {\n}\n', 3, "only one job"),
        ('job {\n  group "g" {}\n}\n', 1, "needs a label"),
        ('job "j" {\n}\n', 1, "at least one group"),
        ('variable "x" {}\njob "j" {}\n', 1, 'variable "x" has no value'),
    ],
)
def test_file_level_errors(text, line, problem):
    with pytest.raises(JobspecError) as info:
        parse_job(text, "f.hcl")
    assert info.value.line == line, str(info.value)
    assert problem in str(info.value)


def test_explicit_zero_count_and_unquoted_labels():
    job = parse_job(
        'job example {\n group "g" {\n count = 0\n task t { driver = "mock" }\n }\n}\n', "z.hcl"
    )
    assert job.id == "example"
    assert job.task_groups[0].count == 0
    assert job.task_groups[0].tasks[0].name == "t"


def test_nomad_arguments_issue_27_found_missing():
    """Each was refused as a typo or an unsupported block; Nomad accepts them."""
    text = """
job "j" {
  task "solo" {
    driver         = "mock"
    shutdown_delay = "5s"
    resources {
      memory     = 64
      memory_max = -1
    }
  }
  group "g" {
    shutdown_delay   = "10s"
    max_run_duration = "1h"
    network {
      mode     = "cni/mynet"
      hostname = "${NOMAD_ALLOC_ID}"
      cni {
        args = { IgnoreUnknown = "true" }
      }
      port "http" {}
    }
    restart {
      render_templates = true
    }
    task "t" {
      driver = "mock"
      config {
        text = <<EOT
hello
EOT%s
      }
    }
  }
}
"""
    job = parse_job(text % "   ", "fix.hcl")  # the closing marker has trailing spaces
    # a task directly under the job is a group of its own, first (Nomad's jobspec2)
    assert [tg.name for tg in job.task_groups] == ["solo", "g"]
    solo = job.task_groups[0].tasks[0]
    assert solo.name == "solo" and solo.shutdown_delay == 5 * S
    assert solo.resources.memory_max_mb == -1
    tg = job.task_groups[1]
    assert tg.shutdown_delay == 10 * S and tg.max_run_duration == H
    net = tg.networks[0]
    assert net.mode == "cni/mynet" and net.hostname == "${NOMAD_ALLOC_ID}"
    assert dict(net.cni.args) == {"IgnoreUnknown": "true"}
    assert tg.restart_policy.render_templates is True
    assert tg.tasks[0].config.fields["text"].string_value == "hello\n"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("resources {\n memory = 64\n memory_max = -2\n }", "must be >= -1"),
        ("resources {\n memory = 64\n memory_max = 32\n }", "must be >= memory"),
        ('shutdown_delay = "-1s"', "must not be negative"),
        ("resources {\n secrets = 10\n }", "the secrets argument is not supported by Corral"),
        ('lifecycle {\n hook = "prestart"\n }', "must have at least one main task"),
    ],
)
def test_task_argument_limits(body, problem):
    text = minimal().replace('driver = "mock"', f'driver = "mock"\n {body}')
    with pytest.raises(JobspecError) as info:
        parse_job(text, "t.hcl")
    assert problem in str(info.value)


def test_network_mode_must_be_known():
    text = minimal("", 'network {\n mode = "cni/"\n }')
    with pytest.raises(JobspecError, match='"cni/<network>"'):
        parse_job(text, "n.hcl")
