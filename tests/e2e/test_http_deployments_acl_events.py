"""The second half of the HTTP API against `corral dev -acl`, driven by
python-nomad (a Nomad client nobody here wrote) with the bootstrap token
from dev's exports: /v1/jobs/parse turns HCL into a job that registers
unchanged; a job with an update block deploys, its canary is promoted, a
deployment is paused, resumed and failed; `filter` narrows and a bad one
is a 400; ACL policies, roles and tokens are made through the API and a
token without the capability gets 403 (a token linking a role has the
role's policies as they are at each request); the event stream delivers a registered
job's event, heartbeats when quiet, and closes its gRPC stream when the
HTTP client leaves; no secret reaches the gateway's log."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nomad
import pytest
import requests
from nomad.api import exceptions as nomad_errors

from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.wait import wait_for

HCL = """
job "web" {
  datacenters = ["dc1"]
  type = "service"

  group "g" {
    count = 2
    update {
      max_parallel      = 1
      canary            = 1
      health_check      = "task_states"
      min_healthy_time  = "1s"
      healthy_deadline  = "20s"
      progress_deadline = "60s"
    }
    task "main" {
      driver = "mock"
      config {
        run_for = "0"
      }
      env {
        VERSION = "1"
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""
POLICY = 'namespace "default" {\n  policy = "read"\n}\n'


class Gateway:
    def __init__(self, dev: DevProcess) -> None:
        self.dev = dev
        self.url = dev.info["http_addr"]
        match = re.fullmatch(r"http://([\d.]+):(\d+)", self.url)
        assert match, self.url
        self.host, self.port = match.group(1), int(match.group(2))
        exports = dict(line.removeprefix("export ").split("=", 1) for line in dev.info["exports"])
        self.token = exports["CORRAL_TOKEN"]
        self.api = self.client(self.token)

    def client(self, token: str | None) -> nomad.Nomad:
        return nomad.Nomad(host=self.host, port=self.port, token=token, timeout=30)

    def get(self, path: str, token: str | None = None, **params: Any) -> requests.Response:
        headers = {"X-Nomad-Token": self.token if token is None else token}
        return requests.get(self.url + path, params=params, headers=headers, timeout=30)

    def post(self, path: str, body: Any, token: str | None = None) -> requests.Response:
        headers = {"X-Nomad-Token": self.token if token is None else token}
        return requests.post(self.url + path, json=body, headers=headers, timeout=30)

    def event_streams(self) -> tuple[float, float]:
        """Event.Stream calls the state has started and finished."""
        metrics = self.dev.info["roles"]["state"]["metrics"]
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        counts = {"started": 0.0, "handled": 0.0}
        for line in text.splitlines():
            m = re.match(r"grpc_server_(started|handled)_total\{(.*)\} (\S+)$", line)
            if m and 'grpc_service="corral.v1.Event"' in m.group(2):
                counts[m.group(1)] += float(m.group(3))
        return counts["started"], counts["handled"]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    started = start_dev(
        tmp_path_factory.mktemp("corral-dev-http2"),
        "-acl",
        env={k: v for k, v in os.environ.items() if k != "CORRAL_SERVER_TOKEN"},
    )
    try:
        g = Gateway(started)
        wait_for(
            "the dev client node, through the gateway",
            lambda: any(n["Status"] == "ready" for n in g.api.nodes.get_nodes()),
        )
        yield g
    finally:
        stop_dev(started)


def no_traceback(resp: requests.Response) -> None:
    assert "Traceback" not in resp.text and 'File "' not in resp.text, resp.text


def latest(gw: Gateway) -> dict[str, Any]:
    return gw.api.job.get_deployment("web") or {}


def register_version(gw: Gateway, version: str) -> dict[str, Any]:
    job = gw.api.job.get_job("web")
    job["TaskGroups"][0]["Tasks"][0]["Env"]["VERSION"] = version
    answer: dict[str, Any] = gw.api.jobs.register_job({"Job": job})
    return answer


def test_parse_register_and_deployments(gw: Gateway) -> None:
    job = gw.api.jobs.parse(HCL, canonicalize=True)
    assert job["ID"] == "web" and job["TaskGroups"][0]["Update"]["Canary"] == 1
    assert job["TaskGroups"][0]["Tasks"][0]["Driver"] == "mock"
    gw.api.jobs.register_job({"Job": job})

    first = wait_for(
        "the first deployment to succeed",
        lambda: (d := latest(gw)).get("Status") == "successful" and d,
        timeout=90,
    )
    assert first["JobID"] == "web" and first["JobVersion"] == 0
    assert first["TaskGroups"]["g"]["DesiredTotal"] == 2
    allocs = gw.api.deployment.get_deployment_allocations(first["ID"])
    assert len(allocs) == 2 and {a["JobID"] for a in allocs} == {"web"}
    assert gw.api.deployment.get_deployment(first["ID"])["ID"] == first["ID"]

    # version 2: one canary, promoted by hand after a pause and a resume
    register_version(gw, "2")

    def canary_healthy() -> dict[str, Any] | None:
        d = latest(gw)
        tg = d.get("TaskGroups", {}).get("g", {})
        ready = d.get("JobVersion") == 1 and tg.get("PlacedCanaries") and tg["HealthyAllocs"]
        return d if ready else None

    second = wait_for("a healthy canary", canary_healthy, timeout=90)
    assert second["Status"] == "running"
    with pytest.raises(nomad_errors.BadRequestNomadException) as refused:
        gw.api.deployment.promote_deployment_groups(second["ID"], ["nope"])
    assert "nope" in refused.value.nomad_resp.text
    paused = gw.api.deployment.pause_deployment(second["ID"], True)
    assert paused["DeploymentModifyIndex"] > 0 and paused["RevertedJobVersion"] is None
    assert gw.api.deployment.get_deployment(second["ID"])["Status"] == "paused"
    gw.api.deployment.pause_deployment(second["ID"], False)
    assert gw.api.deployment.get_deployment(second["ID"])["Status"] == "running"
    promoted = gw.api.deployment.promote_deployment_all(second["ID"])
    assert promoted["EvalID"] and promoted["Index"] >= promoted["DeploymentModifyIndex"]
    done = wait_for(
        "the promoted deployment to succeed",
        lambda: (
            (d := gw.api.deployment.get_deployment(second["ID"]))["Status"] == "successful" and d
        ),
        timeout=90,
    )
    assert done["TaskGroups"]["g"]["Promoted"] is True

    # version 3: failed by hand
    register_version(gw, "3")
    third = wait_for("the third deployment", lambda: (d := latest(gw)).get("JobVersion") == 2 and d)
    gw.api.deployment.fail_deployment(third["ID"])
    assert gw.api.deployment.get_deployment(third["ID"])["Status"] == "failed"
    with pytest.raises(nomad_errors.BadRequestNomadException):
        gw.api.deployment.fail_deployment(third["ID"])

    listed = gw.api.job.get_deployments("web")
    assert {d["ID"] for d in listed} == {first["ID"], second["ID"], third["ID"]}
    assert {d["ID"] for d in gw.api.deployments.get_deployments()} >= {d["ID"] for d in listed}

    # filter, then pages of the filtered list
    ok = gw.get("/v1/deployments", filter='Status == "successful" and JobID == "web"')
    assert ok.status_code == 200 and int(ok.headers["X-Nomad-Index"]) > 0
    assert {d["ID"] for d in ok.json()} == {first["ID"], second["ID"]}
    page1 = gw.get("/v1/deployments", filter='JobID == "web"', per_page="2")
    assert len(page1.json()) == 2 and page1.headers.get("X-Nomad-NextToken")
    page2 = gw.get(
        "/v1/deployments",
        filter='JobID == "web"',
        per_page="2",
        next_token=page1.headers["X-Nomad-NextToken"],
    )
    assert len(page2.json()) == 1 and "X-Nomad-NextToken" not in page2.headers
    assert {d["ID"] for d in page1.json() + page2.json()} == {d["ID"] for d in listed}
    # the gateway's own lists filter too (the same hook)
    jobs = gw.get("/v1/jobs", filter='ID == "web" and Type == "service"').json()
    assert [j["ID"] for j in jobs] == ["web"]
    assert gw.get("/v1/jobs", filter='ID == "nope"').json() == []
    allocs = gw.get("/v1/allocations", filter='JobID == "web" and ClientStatus == "running"')
    assert allocs.json() and {a["JobID"] for a in allocs.json()} == {"web"}
    nodes = gw.get("/v1/nodes", filter='Status == "ready"').json()
    assert len(nodes) == 1
    bad = gw.get("/v1/deployments", filter='Status = "x"')
    assert bad.status_code == 400 and "failed to read filter expression" in bad.text
    no_traceback(bad)
    missing = gw.get("/v1/deployment/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404 and "not found" in missing.text


def test_parse_errors(gw: Gateway) -> None:
    bad = gw.post("/v1/jobs/parse", {"JobHCL": 'job "x" {\n  group "g" {\n'})
    assert bad.status_code == 400 and bad.text.startswith("error parsing: ")
    no_traceback(bad)
    empty = gw.post("/v1/jobs/parse", {"Canonicalize": True})
    assert empty.status_code == 400 and "JobHCL" in empty.text
    garbled = requests.post(
        gw.url + "/v1/jobs/parse", data="{nope", headers={"X-Nomad-Token": gw.token}, timeout=30
    )
    assert garbled.status_code == 400 and "Failed to decode request body" in garbled.text
    # as Nomad's, parsing needs parse-job (or submit-job, read-job): not for anyone
    anonymous = requests.post(gw.url + "/v1/jobs/parse", data="{nope", timeout=30)
    assert anonymous.status_code == 403


def test_parse_with_variables(gw: Gateway) -> None:
    hcl = (
        'variable "count" {\n  type = number\n}\n'
        'locals {\n  name = upper("web")\n}\n'
        + HCL.replace('job "web"', 'job "vars"')
        .replace("count = 2", "count = var.count")
        .replace('VERSION = "1"', 'VERSION = local.name\n        ALLOC = "${NOMAD_ALLOC_ID}"')
    )
    parsed = gw.post("/v1/jobs/parse", {"JobHCL": hcl, "Variables": "count = 3\nunused = 1\n"})
    assert parsed.status_code == 200, parsed.text
    job = parsed.json()
    assert job["TaskGroups"][0]["Count"] == 3
    assert job["TaskGroups"][0]["Tasks"][0]["Env"] == {
        "VERSION": "WEB",
        "ALLOC": "${NOMAD_ALLOC_ID}",
    }
    unset = gw.post("/v1/jobs/parse", {"JobHCL": hcl})
    assert unset.status_code == 400 and 'variable "count" has no value' in unset.text
    no_fs = hcl.replace('upper("web")', 'file("/etc/hostname")')
    refused = gw.post("/v1/jobs/parse", {"JobHCL": no_fs, "Variables": "count = 1"})
    assert refused.status_code == 400 and "filesystem functions are disabled" in refused.text
    no_traceback(refused)


def test_acl_policies_and_tokens(gw: Gateway) -> None:
    with pytest.raises(nomad_errors.BadRequestNomadException) as again:
        gw.api.acl.generate_bootstrap()
    assert "already done" in again.value.nomad_resp.text

    me = gw.api.acl.get_self_token()
    assert me["Type"] == "management" and me["SecretID"] == gw.token

    made = gw.api.acl.create_policy(
        "readers", {"Name": "readers", "Description": "read only", "Rules": POLICY}
    )
    assert made.status_code == 200 and int(made.headers["X-Nomad-Index"]) > 0
    assert {"Name": "readers", "Description": "read only"}.items() <= next(
        p for p in gw.api.acl.get_policies() if p["Name"] == "readers"
    ).items()
    assert gw.api.acl.get_policy("readers")["Rules"] == POLICY

    token = gw.api.acl.create_token({"Name": "ro", "Type": "client", "Policies": ["readers"]})
    secret = token["SecretID"]
    assert secret and token["AccessorID"] and token["Policies"] == ["readers"]
    listed = gw.api.acl.get_tokens()
    assert token["AccessorID"] in {t["AccessorID"] for t in listed}
    assert all("SecretID" not in t for t in listed)
    read = gw.api.acl.get_token(token["AccessorID"])
    assert read["Name"] == "ro" and read["SecretID"] == ""
    filtered = gw.get("/v1/acl/tokens", filter='Type == "client"')
    assert [t["AccessorID"] for t in filtered.json()] == [token["AccessorID"]]

    reader = gw.client(secret)
    assert reader.acl.get_self_token()["SecretID"] == secret
    assert isinstance(reader.jobs.get_jobs(), list)  # read-job: allowed
    with pytest.raises(nomad_errors.URLNotAuthorizedNomadException) as denied:
        reader.acl.get_tokens()
    assert denied.value.nomad_resp.text == "Permission denied"
    with pytest.raises(nomad_errors.URLNotAuthorizedNomadException):
        reader.jobs.register_job({"Job": gw.api.jobs.parse(HCL.replace('"web"', '"ro"'))})
    with pytest.raises(nomad_errors.URLNotAuthorizedNomadException):
        gw.client("not-a-token").jobs.get_jobs()

    # a token updated in place (Nomad's body names its accessor)
    path = "/v1/acl/token/" + token["AccessorID"]
    mismatch = gw.post(path, {"Name": "renamed"})
    assert mismatch.status_code == 400, mismatch.text
    assert "accessor does not match" in mismatch.text
    body = {**{k: token[k] for k in ("AccessorID", "Type", "Policies")}, "Name": "renamed"}
    update = gw.post(path, body)
    assert update.status_code == 200, update.text
    assert update.json()["Name"] == "renamed" and update.json()["SecretID"] == ""
    assert gw.post("/v1/acl/token/self", {}).status_code == 405

    assert gw.api.acl.delete_token(token["AccessorID"]) is True
    with pytest.raises(nomad_errors.URLNotAuthorizedNomadException):
        reader.jobs.get_jobs()
    assert gw.api.acl.delete_policy("readers") is True
    with pytest.raises(nomad_errors.URLNotFoundNomadException):
        gw.api.acl.get_policy("readers")

    log = (gw.dev.data_dir / "logs" / "gateway.log").read_text()
    assert gw.token not in log and secret not in log


def test_acl_roles(gw: Gateway) -> None:
    """Roles over Nomad's HTTP API (python-nomad has no roles client: plain
    requests for /v1/acl/role*, python-nomad for tokens and jobs)."""
    gw.api.acl.create_policy("role-read", {"Name": "role-read", "Rules": POLICY})
    node_rules = 'node { policy = "read" }'
    gw.api.acl.create_policy("role-nodes", {"Name": "role-nodes", "Rules": node_rules})
    made = gw.post(
        "/v1/acl/role",
        {"Name": "readers-role", "Description": "d", "Policies": [{"Name": "role-read"}]},
    )
    assert made.status_code == 200, made.text
    role = made.json()
    assert role["ID"] and role["Policies"] == [{"Name": "role-read"}]
    assert int(made.headers["X-Nomad-Index"]) == role["ModifyIndex"]
    assert gw.get("/v1/acl/role/" + role["ID"]).json() == role
    assert gw.get("/v1/acl/role/name/readers-role").json() == role
    assert role["ID"] in [r["ID"] for r in gw.get("/v1/acl/roles").json()]
    assert gw.get("/v1/acl/role/name/no-such").status_code == 404

    before = gw.get("/v1/acl/roles").json()
    for body, words in [
        (
            {"Name": "bad", "Policies": [{"Name": "missing"}]},
            "Policies: cannot find policy missing",
        ),
        ({"Name": "bad"}, "Policies: at least one policy"),
        (
            {"Name": "readers-role", "Policies": [{"Name": "role-read"}]},
            "Name: role with name readers-role already exists",
        ),
        ({"Name": "bad", "Policies": "role-read"}, "Policies must be a list"),
    ]:
        resp = gw.post("/v1/acl/role", body)
        assert resp.status_code == 400 and resp.text.startswith(words), resp.text
        no_traceback(resp)
    wrong = gw.post("/v1/acl/role/" + role["ID"], {**role, "ID": "other"})
    assert wrong.status_code == 400 and "does not match request path" in wrong.text
    assert gw.get("/v1/acl/roles").json() == before

    with pytest.raises(nomad_errors.BadRequestNomadException) as unknown:
        gw.api.acl.create_token({"Type": "client", "Roles": [{"Name": "no-such"}]})
    assert unknown.value.nomad_resp.text == "Roles: cannot find role no-such"
    token = gw.api.acl.create_token(
        {"Name": "by-role", "Type": "client", "Roles": [{"Name": "readers-role"}]}
    )
    assert token["Roles"] == [{"ID": role["ID"], "Name": "readers-role"}]
    assert token["Policies"] is None
    reader = gw.client(token["SecretID"])
    assert isinstance(reader.jobs.get_jobs(), list)  # through the role
    mine = gw.get("/v1/acl/roles", token=token["SecretID"])
    assert [r["ID"] for r in mine.json()] == [role["ID"]]
    assert gw.get("/v1/acl/role/" + role["ID"], token=token["SecretID"]).status_code == 200
    assert gw.post("/v1/acl/role", {"Name": "x"}, token=token["SecretID"]).status_code == 403

    # the role changed: the next request sees it
    changed = gw.post("/v1/acl/role/" + role["ID"], {**role, "Policies": [{"Name": "role-nodes"}]})
    assert changed.status_code == 200, changed.text
    with pytest.raises(nomad_errors.URLNotAuthorizedNomadException):
        reader.jobs.get_jobs()
    assert isinstance(reader.nodes.get_nodes(), list)
    gw.post("/v1/acl/role/" + role["ID"], role)
    assert isinstance(reader.jobs.get_jobs(), list)

    # the role deleted: its policies leave the token, and so does the link
    gone = requests.delete(
        gw.url + "/v1/acl/role/" + role["ID"], headers={"X-Nomad-Token": gw.token}, timeout=30
    )
    assert gone.status_code == 200, gone.text
    with pytest.raises(nomad_errors.URLNotAuthorizedNomadException):
        reader.jobs.get_jobs()
    assert gw.api.acl.get_token(token["AccessorID"])["Roles"] is None
    assert gw.get("/v1/acl/role/" + role["ID"]).status_code == 404
    gw.api.acl.delete_token(token["AccessorID"])
    gw.api.acl.delete_policy("role-read")
    gw.api.acl.delete_policy("role-nodes")


def test_event_stream(gw: Gateway) -> None:
    if not any(j["ID"] == "web" for j in gw.api.jobs.get_jobs()):
        gw.api.jobs.register_job({"Job": gw.api.jobs.parse(HCL)})
    index = gw.api.job.get_job("web")["JobModifyIndex"]

    thread, stop, events = gw.api.event.stream.get_stream(index=index, topic=["Job:web"])
    thread.daemon = True
    thread.start()
    try:
        line = events.get(timeout=30)
    finally:
        stop.set()
    first = line["Events"][0]
    assert line["Index"] >= index and first["Topic"] == "Job" and first["Key"] == "web"
    assert first["Type"] in ("JobRegistered", "JobStatusUpdated")
    assert first["Payload"]["Job"]["ID"] == "web" and first["Namespace"] == "default"

    bad = gw.get("/v1/event/stream", topic="Jobs")
    assert bad.status_code == 400 and "unknown topic 'Jobs'" in bad.text
    denied = gw.get("/v1/event/stream", token="not-a-token", topic="Job")
    assert denied.status_code == 403 and denied.text == "Permission denied"

    # a quiet stream heartbeats with `{}`; a client that leaves ends the gRPC stream
    with requests.get(
        gw.url + "/v1/event/stream",
        params={"topic": "Node:no-such-node"},
        headers={"X-Nomad-Token": gw.token},
        stream=True,
        timeout=30,
    ) as resp:
        assert resp.status_code == 200
        heartbeat = next(line for line in resp.iter_lines() if line)
        assert json.loads(heartbeat) == {}
    wait_for(
        "every Event.Stream call to end once its HTTP client left",
        lambda: (lambda s: s[0] == s[1])(gw.event_streams()),
        timeout=30,
    )


def test_unknown_and_wrong_method(gw: Gateway) -> None:
    wrong = requests.delete(gw.url + "/v1/deployments", timeout=30)
    assert wrong.status_code == 405
    unserved = gw.get("/v1/acl/auth-methods")
    assert unserved.status_code == 501
    no_traceback(unserved)


def test_gateway_log_is_free_of_tracebacks(gw: Gateway) -> None:
    log = Path(gw.dev.data_dir / "logs" / "gateway.log").read_text()
    assert "Traceback" not in log
