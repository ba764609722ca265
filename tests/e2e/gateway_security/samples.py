"""One valid request per route and method of the gateway's route table,
naming the seeded objects (conftest.py), with a body that passes the
route's validation: the route authorization test sends each with tokens of
every kind, the HTTP fuzz test mutates them. A route added to the table
without a sample here fails test_authz_routes.py's
`test_every_route_has_a_sample`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import Mount, Route

from services.gateway import app, authz
from tests.e2e.gateway_security.conftest import Cluster, Objects, service_job
from tests.wait import wait_for


@dataclass
class Sample:
    """One request to a route: its path, the namespace its objects live in
    (where capabilities are granted), query and body."""

    path: str
    namespace: str = "default"
    params: dict[str, str] = field(default_factory=dict)
    body: Any = None
    stream: bool = False
    #: the node pool the request acts on (where node_pool rules are granted)
    pool: str = "default"


def routes() -> Iterator[tuple[str, str, authz.Need]]:
    """(method, path template, need) of every route (HEAD is GET's)."""

    def walk(table: list[Any], prefix: str) -> Iterator[tuple[str, str, authz.Need]]:
        for route in table:
            if isinstance(route, Mount) and route.routes:
                yield from walk(list(route.routes), prefix + route.path)
            elif isinstance(route, Route | Mount):
                for method, need in sorted(authz.needs_of(route).items()):
                    if method != "HEAD":
                        yield method, prefix + route.path, need

    yield from walk(app.routes(), "")


def job_json(cluster: Cluster) -> Any:
    return service_job(cluster.default.job_id, "default")


def samples(cluster: Cluster) -> dict[str, Callable[[str], Sample]]:
    d, a = cluster.default, cluster.team_a
    missing_job = f"no-such-job-{uuid.uuid4().hex[:6]}"
    parse_body = {"JobHCL": 'job "p" {\n group "g" {\n task "t" { driver = "mock" }\n }\n}\n'}
    scheduler = cluster.http.ok(
        "GET", "/v1/operator/scheduler/configuration", token=cluster.management
    )["SchedulerConfig"]

    def const(sample: Sample) -> Callable[[str], Sample]:
        return lambda method: sample

    def job_path(suffix: str, job: str = d.job_id, body: Any = None, **params: str) -> Any:
        return const(Sample(f"/v1/job/{job}{suffix}", params=params, body=body))

    def running_alloc(objects: Objects) -> str:
        """The job's alloc running on the agent now: the stop sample stops
        the first one and `/v1/client/gc` then destroys it on the agent,
        where a refused token would meet "not on this node" first."""
        q = {"namespace": objects.namespace}
        path = f"/v1/job/{objects.job_id}/allocations"
        return str(
            wait_for(
                f"a running alloc of {objects.job_id}",
                lambda: next(
                    (
                        a["ID"]
                        for a in cluster.http.ok("GET", path, token=cluster.management, params=q)
                        if a["ClientStatus"] == "running"
                    ),
                    None,
                ),
                timeout=60,
            )
        )

    def at_running_alloc(objects: Objects, suffix: str, body: Any = None) -> Any:
        return lambda method: Sample(
            f"/v1/client/allocation/{running_alloc(objects)}/{suffix}",
            namespace=objects.namespace,
            body=body,
        )

    def objects_path(prefix: str, objects: Objects, kind: str, suffix: str = "") -> Any:
        ident = getattr(objects, f"{kind}_ids")[0]
        params = {"namespace": objects.namespace}
        return const(Sample(f"{prefix}{ident}{suffix}", namespace=objects.namespace, params=params))

    def job(method: str) -> Sample:
        if method == "DELETE":  # the rule decides before the job is looked up
            return Sample(f"/v1/job/{missing_job}")
        return Sample(f"/v1/job/{d.job_id}", body=job_json(cluster))

    def policy(method: str) -> Sample:
        if method == "DELETE":
            return Sample("/v1/acl/policy/no-such-policy")
        rules = 'namespace "zz" { policy = "read" }'
        return Sample(
            "/v1/acl/policy/gw-authz-probe", body={"Name": "gw-authz-probe", "Rules": rules}
        )

    def namespace(method: str) -> Sample:
        if method == "DELETE":
            return Sample("/v1/namespace/no-such-namespace")  # a management token's
        body = {"Name": a.namespace, "Description": "team a"} if method != "GET" else None
        return Sample(f"/v1/namespace/{a.namespace}", namespace=a.namespace, body=body)

    def pools(method: str) -> Sample:
        if method == "GET":
            return Sample("/v1/node/pools")
        return Sample("/v1/node/pools", body={"Name": "gw-probe-pool"}, pool="gw-probe-pool")

    def pool(method: str) -> Sample:
        if method == "GET":
            return Sample("/v1/node/pool/default")
        if method == "DELETE":
            return Sample("/v1/node/pool/gw-no-such-pool", pool="gw-no-such-pool")
        body = {"Name": "gw-probe-pool", "Description": "probe"}
        return Sample("/v1/node/pool/gw-probe-pool", body=body, pool="gw-probe-pool")

    def variable(method: str) -> Sample:
        body = {"Items": {"k": "v"}} if method in ("PUT", "POST") else None
        return Sample("/v1/var/gw/probe", body=body)

    policies = cluster.http.ok(
        "GET", "/v1/scaling/policies", token=cluster.management, params={"job": d.job_id}
    )

    def token(method: str) -> Sample:
        if method == "GET":
            listed = cluster.http.ok("GET", "/v1/acl/tokens", token=cluster.management)
            return Sample(f"/v1/acl/token/{listed[0]['AccessorID']}")
        accessor = str(uuid.uuid4())  # none: the state decides (403) before it looks
        return Sample(f"/v1/acl/token/{accessor}", body={"AccessorID": accessor, "Name": "x"})

    role_id = str(uuid.uuid4())  # none: a management token reads 404, writes 400

    def exchange(method: str) -> Sample:
        """A fresh one-time secret each time (one exchanges once)."""
        made = cluster.http.ok("PUT", "/v1/acl/token/onetime", token=cluster.management)
        body = {"OneTimeSecretID": made["OneTimeToken"]["OneTimeSecretID"]}
        return Sample("/v1/acl/token/onetime/exchange", body=body)

    def role(method: str) -> Sample:
        body = {"ID": role_id, "Name": "gw-probe-role", "Policies": [{"Name": "gw-authz-probe"}]}
        return Sample(f"/v1/acl/role/{role_id}", body=body if method in ("PUT", "POST") else None)

    return {
        "/v1/agent/health": const(Sample("/v1/agent/health")),
        "/v1/status/leader": const(Sample("/v1/status/leader")),
        "/v1/status/peers": const(Sample("/v1/status/peers")),
        "/v1/regions": const(Sample("/v1/regions")),
        "/v1/agent/self": const(Sample("/v1/agent/self")),
        # the federation: the state servers of every region; joining an
        # address that refuses (200 with num_joined 0) and forgetting a region
        # nobody knows (404)
        "/v1/agent/members": const(Sample("/v1/agent/members")),
        "/v1/agent/join": const(Sample("/v1/agent/join", params={"address": "127.0.0.1:1"})),
        "/v1/agent/force-leave": const(
            Sample("/v1/agent/force-leave", params={"node": "gw-no-such-region"})
        ),
        "/v1/metrics": const(Sample("/v1/metrics")),
        "/v1/system/gc": const(Sample("/v1/system/gc")),
        "/v1/search": const(Sample("/v1/search", body={"Prefix": d.job_id[:3], "Context": "jobs"})),
        "/v1/search/fuzzy": const(
            Sample("/v1/search/fuzzy", body={"Text": d.job_id[:3], "Context": "jobs"})
        ),
        "/v1/job/{job_id:path}/revert": job_path("/revert", body={"JobVersion": 0}),
        "/v1/job/{job_id:path}/evaluate": job_path("/evaluate"),
        "/v1/job/{job_id:path}/stable": job_path(
            "/stable", body={"JobID": d.job_id, "JobVersion": 0, "Stable": True}
        ),
        "/v1/jobs": lambda m: Sample("/v1/jobs", body=job_json(cluster) if m != "GET" else None),
        "/v1/job/{job_id:path}/plan": job_path("/plan", body=job_json(cluster)),
        "/v1/job/{job_id:path}/allocations": job_path("/allocations"),
        "/v1/job/{job_id:path}/evaluations": job_path("/evaluations"),
        "/v1/job/{job_id:path}/versions": job_path("/versions"),
        "/v1/job/{job_id:path}/summary": job_path("/summary"),
        "/v1/job/{job_id:path}/submission": job_path("/submission", version="0"),
        "/v1/job/{job_id:path}/actions": job_path("/actions"),
        "/v1/job/{job_id:path}/scale": lambda m: Sample(
            f"/v1/job/{d.job_id}/scale",
            body=None if m == "GET" else {"Count": 1, "Target": {"Group": "web"}},
        ),
        "/v1/job/{job_id:path}/dispatch": job_path("/dispatch", cluster.dispatch_job, body={}),
        "/v1/job/{job_id:path}/dispatch/payload": job_path(
            "/dispatch/payload", cluster.dispatch_job, body="a payload"
        ),
        "/v1/job/{job_id:path}/versions/{name}/tag": lambda m: Sample(
            f"/v1/job/{d.job_id}/versions/gw-probe-tag/tag",
            body=None if m == "DELETE" else {"Version": 0, "Description": "probe"},
        ),
        "/v1/jobs/statuses": lambda m: Sample(
            "/v1/jobs/statuses",
            body=None if m == "GET" else {"Jobs": [{"ID": d.job_id, "Namespace": "default"}]},
        ),
        "/v1/system/reconcile/summaries": const(Sample("/v1/system/reconcile/summaries")),
        "/v1/job/{job_id:path}/periodic/force": job_path("/periodic/force", cluster.periodic_job),
        "/v1/allocations": const(Sample("/v1/allocations")),
        "/v1/evaluations/count": const(Sample("/v1/evaluations/count")),
        # a write: on team-a's alloc (the audit ran before), granted there
        "/v1/allocation/{alloc_id}/stop": objects_path("/v1/allocation/", a, "alloc", "/stop"),
        "/v1/allocation/{alloc_id}": objects_path("/v1/allocation/", d, "alloc"),
        "/v1/client/allocation/{alloc_id}/stats": const(
            Sample(f"/v1/client/allocation/{d.alloc_ids[0]}/stats")
        ),
        # writes: on team-a's alloc running now (the audit ran before), granted there
        "/v1/client/allocation/{alloc_id}/signal": at_running_alloc(
            a, "signal", {"Signal": "SIGUSR1"}
        ),
        "/v1/client/allocation/{alloc_id}/restart": at_running_alloc(
            a, "restart", {"AllTasks": True}
        ),
        "/v1/client/stats": const(Sample("/v1/client/stats", params={"node_id": cluster.node_id})),
        "/v1/client/metadata": lambda m: Sample(
            "/v1/client/metadata",
            params={"node_id": cluster.node_id},
            body=None if m == "GET" else {"Meta": {"sample": "1"}},
        ),
        # finished allocs of the node are destroyed on its agent (the servers keep them)
        "/v1/client/gc": const(Sample("/v1/client/gc", params={"node_id": cluster.node_id})),
        # a write on team-a's alloc, granted there (running: refused with 400)
        "/v1/client/allocation/{alloc_id}/gc": at_running_alloc(a, "gc"),
        "/v1/services": const(Sample("/v1/services")),
        "/v1/service/{name}": const(Sample("/v1/service/web")),
        "/v1/service/{name}/{id}": const(Sample("/v1/service/web/no-such-instance")),
        "/v1/service/{name}/{id}/{rest:path}": const(Sample("/v1/service/web/x/y")),
        "/v1/job/{job_id:path}/services": job_path("/services"),
        "/v1/allocation/{alloc_id}/services": objects_path(
            "/v1/allocation/", d, "alloc", "/services"
        ),
        "/v1/client/allocation/{alloc_id}/checks": const(
            Sample(f"/v1/client/allocation/{d.alloc_ids[0]}/checks")
        ),
        "/v1/vars": const(Sample("/v1/vars")),
        "/v1/var/{path:path}": variable,
        "/v1/operator/keyring/keys": const(Sample("/v1/operator/keyring/keys")),
        "/v1/operator/keyring/rotate": const(Sample("/v1/operator/keyring/rotate")),
        "/v1/operator/keyring/key/{key_id}": const(Sample("/v1/operator/keyring/key/no-such-key")),
        "/.well-known/jwks.json": const(Sample("/.well-known/jwks.json")),
        "/.well-known/openid-configuration": const(Sample("/.well-known/openid-configuration")),
        "/v1/namespaces": const(Sample("/v1/namespaces")),
        "/v1/namespace": const(Sample("/v1/namespace", body={"Name": "gw-probe-namespace"})),
        "/v1/namespace/{name:path}": namespace,
        "/v1/node/pools": pools,
        "/v1/node/pool/{rest:path}": pool,
        "/v1/scaling/policies": const(Sample("/v1/scaling/policies")),
        "/v1/scaling/policy/{policy_id:path}": const(
            Sample(f"/v1/scaling/policy/{policies[0]['ID']}")
        ),
        **{
            f"/v1/client/fs/{kind}/{{alloc_id}}": const(
                Sample(f"/v1/client/fs/{kind}/{d.alloc_ids[0]}", params=params)
            )
            for kind, params in (
                ("ls", {"path": "/"}),
                ("stat", {"path": "alloc"}),
                ("cat", {"path": f"alloc/logs/{d.task}.stdout.0"}),
                ("readat", {"path": f"alloc/logs/{d.task}.stdout.0", "offset": "0", "limit": "4"}),
                ("stream", {"path": f"alloc/logs/{d.task}.stdout.0", "follow": "false"}),
            )
        },
        "/v1/client/fs/logs/{alloc_id}": const(
            Sample(
                f"/v1/client/fs/logs/{d.alloc_ids[0]}",
                params={"task": d.task, "type": "stdout", "plain": "true"},
            )
        ),
        "/v1/evaluations": const(Sample("/v1/evaluations")),
        "/v1/evaluation/{eval_id}/allocations": objects_path(
            "/v1/evaluation/", d, "eval", "/allocations"
        ),
        "/v1/evaluation/{eval_id}": objects_path("/v1/evaluation/", d, "eval"),
        "/v1/nodes": const(Sample("/v1/nodes")),
        "/v1/node/{node_id}/allocations": const(Sample(f"/v1/node/{cluster.node_id}/allocations")),
        "/v1/node/{node_id}/drain": const(
            Sample(f"/v1/node/{cluster.node_id}/drain", body={"DrainSpec": None})
        ),
        "/v1/node/{node_id}/eligibility": const(
            Sample(f"/v1/node/{cluster.node_id}/eligibility", body={"Eligibility": "eligible"})
        ),
        "/v1/node/{node_id}": const(Sample(f"/v1/node/{cluster.node_id}")),
        "/v1/node/{node_id}/{action:path}": const(Sample(f"/v1/node/{cluster.node_id}/meta")),
        # not the cluster's one node: an allowed purge would remove it
        "/v1/node/{node_id}/purge": const(Sample(f"/v1/node/{uuid.uuid4()}/purge")),
        "/v1/node/{node_id}/evaluate": const(Sample(f"/v1/node/{cluster.node_id}/evaluate")),
        "/v1/operator/scheduler/configuration": lambda m: Sample(
            "/v1/operator/scheduler/configuration", body=None if m == "GET" else scheduler
        ),
        # PUT/POST without a body: refused (400) before the state changes;
        # a real archive would replace the cluster's state mid-test
        "/v1/operator/snapshot": const(Sample("/v1/operator/snapshot")),
        "/v1/deployments": const(Sample("/v1/deployments")),
        "/v1/deployment/allocations/{deployment_id}": objects_path(
            "/v1/deployment/allocations/", d, "deployment"
        ),
        # writes: on team-a's deployment
        "/v1/deployment/promote/{deployment_id}": objects_path(
            "/v1/deployment/promote/", a, "deployment"
        ),
        "/v1/deployment/fail/{deployment_id}": objects_path(
            "/v1/deployment/fail/", a, "deployment"
        ),
        "/v1/deployment/pause/{deployment_id}": objects_path(
            "/v1/deployment/pause/", a, "deployment"
        ),
        "/v1/deployment/allocation-health/{deployment_id}": objects_path(
            "/v1/deployment/allocation-health/", a, "deployment"
        ),
        "/v1/deployment/{deployment_id}": objects_path("/v1/deployment/", d, "deployment"),
        "/v1/job/{job_id:path}/deployments": job_path("/deployments"),
        "/v1/job/{job_id:path}/deployment": job_path("/deployment"),
        "/v1/acl/bootstrap": const(Sample("/v1/acl/bootstrap")),
        "/v1/acl/policies": const(Sample("/v1/acl/policies")),
        "/v1/acl/policy/{name}": policy,
        "/v1/acl/tokens": const(Sample("/v1/acl/tokens")),
        "/v1/acl/token": const(
            Sample("/v1/acl/token", body={"Name": "probe", "Type": "client", "Policies": []})
        ),
        "/v1/acl/token/self": const(Sample("/v1/acl/token/self")),
        "/v1/acl/token/onetime": const(Sample("/v1/acl/token/onetime")),
        "/v1/acl/token/onetime/exchange": exchange,
        "/v1/acl/roles": const(Sample("/v1/acl/roles")),
        "/v1/acl/role": const(
            Sample(
                "/v1/acl/role",
                body={"Name": "gw-probe-role", "Policies": [{"Name": "gw-authz-probe"}]},
            )
        ),
        "/v1/acl/role/name/{name}": const(Sample("/v1/acl/role/name/gw-probe-role")),
        "/v1/acl/role/{role_id}": role,
        "/v1/acl/token/{accessor_id}": token,
        "/v1/event/stream": const(Sample("/v1/event/stream", params={"topic": "Job"}, stream=True)),
        "/v1/jobs/parse": const(Sample("/v1/jobs/parse", body=parse_body)),
        "/v1/validate/job": const(
            Sample("/v1/validate/job", namespace=a.namespace, body=service_job("v", a.namespace))
        ),
        "/ui/": const(Sample("/ui/")),
        "/ui/jobs": const(Sample("/ui/jobs")),
        "/ui/jobs/{job_id:path}": const(Sample(f"/ui/jobs/{d.job_id}")),
        "/ui/allocations/{alloc_id}": const(Sample(f"/ui/allocations/{d.alloc_ids[0]}")),
        "/ui/evaluations": const(Sample("/ui/evaluations")),
        "/ui/evaluations/{eval_id}": const(Sample(f"/ui/evaluations/{d.eval_ids[0]}")),
        "/ui/services": const(Sample("/ui/services")),
        "/ui/nodes": const(Sample("/ui/nodes")),
        "/ui/nodes/{node_id}": const(Sample(f"/ui/nodes/{cluster.node_id}")),
        "/ui/allocations": const(Sample("/ui/allocations")),
        "/ui/clients": const(Sample("/ui/clients")),
        "/ui/topology": const(Sample("/ui/topology")),
        "/ui/deployments": const(Sample("/ui/deployments")),
        "/ui/servers": const(Sample("/ui/servers")),
        "/ui/api/overview": const(Sample("/ui/api/overview")),
        "/ui/api/cluster": const(Sample("/ui/api/cluster")),
        "/ui/api/topology": const(Sample("/ui/api/topology")),
        "/ui/api/members": const(Sample("/ui/api/members")),
        "/ui/api/capabilities": const(Sample("/ui/api/capabilities")),
        "/ui/api/evaluation/{eval_id}/journey": objects_path(
            "/ui/api/evaluation/", d, "eval", "/journey"
        ),
        "/ui/static": const(Sample("/ui/static/app.js")),
        "/ui/{rest:path}": const(Sample("/ui/no-such-page")),
        "/v1/job/{job_id:path}": job,
        "/v1/{rest:path}": const(Sample("/v1/no-such-endpoint")),
    }
