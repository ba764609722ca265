"""`service` and `check` blocks (provider "nomad") from HCL and Nomad's JSON,
Nomad's defaults for them, and the refusals: a Consul service (no provider
is Nomad's default, Consul) and every Consul-only field name Consul as the
reason; what Corral cannot do (driver and alloc address modes) says why."""

from __future__ import annotations

import json

import pytest

from corral.domain import services
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job
from corral.v1 import structs_pb2 as pb

S = 1_000_000_000

JOB = """
job "shop" {
  group "front" {
    network {
      port "http" {}
      port "admin" { static = 9000 }
    }
    service {
      name     = "${JOB}-front"
      port     = "http"
      provider = "nomad"
      tags     = ["web", "v1"]
      canary_tags = ["canary"]
      meta { version = "1" }
      canary_meta { version = "2" }
      task     = "server"
      check_restart {
        limit = 3
        grace = "30s"
      }
      check {
        name     = "alive"
        type     = "http"
        path     = "/health?full=1"
        method   = "POST"
        body     = "{}"
        protocol = "https"
        tls_skip_verify = true
        interval = "5s"
        timeout  = "2s"
        initial_status = "passing"
        header {
          X-Probe = ["corral", "yes"]
        }
        check_restart { limit = 5 }
      }
      check {
        type     = "tcp"
        port     = "admin"
        interval = "10s"
        timeout  = "1s"
        initial_status = "critical"
      }
    }
    task "server" {
      driver = "raw_exec"
      config {
        command = "python3"
      }
      service {
        port     = "admin"
        provider = "nomad"
        address  = "10.1.2.3"
      }
    }
  }
}
"""


def parse(text: str) -> pb.Job:
    return parse_job(text, "shop.hcl")


def test_group_and_task_services_with_nomad_defaults() -> None:
    tg = parse(JOB).task_groups[0]
    (front,) = tg.services
    assert front.name == "shop-front" and front.provider == "nomad"
    assert (front.port_label, front.task_name, front.address_mode) == ("http", "server", "auto")
    assert list(front.tags) == ["web", "v1"] and list(front.canary_tags) == ["canary"]
    assert dict(front.meta) == {"version": "1"} and dict(front.canary_meta) == {"version": "2"}
    alive, admin = front.checks
    assert (alive.name, alive.type, alive.method) == ("alive", "http", "POST")
    assert alive.path == "/health?full=1"
    assert (alive.body, alive.protocol, alive.tls_skip_verify) == ("{}", "https", True)
    assert (alive.interval, alive.timeout, alive.initial_status) == (5 * S, 2 * S, "passing")
    assert list(alive.header["X-Probe"].values) == ["corral", "yes"]
    # the service's check_restart applies to each check; a check's own overrides what it sets
    assert (alive.check_restart.limit, alive.check_restart.grace) == (5, 30 * S)
    assert (admin.check_restart.limit, admin.check_restart.grace) == (3, 30 * S)
    assert admin.name == 'service: "shop-front" check' and admin.initial_status == "critical"
    assert alive.on_update == admin.on_update == "require_healthy"
    (own,) = tg.tasks[0].services
    # a task's service defaults to <job>-<group>-<task> and belongs to its task
    assert (own.name, own.task_name, own.address) == ("shop-front-server", "server", "10.1.2.3")


def test_a_readiness_check() -> None:
    shared = '      check_restart {\n        limit = 3\n        grace = "30s"\n      }\n'
    text = JOB.replace(shared, "")
    text = text.replace('initial_status = "critical"', 'on_update = "ignore"')
    _, admin = parse(text).task_groups[0].services[0].checks
    assert admin.on_update == "ignore" and services.check_mode(admin) == services.READINESS


def test_check_restart_grace_defaults_to_a_second() -> None:
    text = JOB.replace('        grace = "30s"\n', "")
    alive, _ = parse(text).task_groups[0].services[0].checks
    assert (alive.check_restart.limit, alive.check_restart.grace) == (5, S)


def refusal(old: str, new: str) -> str:
    assert old in JOB
    with pytest.raises(JobspecError) as info:
        parse(JOB.replace(old, new, 1))
    return str(info.value)


#: anchors in JOB the refusal cases replace
TASK = '      task     = "server"\n'
CRIT = '        initial_status = "critical"\n'
PROV = 'provider = "nomad"\n      tags'
RESTART = "        check_restart { limit = 5 }"
CONSUL = "is a Consul feature; Consul is not available in Corral"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            '      provider = "nomad"\n      tags',
            "      tags",
            'provider "consul" (Nomad\'s default when provider is not set) needs Consul, and '
            'Consul is not available in Corral: set provider = "nomad"',
        ),
        (PROV, 'provider = "consul"\n      tags', 'set provider = "nomad"'),
        (PROV, 'provider = "k8s"\n      tags', "unknown provider 'k8s'"),
        (
            TASK,
            "      connect {\n sidecar_service {}\n }\n",
            f"connect block (Consul service mesh) {CONSUL}",
        ),
        (TASK, "      enable_tag_override = true\n", f"enable_tag_override {CONSUL}"),
        (TASK, '      tagged_addresses {\n lan = "x"\n }\n', f"tagged_addresses {CONSUL}"),
        (TASK, '      cluster = "east"\n', f"a Consul cluster {CONSUL}"),
        ('type     = "tcp"', 'type     = "script"', f"a script check {CONSUL}"),
        ('type     = "tcp"', 'type     = "grpc"', f"a grpc check {CONSUL}"),
        ('type     = "tcp"', 'type     = "docker"', "unknown check type 'docker'"),
        (CRIT, "        success_before_passing = 2\n", f"success_before_passing {CONSUL}"),
        (CRIT, "        failures_before_critical = 2\n", f"failures_before_critical {CONSUL}"),
        (CRIT, "        expose = true\n", f"expose (Consul service mesh) {CONSUL}"),
        (CRIT, '        on_update = "ignore_warnings"\n', "Nomad checks have no warning state"),
        (RESTART, f"{RESTART[:-2]}\n ignore_warnings = true\n }}", f"ignore_warnings {CONSUL}"),
        ('initial_status = "passing"', 'initial_status = "warning"', "no warning state"),
        ('path     = "/health?full=1"', 'path     = "http://x/"', "must be a path relative"),
        ('        path     = "/health?full=1"\n', "", "an http check needs a path"),
        ('interval = "5s"', 'interval = "500ms"', "must be at least 1s"),
        ('timeout  = "2s"', 'timeout  = "0s"', "timeout: is required and must be at least 1s"),
        ('method   = "POST"', 'method   = "FETCH"', "unknown HTTP method 'FETCH'"),
        (
            'port     = "http"',
            'port     = "web"',
            "port label 'web' is not a port of the group's network (known: admin, http)",
        ),
        ('port     = "admin"\n', 'port     = "nope"\n', "port label 'nope'"),
        (TASK, '      address_mode = "driver"\n', 'address_mode "driver" needs a driver network'),
        (TASK, '      address_mode = "alloc"\n', "needs a bridge or CNI network"),
        (TASK, '      task     = "worker"\n', "names no task of group 'front': 'worker'"),
        ('name     = "${JOB}-front"', 'name     = "front_end"', "not a valid service name"),
        (
            '        address  = "10.1.2.3"\n',
            '        address  = "10.1.2.3"\n        address_mode = "host"\n',
            'needs address_mode = "auto"',
        ),
        (
            RESTART,
            f'{RESTART}\n        on_update = "ignore"',
            "cannot be combined with check_restart",
        ),
    ],
)
def test_refusals_name_the_field_and_the_reason(old: str, new: str, expected: str) -> None:
    assert expected in refusal(old, new)


def test_a_refusal_points_at_its_line() -> None:
    message = refusal('type     = "tcp"', 'type     = "script"')
    assert message.startswith("shop.hcl:")
    assert "service > check > type" in message


def test_duplicate_services_and_checks() -> None:
    twice = JOB.replace(
        '    task "server" {',
        '    service {\n provider = "nomad"\n name = "shop-front"\n port = "http"\n }\n'
        '    task "server" {',
    )
    with pytest.raises(JobspecError, match="defined twice in group 'front'"):
        parse(twice)
    named = JOB.replace('port     = "admin"\n', 'name = "alive"\n port = "admin"\n')
    with pytest.raises(JobspecError, match="check 'alive' is defined twice"):
        parse(named)


def test_runtime_variables_pass_through_to_the_client() -> None:
    text = JOB.replace('name     = "${JOB}-front"', 'name     = "front-${NOMAD_ALLOC_INDEX}"')
    assert parse(text).task_groups[0].services[0].name == "front-${NOMAD_ALLOC_INDEX}"


NOMAD_JSON = {
    "Job": {
        "ID": "shop",
        "Name": "shop",
        "Type": "service",
        "TaskGroups": [
            {
                "Name": "front",
                "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
                "Services": [
                    {
                        "Name": "front",
                        "PortLabel": "http",
                        "Provider": "nomad",
                        "Tags": ["web"],
                        "Connect": None,
                        "EnableTagOverride": False,
                        "Cluster": "default",
                        "CheckRestart": {"Limit": 2},
                        "Checks": [
                            {
                                "Type": "http",
                                "Path": "/",
                                "Interval": 5 * S,
                                "Timeout": 2 * S,
                                "Header": {"X-A": ["1"]},
                                "SuccessBeforePassing": 0,
                            }
                        ],
                    }
                ],
                "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "true"}}],
            }
        ],
    }
}


def test_nomad_json_services() -> None:
    job = parse_job(json.dumps(NOMAD_JSON), "api.json")
    (front,) = job.task_groups[0].services
    (check,) = front.checks
    assert (front.name, front.port_label, list(front.tags)) == ("front", "http", ["web"])
    assert list(check.header["X-A"].values) == ["1"]
    assert (check.check_restart.limit, check.check_restart.grace) == (2, S)
    assert check.name == 'service: "front" check'


@pytest.mark.parametrize(
    ("where", "value", "expected"),
    [
        ("Provider", "", "Nomad's default when provider is not set"),
        ("Connect", {"SidecarService": {}}, "connect block (Consul service mesh) is a Consul"),
        ("Cluster", "east", "a Consul cluster is a Consul feature"),
        ("EnableTagOverride", True, "enable_tag_override is a Consul feature"),
    ],
)  # fmt: skip
def test_nomad_json_refusals(where: str, value: object, expected: str) -> None:
    data = json.loads(json.dumps(NOMAD_JSON))
    data["Job"]["TaskGroups"][0]["Services"][0][where] = value
    with pytest.raises(JobspecError, match="Consul is not available in Corral") as info:
        parse_job(json.dumps(data), "api.json")
    assert expected in str(info.value)


def test_choose_is_nomads_rendezvous_hashing() -> None:
    """The vectors of Nomad's TestServiceRegistration_choose: the same
    subsets in the same order, so a job moved from Nomad picks the same
    instances."""
    regs = [pb.ServiceRegistration(id=f"abc00{i}", service_name="s1") for i in (1, 2, 3)]

    def ids(parameter: str) -> list[str]:
        return [r.id for r in services.choose(regs, parameter)]

    assert ids("1|aaa") == ["abc003"]
    assert ids("2|aaa") == ["abc003", "abc001"]
    assert ids("3|aaa") == ["abc003", "abc001", "abc002"]
    assert ids("3|ddd") == ["abc001", "abc002", "abc003"]
    assert ids("3|ccc") == ["abc003", "abc002", "abc001"]
    assert ids("9|aaa") == ids("3|aaa")
    assert services.choose([], "2|aaa") == []
    for bad in ("", "1|", "|abc", "a|abc", "-1|abc"):
        with pytest.raises(ValueError, match="must be in form '<number>|<key>'"):
            services.choose(regs, bad)


def test_ids() -> None:
    service = pb.Service(name="web", port_label="http")
    assert services.registration_id("a1", services.workload_name("", "g"), service) == (
        "_nomad-task-a1-group-g-web-http"
    )
    assert services.registration_id("a1", services.workload_name("t", "g"), service) == (
        "_nomad-task-a1-t-web-http"
    )
    one = pb.ServiceCheck(name="c", type="http", path="/", interval=S, timeout=S)
    other = pb.ServiceCheck(name="c", type="http", path="/x", interval=S, timeout=S)
    assert services.check_id("a1", "g", one) == services.check_id("a1", "g", one)
    assert services.check_id("a1", "g", one) != services.check_id("a1", "g", other)
    assert services.check_id("a1", "g", one) != services.check_id("a2", "g", one)


def test_a_job_read_through_the_api_registers_again_unchanged() -> None:
    """GET /v1/job/:id then PUT it back (what Nomad clients do): the
    services survive Nomad's JSON shape both ways (headers as lists)."""
    from corral.domain.jobspec import json as jobspec_json
    from services.gateway.mapping import jobs as job_map

    job = parse(JOB)
    as_nomad = json.loads(json.dumps(job_map.job(job)))
    check = as_nomad["TaskGroups"][0]["Services"][0]["Checks"][0]
    assert check["Header"] == {"X-Probe": ["corral", "yes"]} and check["TLSSkipVerify"] is True
    again = jobspec_json.from_nomad(as_nomad)
    before, after = job.task_groups[0], again.task_groups[0]
    assert list(after.services) == list(before.services)
    assert list(after.tasks[0].services) == list(before.tasks[0].services)
