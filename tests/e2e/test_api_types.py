"""Every route of the gateway's route table, walked on one `corral dev -acl`
seeded with realistic objects (a service job with ports, a Nomad-provider
service and its check, a canary deployment waiting for promotion and a
scaling policy; a finished batch job; a job too big to place, with its
blocked eval and failed placements; periodic and parameterized jobs and a
dispatched child; a variable, a namespace, a node pool, ACL policies,
roles and tokens), each answer checked against the JSON shapes of Nomad's
Go `api` package (tests/apitypes/: field names, JSON types, null-ness;
see check.py for what counts as a problem).

A route added to the gateway without a call here fails
`test_every_route_is_walked`: give it a `Call` naming the api type its
answer decodes into."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.routing import Mount, Route

from services.gateway import app, authz
from tests.apitypes.check import EXTRA, check, local_structs
from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.e2e.gateway_security.conftest import Answer, Http, check_logs
from tests.wait import wait_for

pytestmark = [pytest.mark.slow]

WEB_HCL = """
job "web" {
  datacenters = ["dc1"]
  meta { team = "types" }

  group "web" {
    count = 1

    network {
      port "http" {}
    }

    scaling {
      min     = 1
      max     = 3
      enabled = true
      policy { cooldown = "1m" }
    }

    update {
      max_parallel      = 1
      canary            = 1
      health_check      = "task_states"
      min_healthy_time  = "1s"
      healthy_deadline  = "30s"
      progress_deadline = "60s"
    }

    service {
      name     = "web"
      port     = "http"
      provider = "nomad"
      tags     = ["v1"]

      check {
        type     = "tcp"
        interval = "2s"
        timeout  = "1s"
      }
    }

    task "server" {
      driver = "raw_exec"

      config {
        command = "python3"
        args    = ["-m", "http.server", "${NOMAD_PORT_http}"]
      }

      env { VERSION = "1" }

      action "version" {
        command = "/bin/sh"
        args    = ["-c", "echo $VERSION"]
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"""


def batch(job_id: str, **extra: Any) -> dict[str, Any]:
    return {
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
                        "Config": {"run_for": "10ms"},
                        "Resources": {"CPU": 10, "MemoryMB": 8},
                    }
                ],
            }
        ],
    }


@dataclass
class World:
    dev: DevProcess
    http: Http
    token: str
    node_id: str
    web_allocs: list[str]
    web_evals: list[str]
    canary_deployment: str
    batch_alloc: str
    blocked_eval: str
    scaling_policy: str
    dispatched: str
    client_token_accessor: str
    key_id: str
    #: objects a call made for a later call (ids of created things)
    made: dict[str, Any] = field(default_factory=dict)

    def call(self, method: str, path: str, **kw: Any) -> Answer:
        kw.setdefault("token", self.token)
        return self.http.call(method, path, **kw)

    def ok(self, method: str, path: str, **kw: Any) -> Any:
        kw.setdefault("token", self.token)
        return self.http.ok(method, path, **kw)


def _seed(dev: DevProcess) -> World:
    http = Http(dev.http_addr)
    mgmt = dev.token
    ok = lambda method, path, **kw: http.ok(method, path, token=mgmt, **kw)  # noqa: E731
    node = wait_for(
        "the dev node",
        lambda: [n for n in ok("GET", "/v1/nodes") if n["Status"] == "ready"],
        timeout=90,
    )[0]
    web = ok("PUT", "/v1/jobs/parse", body={"JobHCL": WEB_HCL, "Canonicalize": True})
    # as Nomad's CLI registers it: with its source
    submission = {"Source": WEB_HCL, "Format": "hcl2", "VariableFlags": None, "Variables": ""}
    ok("PUT", "/v1/jobs", body={"Job": web, "Submission": submission})
    wait_for(
        "web's first deployment to succeed",
        lambda: (ok("GET", "/v1/job/web/deployment") or {}).get("Status") == "successful",
        timeout=120,
    )
    # version 1: a canary that waits for promotion
    web["TaskGroups"][0]["Tasks"][0]["Env"]["VERSION"] = "2"
    ok("PUT", "/v1/jobs", body={"Job": web})

    def canary_healthy() -> Any:
        d = ok("GET", "/v1/job/web/deployment") or {}
        tg = d.get("TaskGroups", {}).get("web", {})
        return d.get("JobVersion") == 1 and tg.get("HealthyAllocs") and d

    canary = wait_for("a healthy canary", canary_healthy, timeout=120)
    ok("PUT", "/v1/jobs", body={"Job": batch("finished")})
    parameterized = {"Payload": "optional"}
    ok("PUT", "/v1/jobs", body={"Job": batch("dispatcher", ParameterizedJob=parameterized)})
    for name in ("nightly", "weekly"):
        periodic = {"Enabled": True, "Spec": "0 3 * * *"}
        ok("PUT", "/v1/jobs", body={"Job": batch(name, Periodic=periodic)})
    too_big = batch("too-big")
    too_big["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"] = 10_000_000
    ok("PUT", "/v1/jobs", body={"Job": too_big})
    dispatched = ok("PUT", "/v1/job/dispatcher/dispatch", body={"Meta": {}})["DispatchedJobID"]
    finished = wait_for(
        "the batch job's alloc complete",
        lambda: [
            a for a in ok("GET", "/v1/job/finished/allocations") if a["ClientStatus"] == "complete"
        ],
        timeout=90,
    )
    blocked = wait_for(
        "too-big's blocked eval",
        lambda: [e for e in ok("GET", "/v1/job/too-big/evaluations") if e["Status"] == "blocked"],
        timeout=60,
    )
    ok("PUT", "/v1/var/types/creds", body={"Items": {"user": "u", "password": "p"}})
    ok("PUT", "/v1/namespace/types-ns", body={"Name": "types-ns", "Description": "d"})
    ok("PUT", "/v1/node/pools", body={"Name": "types-pool", "Meta": {"k": "v"}})
    ok("PUT", "/v1/acl/policy/types-read", body={"Name": "types-read", "Rules": READ_RULES})
    ok(
        "PUT",
        "/v1/acl/role",
        body={"Name": "types-role", "Description": "d", "Policies": [{"Name": "types-read"}]},
    )
    client = ok(
        "PUT",
        "/v1/acl/token",
        body={
            "Name": "types",
            "Type": "client",
            "Policies": ["types-read"],
            "Roles": [{"Name": "types-role"}],
            "ExpirationTTL": "1h",
        },
    )
    web_allocs = [a["ID"] for a in ok("GET", "/v1/job/web/allocations")]
    policies = ok("GET", "/v1/scaling/policies", params={"job": "web"})
    keys = ok("GET", "/v1/operator/keyring/keys")
    return World(
        dev=dev,
        http=http,
        token=mgmt,
        node_id=node["ID"],
        web_allocs=web_allocs,
        web_evals=[e["ID"] for e in ok("GET", "/v1/job/web/evaluations")],
        canary_deployment=canary["ID"],
        batch_alloc=finished[0]["ID"],
        blocked_eval=blocked[0]["ID"],
        scaling_policy=policies[0]["ID"],
        dispatched=dispatched,
        client_token_accessor=client["AccessorID"],
        key_id=keys[0]["KeyID"],
    )


READ_RULES = """
namespace "default" { policy = "read" }
node { policy = "read" }
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    dev = start_dev(tmp_path_factory.mktemp("corral-api-types"), "-acl")
    try:
        yield _seed(dev)
    finally:
        stop_dev(dev)
        check_logs(dev.data_dir)


# -- the calls -------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    path: str
    params: dict[str, str] = field(default_factory=dict)
    body: Any = None


@dataclass(frozen=True)
class Call:
    """One request to a route and the api type its answer decodes into
    (`None`: an answer with no body, as Nomad's writes that return only
    their index)."""

    method: str
    template: str
    build: Callable[[World], Req]
    type: str | None
    #: "json", "ndjson" (the event stream: read a few lines), "frames"
    #: (the log stream's JSON frames), "text" (a non-JSON body)
    kind: str = "json"
    status: int = 200

    @property
    def id(self) -> str:
        return f"{self.method} {self.template}"


def r(path: str, body: Any = None, **params: str) -> Callable[[World], Req]:
    return lambda w: Req(path, params, body)


def _one_time_secret(w: World) -> dict[str, str]:
    """An exchange's body naming a fresh one-time token (one exchanges once)."""
    made = w.ok("PUT", "/v1/acl/token/onetime")
    return {"OneTimeSecretID": made["OneTimeToken"]["OneTimeSecretID"]}


def _role(w: World) -> dict[str, Any]:
    role: dict[str, Any] = w.ok("GET", "/v1/acl/role/name/types-role")
    return role


def web_job(w: World) -> dict[str, Any]:
    job: dict[str, Any] = w.ok("GET", "/v1/job/web")
    return job


CALLS: list[Call] = [
    # status, agent, regions
    Call("GET", "/v1/agent/health", r("/v1/agent/health"), "AgentHealthResponse"),
    Call("GET", "/v1/status/leader", r("/v1/status/leader"), "string"),
    Call("GET", "/v1/status/peers", r("/v1/status/peers"), "[]string"),
    Call("GET", "/v1/regions", r("/v1/regions"), "[]string"),
    Call("GET", "/v1/agent/self", r("/v1/agent/self"), "AgentSelf"),
    Call("GET", "/v1/agent/members", r("/v1/agent/members"), "ServerMembers"),
    # the federation: joining an address that refuses (200, num_joined 0),
    # forgetting a region nobody knows (404)
    Call("PUT", "/v1/agent/join", r("/v1/agent/join", address="127.0.0.1:1"), "joinResponse"),
    Call("POST", "/v1/agent/join", r("/v1/agent/join", address="127.0.0.1:1"), "joinResponse"),
    Call("PUT", "/v1/agent/force-leave", r("/v1/agent/force-leave", node="types-no-region"),
         None, status=404),
    Call("POST", "/v1/agent/force-leave", r("/v1/agent/force-leave", node="types-no-region"),
         None, status=404),
    Call("GET", "/v1/metrics", r("/v1/metrics"), "MetricsSummary"),
    Call("PUT", "/v1/search", r("/v1/search", {"Prefix": "w", "Context": "all"}),
         "SearchResponse"),
    Call("POST", "/v1/search", r("/v1/search", {"Prefix": "", "Context": "jobs"}),
         "SearchResponse"),
    Call("PUT", "/v1/search/fuzzy", r("/v1/search/fuzzy", {"Text": "we", "Context": "all"}),
         "FuzzySearchResponse"),
    Call("POST", "/v1/search/fuzzy", r("/v1/search/fuzzy", {"Text": "er", "Context": "jobs"}),
         "FuzzySearchResponse"),
    # jobs: reads
    Call("GET", "/v1/jobs", r("/v1/jobs"), "[]JobListStub"),
    Call("GET", "/v1/jobs/statuses", r("/v1/jobs/statuses", namespace="*", include_children="true"),
         "[]JobStatusesJob"),
    Call("POST", "/v1/jobs/statuses",
         r("/v1/jobs/statuses", {"Jobs": [{"ID": "web"}, {"ID": "dispatcher"}]}),
         "[]JobStatusesJob"),
    Call("GET", "/v1/job/{job_id:path}", r("/v1/job/web"), "Job"),
    Call("GET", "/v1/job/{job_id:path}/allocations", r("/v1/job/web/allocations", all="true"),
         "[]AllocationListStub"),
    Call("GET", "/v1/job/{job_id:path}/evaluations", r("/v1/job/too-big/evaluations"),
         "[]Evaluation"),
    Call("GET", "/v1/job/{job_id:path}/versions", r("/v1/job/web/versions", diffs="true"),
         "JobVersionsResponse"),
    Call("GET", "/v1/job/{job_id:path}/summary", r("/v1/job/web/summary"), "JobSummary"),
    Call("GET", "/v1/job/{job_id:path}/submission", r("/v1/job/web/submission", version="0"),
         "JobSubmission"),
    Call("GET", "/v1/job/{job_id:path}/actions", r("/v1/job/web/actions"), "[]jobAction"),
    Call("GET", "/v1/job/{job_id:path}/scale", r("/v1/job/web/scale"), "JobScaleStatusResponse"),
    Call("GET", "/v1/job/{job_id:path}/deployments", r("/v1/job/web/deployments"),
         "[]Deployment"),
    Call("GET", "/v1/job/{job_id:path}/deployment", r("/v1/job/web/deployment"), "*Deployment"),
    Call("GET", "/v1/job/{job_id:path}/services", r("/v1/job/web/services"),
         "[]ServiceRegistration"),
    Call("PUT", "/v1/jobs/parse", r("/v1/jobs/parse", {"JobHCL": WEB_HCL, "Canonicalize": True}),
         "Job"),
    Call("POST", "/v1/jobs/parse", r("/v1/jobs/parse", {"JobHCL": WEB_HCL}), "Job"),
    Call("PUT", "/v1/validate/job", lambda w: Req("/v1/validate/job",
         body={"Job": w.ok("GET", "/v1/job/web")}), "JobValidateResponse"),
    Call("POST", "/v1/validate/job", r("/v1/validate/job", {"Job": batch("types-invalid",
         Priority=-1)}), "JobValidateResponse"),
    Call("PUT", "/v1/job/{job_id:path}/plan",
         lambda w: Req("/v1/job/too-big/plan", body={"Job": w.ok("GET", "/v1/job/too-big"),
                                                      "Diff": True}),
         "JobPlanResponse"),
    Call("POST", "/v1/job/{job_id:path}/plan",
         lambda w: Req("/v1/job/web/plan", body={"Job": web_job(w), "Diff": True}),
         "JobPlanResponse"),
    # allocations, evaluations, deployments: reads
    Call("GET", "/v1/allocations", r("/v1/allocations"), "[]AllocationListStub"),
    Call("GET", "/v1/allocation/{alloc_id}", lambda w: Req(f"/v1/allocation/{w.web_allocs[0]}"),
         "Allocation"),
    Call("GET", "/v1/allocation/{alloc_id}/services",
         lambda w: Req(f"/v1/allocation/{w.web_allocs[0]}/services"), "[]ServiceRegistration"),
    Call("GET", "/v1/client/allocation/{alloc_id}/stats",
         lambda w: Req(f"/v1/client/allocation/{w.web_allocs[0]}/stats"), "AllocResourceUsage"),
    Call("GET", "/v1/client/allocation/{alloc_id}/checks",
         lambda w: Req(f"/v1/client/allocation/{w.web_allocs[0]}/checks"),
         "map[AllocCheckStatus]"),
    Call("GET", "/v1/client/fs/logs/{alloc_id}",
         lambda w: Req(f"/v1/client/fs/logs/{w.batch_alloc}", {"task": "main", "type": "stdout"}),
         "StreamFrame", kind="frames"),
    Call("GET", "/v1/client/stats", lambda w: Req("/v1/client/stats", {"node_id": w.node_id}),
         "HostStats"),
    Call("GET", "/v1/client/fs/ls/{alloc_id}",
         lambda w: Req(f"/v1/client/fs/ls/{w.batch_alloc}", {"path": "/"}), "[]AllocFileInfo"),
    Call("GET", "/v1/client/fs/stat/{alloc_id}",
         lambda w: Req(f"/v1/client/fs/stat/{w.batch_alloc}", {"path": "alloc"}),
         "AllocFileInfo"),
    Call("GET", "/v1/client/fs/cat/{alloc_id}",
         lambda w: Req(f"/v1/client/fs/cat/{w.batch_alloc}",
                       {"path": "alloc/logs/main.stdout.0"}), None, kind="text"),
    Call("GET", "/v1/client/fs/readat/{alloc_id}",
         lambda w: Req(f"/v1/client/fs/readat/{w.batch_alloc}",
                       {"path": "alloc/logs/main.stdout.0", "offset": "0", "limit": "4"}),
         None, kind="text"),
    Call("GET", "/v1/client/fs/stream/{alloc_id}",
         lambda w: Req(f"/v1/client/fs/stream/{w.batch_alloc}",
                       {"path": "alloc/logs/main.stdout.0", "follow": "false"}),
         "StreamFrame", kind="frames"),
    Call("GET", "/v1/evaluations", r("/v1/evaluations"), "[]Evaluation"),
    Call("GET", "/v1/evaluations/count",
         r("/v1/evaluations/count", filter='Status == "complete"'), "EvalCountResponse"),
    Call("GET", "/v1/evaluation/{eval_id}",
         lambda w: Req(f"/v1/evaluation/{w.blocked_eval}", {"related": "true"}), "Evaluation"),
    Call("GET", "/v1/evaluation/{eval_id}/allocations",
         lambda w: Req(f"/v1/evaluation/{w.web_evals[-1]}/allocations"), "[]AllocationListStub"),
    Call("GET", "/v1/deployments", r("/v1/deployments"), "[]Deployment"),
    Call("GET", "/v1/deployment/{deployment_id}",
         lambda w: Req(f"/v1/deployment/{w.canary_deployment}"), "Deployment"),
    Call("GET", "/v1/deployment/allocations/{deployment_id}",
         lambda w: Req(f"/v1/deployment/allocations/{w.canary_deployment}"),
         "[]AllocationListStub"),
    # nodes and pools
    Call("GET", "/v1/nodes", r("/v1/nodes"), "[]NodeListStub"),
    Call("GET", "/v1/node/{node_id}", lambda w: Req(f"/v1/node/{w.node_id}"), "Node"),
    Call("GET", "/v1/node/{node_id}/allocations",
         lambda w: Req(f"/v1/node/{w.node_id}/allocations"), "[]Allocation"),
    Call("GET", "/v1/node/pools", r("/v1/node/pools"), "[]NodePool"),
    Call("GET", "/v1/node/pool/{rest:path}", r("/v1/node/pool/types-pool"), "NodePool"),
    Call("GET", "/v1/node/pool/{rest:path}", r("/v1/node/pool/default/nodes"), "[]NodeListStub"),
    Call("GET", "/v1/node/pool/{rest:path}", r("/v1/node/pool/default/jobs"), "[]JobListStub"),
    Call("PUT", "/v1/node/pools", r("/v1/node/pools", {"Name": "types-pool2"}), None),
    Call("POST", "/v1/node/pools", r("/v1/node/pools", {"Name": "types-pool3"}), None),
    Call("PUT", "/v1/node/pool/{rest:path}",
         r("/v1/node/pool/types-pool2", {"Name": "types-pool2", "Description": "x"}), None),
    Call("POST", "/v1/node/pool/{rest:path}",
         r("/v1/node/pool/types-pool2", {"Name": "types-pool2", "Description": "y"}), None),
    Call("DELETE", "/v1/node/pool/{rest:path}", r("/v1/node/pool/types-pool3"), None),
    # namespaces
    Call("GET", "/v1/namespaces", r("/v1/namespaces"), "[]Namespace"),
    Call("GET", "/v1/namespace/{name:path}", r("/v1/namespace/types-ns"), "Namespace"),
    Call("PUT", "/v1/namespace", r("/v1/namespace", {"Name": "types-ns2"}), None),
    Call("POST", "/v1/namespace", r("/v1/namespace", {"Name": "types-ns3"}), None),
    Call("PUT", "/v1/namespace/{name:path}",
         r("/v1/namespace/types-ns2", {"Name": "types-ns2", "Description": "x"}), None),
    Call("POST", "/v1/namespace/{name:path}",
         r("/v1/namespace/types-ns2", {"Name": "types-ns2", "Description": "y"}), None),
    Call("DELETE", "/v1/namespace/{name:path}", r("/v1/namespace/types-ns3"), None),
    # scaling policies
    Call("GET", "/v1/scaling/policies", r("/v1/scaling/policies"), "[]ScalingPolicyListStub"),
    Call("GET", "/v1/scaling/policy/{policy_id:path}",
         lambda w: Req(f"/v1/scaling/policy/{w.scaling_policy}"), "ScalingPolicy"),
    # services
    Call("GET", "/v1/services", r("/v1/services"), "[]ServiceRegistrationListStub"),
    Call("GET", "/v1/service/{name}", r("/v1/service/web"), "[]ServiceRegistration"),
    # variables and the keyring
    Call("GET", "/v1/vars", r("/v1/vars"), "[]VariableMetadata"),
    Call("GET", "/v1/var/{path:path}", r("/v1/var/types/creds"), "Variable"),
    Call("PUT", "/v1/var/{path:path}", r("/v1/var/types/more", {"Items": {"a": "1"}}),
         "Variable"),
    Call("POST", "/v1/var/{path:path}", r("/v1/var/types/more", {"Items": {"a": "2"}}),
         "Variable"),
    Call("DELETE", "/v1/var/{path:path}", r("/v1/var/types/more"), None, status=204),
    Call("GET", "/v1/operator/keyring/keys", r("/v1/operator/keyring/keys"), "[]RootKeyMeta"),
    # api.Keyring.Rotate decodes struct{ Key *RootKeyMeta }; Delete reads no body
    Call("PUT", "/v1/operator/keyring/rotate", r("/v1/operator/keyring/rotate"),
         "keyringRotateResponse"),
    Call("POST", "/v1/operator/keyring/rotate", r("/v1/operator/keyring/rotate"),
         "keyringRotateResponse"),
    Call("DELETE", "/v1/operator/keyring/key/{key_id}",
         lambda w: Req(f"/v1/operator/keyring/key/{w.made['old_key']}", {"force": "true"}),
         "any"),
    # operator
    Call("GET", "/v1/operator/scheduler/configuration", r("/v1/operator/scheduler/configuration"),
         "SchedulerConfigurationResponse"),
    Call("PUT", "/v1/operator/scheduler/configuration",
         r("/v1/operator/scheduler/configuration",
           {"SchedulerAlgorithm": "binpack", "PreemptionConfig": {"SystemSchedulerEnabled": True}}),
         "SchedulerSetConfigurationResponse"),
    Call("POST", "/v1/operator/scheduler/configuration",
         r("/v1/operator/scheduler/configuration", {"SchedulerAlgorithm": "binpack"}),
         "SchedulerSetConfigurationResponse"),
    # ACL
    Call("GET", "/v1/acl/policies", r("/v1/acl/policies"), "[]ACLPolicyListStub"),
    Call("GET", "/v1/acl/policy/{name}", r("/v1/acl/policy/types-read"), "ACLPolicy"),
    Call("PUT", "/v1/acl/policy/{name}",
         r("/v1/acl/policy/types-two", {"Name": "types-two", "Rules": READ_RULES}), None),
    Call("POST", "/v1/acl/policy/{name}",
         r("/v1/acl/policy/types-two", {"Name": "types-two", "Rules": READ_RULES,
                                         "Description": "d"}), None),
    Call("GET", "/v1/acl/tokens", r("/v1/acl/tokens"), "[]ACLTokenListStub"),
    Call("GET", "/v1/acl/token/self", r("/v1/acl/token/self"), "ACLToken"),
    Call("GET", "/v1/acl/token/{accessor_id}",
         lambda w: Req(f"/v1/acl/token/{w.client_token_accessor}"), "ACLToken"),
    # api.ACLTokens.UpsertOneTimeToken / ExchangeOneTimeToken
    Call("PUT", "/v1/acl/token/onetime", r("/v1/acl/token/onetime"),
         "OneTimeTokenUpsertResponse"),
    Call("POST", "/v1/acl/token/onetime", r("/v1/acl/token/onetime"),
         "OneTimeTokenUpsertResponse"),
    Call("PUT", "/v1/acl/token/onetime/exchange",
         lambda w: Req("/v1/acl/token/onetime/exchange", body=_one_time_secret(w)),
         "OneTimeTokenExchangeResponse"),
    Call("POST", "/v1/acl/token/onetime/exchange",
         lambda w: Req("/v1/acl/token/onetime/exchange", body=_one_time_secret(w)),
         "OneTimeTokenExchangeResponse"),
    # what Nomad's Go client sends for a token without a TTL: "ExpirationTTL": ""
    Call("PUT", "/v1/acl/token",
         r("/v1/acl/token", {"Name": "go", "Type": "client", "Policies": ["types-read"],
                             "Roles": None, "Global": False, "ExpirationTTL": "",
                             "AccessorID": "", "SecretID": "",
                             "CreateTime": "0001-01-01T00:00:00Z",
                             "CreateIndex": 0, "ModifyIndex": 0}),
         "ACLToken"),
    Call("POST", "/v1/acl/token",
         r("/v1/acl/token", {"Name": "go2", "Type": "client", "Policies": ["types-read"],
                             "ExpirationTTL": 3_600_000_000_000}),
         "ACLToken"),
    # api.ACLTokens.Update sends the token as read, changed
    Call("PUT", "/v1/acl/token/{accessor_id}",
         lambda w: Req(f"/v1/acl/token/{w.made['token_to_update']['AccessorID']}",
                       body={**w.made["token_to_update"], "Name": "renamed"}), "ACLToken"),
    Call("POST", "/v1/acl/token/{accessor_id}",
         lambda w: Req(f"/v1/acl/token/{w.made['token_to_update']['AccessorID']}",
                       body={**w.made["token_to_update"], "Type": "management",
                             "Policies": None}), "ACLToken"),
    Call("DELETE", "/v1/acl/token/{accessor_id}",
         lambda w: Req(f"/v1/acl/token/{w.made['token_to_delete']}"), None),
    Call("GET", "/v1/acl/roles", r("/v1/acl/roles"), "[]ACLRoleListStub"),
    Call("GET", "/v1/acl/role/name/{name}", r("/v1/acl/role/name/types-role"), "ACLRole"),
    Call("GET", "/v1/acl/role/{role_id}",
         lambda w: Req(f"/v1/acl/role/{_role(w)['ID']}"), "ACLRole"),
    Call("PUT", "/v1/acl/role",
         r("/v1/acl/role", {"Name": "types-role2", "Policies": [{"Name": "types-read"}]}),
         "ACLRole"),
    Call("POST", "/v1/acl/role",
         r("/v1/acl/role", {"Name": "types-role3", "Policies": [{"Name": "types-read"}]}),
         "ACLRole"),
    Call("PUT", "/v1/acl/role/{role_id}",
         lambda w: Req(f"/v1/acl/role/{_role(w)['ID']}",
                       body={**_role(w), "Description": "changed"}), "ACLRole"),
    Call("POST", "/v1/acl/role/{role_id}",
         lambda w: Req(f"/v1/acl/role/{_role(w)['ID']}",
                       body={**_role(w), "Description": "again"}), "ACLRole"),
    Call("DELETE", "/v1/acl/role/{role_id}",
         lambda w: Req(f"/v1/acl/role/{w.made['role_to_delete']}"), None),
    Call("DELETE", "/v1/acl/policy/{name}", r("/v1/acl/policy/types-two"), None),
    # the event stream (a few lines from the start)
    Call("GET", "/v1/event/stream", r("/v1/event/stream", index="1"), "Events", kind="ndjson"),
    # writes on jobs
    Call("PUT", "/v1/jobs", r("/v1/jobs", {"Job": batch("types-put")}), "JobRegisterResponse"),
    Call("POST", "/v1/jobs", r("/v1/jobs", {"Job": batch("types-post")}), "JobRegisterResponse"),
    Call("PUT", "/v1/job/{job_id:path}",
         r("/v1/job/types-put", {"Job": batch("types-put", Priority=70)}), "JobRegisterResponse"),
    Call("POST", "/v1/job/{job_id:path}",
         r("/v1/job/types-post", {"Job": batch("types-post", Priority=60)}),
         "JobRegisterResponse"),
    Call("PUT", "/v1/job/{job_id:path}/scale",
         r("/v1/job/finished/scale", {"Count": 1, "Target": {"Group": "run"}, "Message": "m"}),
         "JobRegisterResponse"),
    Call("POST", "/v1/job/{job_id:path}/scale",
         r("/v1/job/web/scale", {"Target": {"Group": "web"}, "Message": "event only"}),
         "JobRegisterResponse"),
    Call("PUT", "/v1/job/{job_id:path}/dispatch",
         r("/v1/job/dispatcher/dispatch", {"Meta": {}}), "JobDispatchResponse"),
    Call("POST", "/v1/job/{job_id:path}/dispatch",
         r("/v1/job/dispatcher/dispatch", {"Payload": "aGk="}), "JobDispatchResponse"),
    Call("PUT", "/v1/job/{job_id:path}/dispatch/payload",
         r("/v1/job/dispatcher/dispatch/payload", "a payload"), "JobDispatchResponse"),
    Call("POST", "/v1/job/{job_id:path}/dispatch/payload",
         r("/v1/job/dispatcher/dispatch/payload"), "JobDispatchResponse"),
    Call("PUT", "/v1/job/{job_id:path}/periodic/force", r("/v1/job/nightly/periodic/force"),
         "periodicForceResponse"),
    Call("POST", "/v1/job/{job_id:path}/periodic/force", r("/v1/job/weekly/periodic/force"),
         "periodicForceResponse"),
    Call("PUT", "/v1/job/{job_id:path}/evaluate", r("/v1/job/web/evaluate"),
         "JobRegisterResponse"),
    Call("POST", "/v1/job/{job_id:path}/evaluate",
         r("/v1/job/web/evaluate", {"JobID": "web", "EvalOptions": {"ForceReschedule": True}}),
         "JobRegisterResponse"),
    Call("PUT", "/v1/job/{job_id:path}/stable",
         r("/v1/job/web/stable", {"JobID": "web", "JobVersion": 0, "Stable": True}),
         "JobStabilityResponse"),
    Call("POST", "/v1/job/{job_id:path}/stable",
         r("/v1/job/web/stable", {"JobID": "web", "JobVersion": 0, "Stable": False}),
         "JobStabilityResponse"),
    Call("PUT", "/v1/job/{job_id:path}/versions/{name}/tag",
         r("/v1/job/web/versions/types-golden/tag", {"Version": 0, "Description": "d"}),
         "jobTagResponse"),
    Call("POST", "/v1/job/{job_id:path}/versions/{name}/tag",
         r("/v1/job/web/versions/types-latest/tag", {"Latest": True}), "jobTagResponse"),
    Call("DELETE", "/v1/job/{job_id:path}/versions/{name}/tag",
         r("/v1/job/web/versions/types-golden/tag"), "jobTagResponse"),
    Call("PUT", "/v1/job/{job_id:path}/revert",
         r("/v1/job/types-put/revert", {"JobVersion": 0}), "JobRegisterResponse"),
    Call("POST", "/v1/job/{job_id:path}/revert",
         r("/v1/job/types-post/revert", {"JobVersion": 0}), "JobRegisterResponse"),
    # deployments: actions on the canary deployment
    Call("PUT", "/v1/deployment/pause/{deployment_id}",
         lambda w: Req(f"/v1/deployment/pause/{w.canary_deployment}", body={"Pause": True}),
         "DeploymentUpdateResponse"),
    Call("POST", "/v1/deployment/pause/{deployment_id}",
         lambda w: Req(f"/v1/deployment/pause/{w.canary_deployment}", body={"Pause": False}),
         "DeploymentUpdateResponse"),
    Call("PUT", "/v1/deployment/allocation-health/{deployment_id}",
         lambda w: Req(f"/v1/deployment/allocation-health/{w.canary_deployment}",
                       body={"HealthyAllocationIDs": [w.made["canary"]],
                             "UnhealthyAllocationIDs": None}),
         "DeploymentUpdateResponse"),
    Call("POST", "/v1/deployment/allocation-health/{deployment_id}",
         lambda w: Req(f"/v1/deployment/allocation-health/{w.canary_deployment}",
                       body={"HealthyAllocationIDs": [w.made["canary"]]}),
         "DeploymentUpdateResponse"),
    Call("PUT", "/v1/deployment/promote/{deployment_id}",
         lambda w: Req(f"/v1/deployment/promote/{w.canary_deployment}", body={"All": True}),
         "DeploymentUpdateResponse"),
    Call("POST", "/v1/deployment/promote/{deployment_id}",
         lambda w: Req(f"/v1/deployment/promote/{w.made['deployment']}",
                       body={"Groups": ["web"]}),
         "DeploymentUpdateResponse"),
    Call("PUT", "/v1/deployment/fail/{deployment_id}",
         lambda w: Req(f"/v1/deployment/fail/{w.made['deployment']}"),
         "DeploymentUpdateResponse"),
    Call("POST", "/v1/deployment/fail/{deployment_id}",
         lambda w: Req(f"/v1/deployment/fail/{w.made['deployment']}"),
         "DeploymentUpdateResponse"),
    # nodes: writes
    Call("PUT", "/v1/node/{node_id}/eligibility",
         lambda w: Req(f"/v1/node/{w.node_id}/eligibility", body={"Eligibility": "eligible"}),
         "NodeEligibilityUpdateResponse"),
    Call("POST", "/v1/node/{node_id}/eligibility",
         lambda w: Req(f"/v1/node/{w.node_id}/eligibility", body={"Eligibility": "eligible"}),
         "NodeEligibilityUpdateResponse"),
    Call("PUT", "/v1/node/{node_id}/drain",
         lambda w: Req(f"/v1/node/{w.node_id}/drain",
                       body={"DrainSpec": None, "MarkEligible": True, "Meta": None}),
         "NodeDrainUpdateResponse"),
    Call("POST", "/v1/node/{node_id}/drain",
         lambda w: Req(f"/v1/node/{w.node_id}/drain", body={"DrainSpec": None,
                                                              "MarkEligible": True}),
         "NodeDrainUpdateResponse"),
    Call("PUT", "/v1/node/{node_id}/evaluate",
         lambda w: Req(f"/v1/node/{w.node_id}/evaluate"), "nodeEvaluateAnswer"),
    Call("POST", "/v1/node/{node_id}/evaluate",
         lambda w: Req(f"/v1/node/{w.node_id}/evaluate"), "nodeEvaluateAnswer"),
    # a purge of a node that is not there (the walk's one node stays)
    Call("PUT", "/v1/node/{node_id}/purge", r(f"/v1/node/{uuid.uuid4()}/purge"), None,
         status=404),
    Call("POST", "/v1/node/{node_id}/purge", r(f"/v1/node/{uuid.uuid4()}/purge"), None,
         status=404),
    # signals and restarts at the alloc's agent (api.Allocations.Signal
    # decodes a GenericResponse, Restart an empty struct)
    Call("PUT", "/v1/client/allocation/{alloc_id}/signal",
         lambda w: Req(f"/v1/client/allocation/{w.made['running']}/signal",
                       body={"Signal": "SIGWINCH", "Task": "server"}), "GenericResponse"),
    # (SIGWINCH: the task's http.server ignores it; no Signal would be SIGINT)
    Call("POST", "/v1/client/allocation/{alloc_id}/signal",
         lambda w: Req(f"/v1/client/allocation/{w.made['running']}/signal",
                       body={"Signal": "SIGWINCH"}), "GenericResponse"),
    Call("PUT", "/v1/client/allocation/{alloc_id}/restart",
         lambda w: Req(f"/v1/client/allocation/{w.made['running']}/restart",
                       body={"TaskName": "server"}), "any"),
    Call("POST", "/v1/client/allocation/{alloc_id}/restart",
         lambda w: Req(f"/v1/client/allocation/{w.made['running']}/restart",
                       body={"AllTasks": True}), "any"),
    # a node's dynamic metadata at its agent (api.NodeMeta), and its client GC
    Call("GET", "/v1/client/metadata", lambda w: Req("/v1/client/metadata", {"node_id": w.node_id}),
         "NodeMetaResponse"),
    Call("POST", "/v1/client/metadata", lambda w: Req("/v1/client/metadata",
         body={"NodeID": w.node_id, "Meta": {"types": "1"}}), "NodeMetaResponse"),
    Call("PUT", "/v1/client/metadata", lambda w: Req("/v1/client/metadata",
         body={"NodeID": w.node_id, "Meta": {"types": None}}), "NodeMetaResponse"),
    # a running alloc is not collected
    Call("PUT", "/v1/client/allocation/{alloc_id}/gc",
         lambda w: Req(f"/v1/client/allocation/{w.made['running']}/gc"), None, status=400),
    Call("POST", "/v1/client/allocation/{alloc_id}/gc",
         lambda w: Req(f"/v1/client/allocation/{w.made['running']}/gc"), None, status=400),
    Call("GET", "/v1/client/allocation/{alloc_id}/gc",
         lambda w: Req(f"/v1/client/allocation/{w.batch_alloc}/gc"), None),
    Call("GET", "/v1/client/gc", lambda w: Req("/v1/client/gc", {"node_id": w.node_id}), None),
    Call("PUT", "/v1/client/gc", lambda w: Req("/v1/client/gc", {"node_id": w.node_id}), None),
    Call("POST", "/v1/client/gc", lambda w: Req("/v1/client/gc", {"node_id": w.node_id}), None),
    # the end: stop an alloc, delete a service instance, deregister jobs
    Call("PUT", "/v1/allocation/{alloc_id}/stop",
         lambda w: Req(f"/v1/allocation/{w.batch_alloc}/stop"), "AllocStopResponse"),
    Call("POST", "/v1/allocation/{alloc_id}/stop",
         lambda w: Req(f"/v1/allocation/{w.batch_alloc}/stop"), "AllocStopResponse"),
    Call("DELETE", "/v1/service/{name}/{id}",
         lambda w: Req(f"/v1/service/web/{w.made['service_instance']}"), None),
    Call("DELETE", "/v1/job/{job_id:path}", r("/v1/job/types-put", purge="true"),
         "JobDeregisterResponse"),
    Call("PUT", "/v1/system/reconcile/summaries", r("/v1/system/reconcile/summaries"), None),
    # last: the collector takes the finished jobs and allocs the calls above name
    Call("PUT", "/v1/system/gc", r("/v1/system/gc"), None),
]  # fmt: skip

#: routes of the table that answer no type of Nomad's api package
NOT_WALKED = {
    "/v1/{rest:path}": "the catch-all: 404, 405 or 501 only",
    "/v1/node/{node_id}/{action:path}": "node actions Corral does not serve: 405 or 501 only",
    "/v1/service/{name}/{id}/{rest:path}": "answers only Nomad's 400 invalid URI",
    "/.well-known/jwks.json": "a JWKS (RFC 7517), not a type of Nomad's api package",
    "/.well-known/openid-configuration": "OIDC discovery, not a type of Nomad's api package",
    "/v1/acl/bootstrap": "answers once per cluster (corral dev -acl has bootstrapped it); "
    "the same ACLToken shape as token create",
}


#: writes Nomad answers with neither a body nor an index
NO_INDEX = {
    "/v1/system/gc": "Nomad's force GC answers before anything is written",
    "/v1/client/gc": "a client's GC writes nothing on the servers",
    "/v1/client/allocation/{alloc_id}/gc": "a client's GC writes nothing on the servers",
    "/v1/system/reconcile/summaries": "nothing to rewrite: no write, no index (Nomad sends none)",
}


def _table() -> Iterator[tuple[str, str]]:
    def walk(table: list[Any], prefix: str) -> Iterator[tuple[str, str]]:
        for route in table:
            if isinstance(route, Mount) and route.routes:
                yield from walk(list(route.routes), prefix + route.path)
            elif isinstance(route, Route | Mount):
                for method in sorted(authz.needs_of(route)):
                    if method != "HEAD":
                        yield method, prefix + route.path

    yield from walk(app.routes(), "")


def test_every_route_is_walked() -> None:
    walked = {(c.method, c.template) for c in CALLS}
    missing = [
        f"{m} {t}"
        for m, t in _table()
        if (m, t) not in walked and t not in NOT_WALKED and not t.startswith("/ui")
    ]
    assert not missing, f"routes without a call in CALLS: {missing}"
    stale = [c.id for c in CALLS if (c.method, c.template) not in set(_table())]
    assert not stale, f"calls of routes the table no longer has: {stale}"


def _prepare(world: World, call: Call) -> None:
    """Objects a destructive call acts on, made just before it."""
    if call.template == "/v1/operator/keyring/key/{key_id}":
        active = [k for k in world.ok("GET", "/v1/operator/keyring/keys") if k["State"] == "active"]
        world.ok("PUT", "/v1/operator/keyring/rotate")
        world.made["old_key"] = active[0]["KeyID"]
    elif call.template == "/v1/acl/token/{accessor_id}" and call.method in ("PUT", "POST"):
        made = world.ok(
            "PUT",
            "/v1/acl/token",
            body={"Name": "upd", "Type": "client", "Policies": ["types-read"],
                  "ExpirationTTL": "1h"},
        )  # fmt: skip
        world.made["token_to_update"] = world.ok("GET", f"/v1/acl/token/{made['AccessorID']}")
    elif call.template == "/v1/acl/token/{accessor_id}" and call.method == "DELETE":
        made = world.ok(
            "PUT",
            "/v1/acl/token",
            body={"Name": "bye", "Type": "client", "Policies": ["types-read"]},
        )
        world.made["token_to_delete"] = made["AccessorID"]
    elif call.template == "/v1/acl/role/{role_id}" and call.method == "DELETE":
        made = world.ok(
            "PUT", "/v1/acl/role", body={"Name": "types-bye", "Policies": [{"Name": "types-read"}]}
        )
        world.made["role_to_delete"] = made["ID"]
    elif call.template == "/v1/deployment/allocation-health/{deployment_id}":
        d = world.ok("GET", f"/v1/deployment/{world.canary_deployment}")
        world.made["canary"] = d["TaskGroups"]["web"]["PlacedCanaries"][0]
    elif call.template.startswith(("/v1/deployment/promote/", "/v1/deployment/fail/")):
        if call.method == "POST" or "fail" in call.template:
            world.made["deployment"] = _new_deployment(world, healthy="promote" in call.template)
    elif call.template.endswith(("/signal", "/restart")) or (
        call.template.endswith("{alloc_id}/gc") and call.method != "GET"
    ):
        # the deployments replaced web's first allocs: one running now
        world.made["running"] = wait_for(
            "a running web alloc",
            lambda: next(
                (
                    a["ID"]
                    for a in world.ok("GET", "/v1/job/web/allocations")
                    if a["ClientStatus"] == "running"
                    and a["DesiredStatus"] == "run"
                    and a["TaskStates"]["server"]["State"] == "running"
                ),
                None,
            ),
            timeout=60,
        )
    elif call.template == "/v1/service/{name}/{id}":
        world.made["service_instance"] = world.ok("GET", "/v1/service/web")[0]["ID"]


def _new_deployment(world: World, *, healthy: bool) -> str:
    """A new version of web and its deployment's id, once it runs (and,
    with `healthy`, once its canary is healthy)."""
    job = web_job(world)
    job["TaskGroups"][0]["Tasks"][0]["Env"]["VERSION"] = uuid.uuid4().hex[:8]
    version = world.ok("PUT", "/v1/jobs", body={"Job": job})
    del version

    def ready() -> Any:
        d = world.ok("GET", "/v1/job/web/deployment") or {}
        if d.get("JobVersion") != job["Version"] + 1 or d.get("Status") != "running":
            return None
        return d if not healthy or d["TaskGroups"]["web"]["HealthyAllocs"] else None

    return str(wait_for("the new version's deployment", ready, timeout=120)["ID"])


def _read_stream(world: World, req: Req, lines: int) -> list[Any]:
    """The first `lines` JSON values of a streamed answer."""
    resp = world.http.session.get(
        world.http.url + req.path,
        params=req.params,
        headers={"X-Nomad-Token": world.token},
        stream=True,
        timeout=60,
    )
    try:
        assert resp.status_code == 200, resp.text
        out: list[Any] = []
        decoder = json.JSONDecoder()
        buf = ""
        for chunk in resp.iter_content(chunk_size=None):
            buf += chunk.decode() if isinstance(chunk, bytes) else chunk
            while buf.strip():
                buf = buf.lstrip()
                try:
                    value, end = decoder.raw_decode(buf)
                except json.JSONDecodeError:
                    break
                out.append(value)
                buf = buf[end:]
            if len(out) >= lines:
                break
        return out
    finally:
        resp.close()


def _events_payload_problems(events: Any) -> list[str]:
    """Each event's payload as the api's Event methods decode it."""
    kinds = {
        "Job": "Job",
        "Evaluation": "Evaluation",
        "Allocation": "Allocation",
        "Deployment": "Deployment",
        "Node": "Node",
        "NodePool": "NodePool",
        "Service": "ServiceRegistration",
        "JobSummary": "JobSummary",
    }
    out = []
    for i, event in enumerate(events.get("Events") or []):
        for key, value in (event.get("Payload") or {}).items():
            if key in kinds:
                out += [str(p) for p in check(value, kinds[key], f"$.Events[{i}].Payload.{key}")]
    return out


@pytest.mark.parametrize("call", CALLS, ids=[c.id for c in CALLS])
def test_route_answers_nomad_types(world: World, call: Call) -> None:
    _prepare(world, call)
    req = call.build(world)
    if call.kind == "ndjson":
        values = [v for v in _read_stream(world, req, 3) if v]
        assert values, "the stream wrote nothing"
        problems = []
        for v in values:
            problems += [str(p) for p in check(v, call.type or "any")]
            problems += _events_payload_problems(v)
        assert not problems, "\n".join(problems)
        return
    if call.kind == "frames":
        frames = _read_stream(world, req, 1)
        assert frames, "no log frame"
        problems = [str(p) for f in frames for p in check(f, call.type or "any")]
        assert not problems, "\n".join(problems)
        return
    answer = world.call(call.method, req.path, params=req.params, body=req.body)
    assert answer.status == call.status, f"{call.id}: {answer.status} {answer.text}"
    if call.status >= 300:
        return
    if call.kind == "text":  # a file's bytes, as Nomad's
        assert answer.text, f"{call.id}: an empty body"
        return
    if call.type is None:
        assert answer.text in ("", "null"), answer.text
        indexed = int(answer.headers.get("x-nomad-index", "0")) > 0
        assert indexed or answer.status == 204 or call.template in NO_INDEX
        return
    problems = [str(p) for p in check(json.loads(answer.text), call.type)]
    assert not problems, "\n".join(problems)


# the anonymous structs api functions decode answers into, with the Index
# Nomad's servers send beside (structs.KeyringRotateRootKeyResponse and
# structs.PeriodicForceResponse embed WriteMeta)
local_structs(
    keyringRotateResponse={"Key": "*RootKeyMeta", "Index": "int"},
    # no api function reads /v1/job/:id/actions: Nomad's server sends
    # []*structs.JobAction (Action's fields, then the task's and group's names)
    jobAction={
        "Name": "string",
        "Command": "string",
        "Args": "[]string",
        "TaskName": "string",
        "TaskGroupName": "string",
    },
    periodicForceResponse={"EvalID": "string", "EvalCreateIndex": "int", "Index": "int"},
    # the api's TagVersion decodes no answer: Nomad's server sends
    # structs.JobTagResponse (its QueryMeta in the body)
    jobTagResponse={
        "Name": "string",
        "Description": "string",
        "TaggedTime": "int",
        "Index": "int",
        "LastContact": "int",
        "KnownLeader": "bool",
        "NextToken": "string",
    },
    # api.Nodes.ForceEvaluate decodes nodeEvalResponse{EvalID}; Nomad's server
    # sends structs.NodeUpdateResponse (EvalIDs, ...): Corral sends both
    nodeEvaluateAnswer={
        "EvalID": "string",
        "EvalIDs": "[]string",
        "EvalCreateIndex": "int",
        "NodeModifyIndex": "int",
        "Index": "int",
    },
)

#: fields Corral adds to Nomad's structs, each documented in docs/http-api.md
EXTRA.update(
    {
        "ServiceRegistration": {
            "Meta": "the service's meta, kept with each instance (docs/services.md)"
        },
    }
)
