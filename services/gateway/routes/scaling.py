"""/v1/scaling/policies (`?job=`, `?type=`) and /v1/scaling/policy/:id
(Nomad's command/agent/scaling_endpoint.go) over the Scaling service: what
nomad-autoscaler's Nomad policy source reads."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import query_pb2, scaling_pb2
from services.gateway.authz import ApiRoute, Need
from services.gateway.http import QueryOptions, backend_of, listing, respond
from services.gateway.mapping import scaling as scaling_map


async def policies(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    job = request.query_params.get("job", "")
    kind = request.query_params.get("type", "")

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend_of(request).scaling.ListPolicies(
            scaling_pb2.ScalingPolicyListRequest(query=query, job=job, type=kind),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return [scaling_map.policy_stub(p) for p in resp.policies], resp.meta

    return await listing(request, q, fetch)


async def policy(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).scaling.GetPolicy(
        scaling_pb2.ScalingPolicyGetRequest(
            id=request.path_params["policy_id"], query=q.proto(paginate=False)
        ),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, scaling_map.policy(resp.policy), index=resp.meta.index)


#: Nomad's: list-scaling-policies (read-scaling-policy for one), or both
#: list-jobs and read-job, in the namespace (the policy's, for one)
LIST_POLICIES = Need(
    summary="`list-scaling-policies`, or `list-jobs` and `read-job`, in the namespace",
    namespace=(("list-scaling-policies", "list-jobs"), ("list-scaling-policies", "read-job")),
    filters=True,
)
READ_POLICY = Need(
    summary="`read-scaling-policy`, or `list-jobs` and `read-job`, in the policy's namespace",
    namespace=(("read-scaling-policy", "list-jobs"), ("read-scaling-policy", "read-job")),
    per_object=True,
)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/scaling/policies", policies, {"GET": LIST_POLICIES}),
    ApiRoute("/v1/scaling/policy/{policy_id:path}", policy, {"GET": READ_POLICY}),
]
