"""One `corral dev -acl` for the gateway's security tests (issue 26), seeded
over Nomad's HTTP API with the bootstrap token:

* namespace "default": a service job with a deployment and a running alloc
  that writes a log line, a parameterized and a periodic job (the route
  authorization test, test_authz_routes.py, names them in its requests);
* namespace "team-a": a service job a reader may see, and a sentinel job
  registered last (event streams read until its index);
* namespace "team-b": a job whose id, meta and env carry a marker no
  request ever names, with its deployment, evals and a running alloc on
  the same node (the namespace audit, test_audit_namespaces.py, looks
  for every one of them in every answer a team-a reader gets).

The modules run in name order and share the cluster: the audit and the
route test first, the fuzz test (test_fuzz_http.py, which may change
anything a 2xx may change) last.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.wait import wait_for

#: each HTTP request of these tests must complete within this (generous:
#: the machine may be busy; performance is not measured here)
REQUEST_TIMEOUT = 60.0

READER_POLICY = """
namespace "team-a" { policy = "read" }
node     { policy = "read" }
agent    { policy = "read" }
operator { policy = "read" }
"""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Http:
    """Raw HTTP to the gateway, with a token or none."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()

    def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        params: dict[str, str] | None = None,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Answer:
        sent = dict(headers or {})
        if token:
            sent["X-Nomad-Token"] = token
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        resp = self.session.request(
            method, self.url + path, params=params, data=data, headers=sent, timeout=timeout
        )
        return Answer(resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, resp.text)

    def ok(self, method: str, path: str, **kw: Any) -> Any:
        answer = self.call(method, path, **kw)
        assert 200 <= answer.status < 300, f"{method} {path}: {answer.status} {answer.text}"
        return answer.json() if answer.text else None


@dataclass
class Objects:
    """Ids of one namespace's seeded objects."""

    namespace: str
    job_id: str
    task: str = "main"
    alloc_ids: list[str] = field(default_factory=list)
    eval_ids: list[str] = field(default_factory=list)
    deployment_ids: list[str] = field(default_factory=list)
    scaling_policy_ids: list[str] = field(default_factory=list)

    def ids(self) -> list[str]:
        return [
            self.job_id,
            *self.alloc_ids,
            *self.eval_ids,
            *self.deployment_ids,
            *self.scaling_policy_ids,
        ]


@dataclass
class Cluster:
    dev: DevProcess
    http: Http
    management: str
    node_id: str
    default: Objects
    team_a: Objects
    team_b: Objects
    #: strings only team-b's objects hold (never sent in a request)
    marker: str
    #: the path of team-b's variable (its items hold the marker)
    variable_path: str
    #: the index before team-b's objects were written, and after the sentinel
    index_before_b: int
    sentinel_index: int
    dispatch_job: str = "gw-dispatch"
    periodic_job: str = "gw-periodic"
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.http.url

    def token(self, name: str, rules: str) -> str:
        """A client token holding one policy named `name` with `rules`
        (made once per name)."""
        if name not in self.tokens:
            self.http.ok(
                "PUT",
                f"/v1/acl/policy/{name}",
                token=self.management,
                body={"Name": name, "Rules": rules},
            )
            made = self.http.ok(
                "PUT",
                "/v1/acl/token",
                token=self.management,
                body={"Name": name, "Type": "client", "Policies": [name]},
            )
            self.tokens[name] = made["SecretID"]
        return self.tokens[name]

    def index(self) -> int:
        answer = self.http.call("GET", "/v1/jobs", token=self.management)
        return int(answer.headers["x-nomad-index"])


def service_job(job_id: str, namespace: str, *, meta: dict[str, str] | None = None) -> Any:
    """A raw_exec service that logs a line and sleeps, with an update block
    (so it has a deployment) and a scaling block (so it has a scaling
    policy), as Nomad's API JSON."""
    script = f"echo {job_id}-says-hello; while true; do sleep 1; done"
    return {
        "Job": {
            "ID": job_id,
            "Name": job_id,
            "Namespace": namespace,
            "Type": "service",
            "Datacenters": ["dc1"],
            "Meta": meta or {},
            "TaskGroups": [
                {
                    "Name": "web",
                    "Count": 1,
                    "Scaling": {"Min": 1, "Max": 3, "Enabled": True},
                    "Update": {
                        "MaxParallel": 1,
                        "HealthCheck": "task_states",
                        "MinHealthyTime": 1_000_000_000,
                        "HealthyDeadline": 60_000_000_000,
                        "ProgressDeadline": 120_000_000_000,
                    },
                    "Tasks": [
                        {
                            "Name": "main",
                            "Driver": "raw_exec",
                            "Config": {"command": "/bin/sh", "args": ["-c", script]},
                            "Env": dict(meta or {}),
                            "Resources": {"CPU": 20, "MemoryMB": 16},
                        }
                    ],
                }
            ],
        }
    }


def batch_job(job_id: str, **extra: Any) -> Any:
    return {
        "Job": {
            "ID": job_id,
            "Name": job_id,
            "Type": "batch",
            "Datacenters": ["dc1"],
            **extra,
            "TaskGroups": [
                {
                    "Name": "run",
                    "Count": 1,
                    "Tasks": [
                        {
                            "Name": "main",
                            "Driver": "mock",
                            "Config": {"run_for": "0"},
                            "Resources": {"CPU": 10, "MemoryMB": 8},
                        }
                    ],
                }
            ],
        }
    }


def _running(http: Http, token: str, objects: Objects) -> bool:
    allocs = http.ok(
        "GET",
        f"/v1/job/{objects.job_id}/allocations",
        token=token,
        params={"namespace": objects.namespace},
    )
    running = [a for a in allocs if a["ClientStatus"] == "running"]
    return bool(running)


def _collect(http: Http, token: str, objects: Objects) -> None:
    q = {"namespace": objects.namespace}
    path = f"/v1/job/{objects.job_id}"
    objects.alloc_ids = [
        a["ID"] for a in http.ok("GET", path + "/allocations", token=token, params=q)
    ]
    objects.eval_ids = [
        e["ID"] for e in http.ok("GET", path + "/evaluations", token=token, params=q)
    ]
    objects.deployment_ids = [
        d["ID"] for d in http.ok("GET", path + "/deployments", token=token, params=q)
    ]
    policies = http.ok(
        "GET", "/v1/scaling/policies", token=token, params={**q, "job": objects.job_id}
    )
    objects.scaling_policy_ids = [p["ID"] for p in policies]


def _seed(dev: DevProcess) -> Cluster:
    http = Http(dev.http_addr)
    mgmt = dev.token
    nodes = wait_for(
        "the dev node, through the gateway",
        lambda: [n for n in http.ok("GET", "/v1/nodes", token=mgmt) if n["Status"] == "ready"],
        timeout=90,
    )
    for namespace in ("team-a", "team-b"):
        http.ok(
            "PUT",
            f"/v1/namespace/{namespace}",
            token=mgmt,
            body={"Name": namespace, "Description": "issue 26's audit"},
        )
    tag = uuid.uuid4().hex[:10]
    marker = f"LEAK-b-{tag}"
    # zz-unused: what a token of no use may read (a policy names existing namespaces)
    made = (("team-a", "issue 26's audit"), ("team-b", marker), ("zz-unused", "nothing"))
    for namespace, description in made:
        http.ok(
            "PUT",
            f"/v1/namespace/{namespace}",
            token=mgmt,
            body={"Name": namespace, "Description": description},
        )
    default = Objects("default", "gw-web")
    team_a = Objects("team-a", "team-a-web")
    team_b = Objects("team-b", f"secret-b-{tag}")
    http.ok("PUT", "/v1/jobs", token=mgmt, body=service_job(default.job_id, "default"))
    http.ok(
        "PUT",
        "/v1/jobs",
        token=mgmt,
        body=batch_job("gw-dispatch", ParameterizedJob={"Payload": "optional"}),
    )
    http.ok(
        "PUT",
        "/v1/jobs",
        token=mgmt,
        body=batch_job(
            "gw-periodic",
            Periodic={"Enabled": True, "Spec": "0 0 1 1 *", "SpecType": "cron"},
        ),
    )
    http.ok("PUT", "/v1/jobs", token=mgmt, body=service_job(team_a.job_id, "team-a"))
    index_before_b = int(http.call("GET", "/v1/jobs", token=mgmt).headers["x-nomad-index"])
    http.ok(
        "PUT",
        "/v1/jobs",
        token=mgmt,
        body=service_job(team_b.job_id, "team-b", meta={"marker": marker}),
    )
    for objects in (default, team_a, team_b):
        wait_for(
            f"{objects.job_id}'s alloc running",
            lambda o=objects: _running(http, mgmt, o),  # type: ignore[misc]
            timeout=120,
        )
    variable_path = f"{team_b.job_id}/creds"
    http.ok(
        "PUT",
        f"/v1/var/{variable_path}",
        token=mgmt,
        params={"namespace": "team-b"},
        body={"Items": {"password": marker}},
    )
    sentinel = http.ok(
        "PUT", "/v1/jobs", token=mgmt, body=batch_job("team-a-sentinel", Namespace="team-a")
    )
    for objects in (default, team_a, team_b):
        _collect(http, mgmt, objects)
        assert objects.alloc_ids and objects.eval_ids and objects.deployment_ids, objects
        assert objects.scaling_policy_ids, objects
    return Cluster(
        dev=dev,
        http=http,
        management=mgmt,
        node_id=nodes[0]["ID"],
        default=default,
        team_a=team_a,
        team_b=team_b,
        marker=marker,
        variable_path=variable_path,
        index_before_b=index_before_b,
        sentinel_index=int(sentinel["JobModifyIndex"]),
    )


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    dev = start_dev(tmp_path_factory.mktemp("corral-gw-security"), "-acl")
    try:
        yield _seed(dev)
    finally:
        stop_dev(dev)
        check_logs(dev.data_dir)


def check_logs(data_dir: Path) -> None:
    """No role logged a traceback while these tests ran (a bad request must
    be answered, never crash a handler)."""
    found = []
    for log in sorted((data_dir / "logs").glob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback (most recent call last)" in text:
            found.append(log.name)
    assert not found, f"tracebacks in {found} under {data_dir / 'logs'}"
