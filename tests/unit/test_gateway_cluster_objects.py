"""The gateway's namespace, node pool and scaling mappings: our protos as
Nomad's JSON (api.Namespace, api.NodePool, api.ScalingPolicy and its list
stub, api.JobScaleStatusResponse) and Nomad's request bodies as our
requests, bad ones named in Nomad's words."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf.struct_pb2 import Struct

from corral.domain import object_specs
from corral.v1 import job_pb2, scaling_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping import namespaces, nodes, scaling
from services.gateway.routes import unserved


def test_namespace_round_trip() -> None:
    ns = pb.Namespace(
        name="ml",
        description="ML",
        meta={"team": "a"},
        node_pool_config=pb.NamespaceNodePoolConfiguration(
            default="gpu", allowed=pb.StringList(values=["gpu-*"])
        ),
        capabilities=pb.NamespaceCapabilities(disabled_task_drivers=["raw_exec"]),
        create_index=3,
        modify_index=4,
    )
    out = namespaces.namespace(ns)
    assert out["NodePoolConfiguration"] == {"Default": "gpu", "Allowed": ["gpu-*"], "Denied": None}
    assert out["Capabilities"]["DisabledTaskDrivers"] == ["raw_exec"]
    assert out["Capabilities"]["EnabledTaskDrivers"] is None
    assert (out["Quota"], out["VaultConfiguration"], out["Meta"]) == ("", None, {"team": "a"})
    back = object_specs.namespace_from_nomad(json.loads(json.dumps(out)))
    back.create_index, back.modify_index = 3, 4
    assert back == ns
    plain = namespaces.namespace(pb.Namespace(name="default"))
    assert plain["NodePoolConfiguration"] is None and plain["Meta"] is None


def test_node_pool_round_trip() -> None:
    pool = pb.NodePool(
        name="gpu",
        description="GPUs",
        scheduler_config=pb.NodePoolSchedulerConfiguration(scheduler_algorithm="spread"),
    )
    out = nodes.node_pool(pool)
    assert out["SchedulerConfiguration"] == {
        "SchedulerAlgorithm": "spread",
        "MemoryOversubscriptionEnabled": None,
    }
    assert object_specs.node_pool_from_nomad(json.loads(json.dumps(out))) == pool


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"Name": "a", "Quota": "q"}, "Quota: namespace quotas are not supported by Corral"),
        ({"Name": "a", "VaultConfiguration": {"Default": "x"}}, "Vault clusters"),
        ({"Name": "a", "Meta": {"k": 1}}, "Meta must be an object of strings"),
        ({"Name": "a", "NodePoolConfiguration": {"Allowed": "gpu"}}, "Allowed must be a list"),
        ({"Name": 3}, "Name must be a string"),
    ],
)
def test_bad_namespace_bodies(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        object_specs.namespace_from_nomad(body)


def test_node_pool_body_refuses_what_corral_lacks() -> None:
    with pytest.raises(ValueError, match="node identity TTLs are not supported"):
        object_specs.node_pool_from_nomad({"Name": "a", "NodeIdentityTTL": "1h"})
    # Nomad's JSON lists every field: empty ones pass
    assert object_specs.node_pool_from_nomad({"name": "a", "NodeIdentityTTL": 0}).name == "a"


def test_scaling_policy_shapes() -> None:
    p = pb.ScalingPolicy(
        id="p1",
        type="horizontal",
        target={"Namespace": "default", "Job": "web", "Group": "web"},
        min=1,
        max=5,
        enabled=True,
        create_index=7,
        modify_index=8,
    )
    p.policy.update({"cooldown": "1m", "check": [{"c": [{"target": 70}]}]})
    out = scaling.policy(p)
    assert out["ID"] == "p1" and (out["Min"], out["Max"], out["Enabled"]) == (1, 5, True)
    assert out["Policy"] == {"cooldown": "1m", "check": [{"c": [{"target": 70}]}]}
    stub = scaling.policy_stub(
        scaling_pb2.ScalingPolicyListStub(id="p1", enabled=True, type="horizontal", target=p.target)
    )
    assert set(stub) == {"ID", "Enabled", "Type", "Target", "CreateIndex", "ModifyIndex"}


def test_scale_status_shape() -> None:
    status = job_pb2.JobScaleStatusResponse(job_id="web", namespace="default", job_stopped=False)
    web = status.task_groups["web"]
    web.desired, web.placed, web.running = 3, 3, 2
    meta = Struct()
    meta.update({"reason": "cpu"})
    web.events.add(time=5, count=3, previous_count=2, message="up", eval_id="e", meta=meta)
    web.events.add(time=4, error=True, message="no data")
    out = scaling.scale_status(status)
    events = out["TaskGroups"]["web"]["Events"]
    assert events[0] == {
        "Count": 3,
        "PreviousCount": 2,
        "Error": False,
        "Message": "up",
        "Meta": {"reason": "cpu"},
        "EvalID": "e",
        "Time": 5,
        "CreateIndex": 0,
    }
    assert events[1]["Count"] is None and events[1]["EvalID"] is None and events[1]["Error"]


def test_scale_request_as_nomad_autoscaler_sends_it() -> None:
    """api.Jobs().Scale: Count, Target{Job, Group}, Message, Error, Meta."""
    body = {
        "Count": 4,
        "Target": {"Job": "web", "Group": "web"},
        "Message": "scaling up",
        "Error": False,
        "Meta": {"nomad_autoscaler.count.original": 2},
        "PolicyOverride": False,
        "JobModifyIndex": 0,
    }
    req = scaling.scale_request(body, "web", "default")
    assert req.HasField("count") and req.count == 4 and req.group == "web"
    assert req.meta["nomad_autoscaler.count.original"] == 2 and not req.enforce_index
    event_only = scaling.scale_request(
        {"Target": {"Group": "web"}, "Error": True, "Message": "x"}, "web", "default"
    )
    assert not event_only.HasField("count") and event_only.error


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"Count": 1, "Target": {}}, "missing task group name for scaling action"),
        ({"Count": 1, "Target": {"Group": "g", "Job": "other"}}, "job ID in payload did not match"),
        ({"Count": 1, "Target": {"Group": "g", "Namespace": "x"}}, "namespace in payload"),
        ({"Count": -1, "Target": {"Group": "g"}}, "count can't be negative"),
        ({"Count": 1, "Error": True, "Target": {"Group": "g"}}, "should not contain count"),
        ({"Count": 1.5, "Target": {"Group": "g"}}, "Count must be a whole number"),
        ({"Count": 2**31, "Target": {"Group": "g"}}, "too large"),
        ({"Target": {"Group": "g"}, "Meta": [1]}, "Meta must be an object"),
    ],
)
def test_bad_scale_requests(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scaling.scale_request(body, "web", "default")


def test_the_served_prefixes_are_not_in_the_501_list() -> None:
    for path in ("/v1/namespaces", "/v1/namespace/x", "/v1/node/pools", "/v1/scaling/policies"):
        assert not path.startswith(unserved.UNSERVED_PREFIXES), path


@pytest.mark.parametrize(
    ("method", "path", "endpoint"),
    [
        ("GET", "/v1/node/pools", "pools"),
        ("POST", "/v1/node/pools", "pools"),
        ("GET", "/v1/node/pool/gpu", "pool"),
        ("GET", "/v1/node/pool/gpu/nodes", "pool"),
        ("DELETE", "/v1/node/pool/gpu", "pool"),
        ("GET", "/v1/namespaces", "namespaces"),
        ("POST", "/v1/namespace", "create"),
        ("DELETE", "/v1/namespace/team", "namespace"),
        ("GET", "/v1/scaling/policies", "policies"),
        ("GET", "/v1/scaling/policy/abc", "policy"),
        ("GET", "/v1/job/web/scale", "job_scale"),
        ("GET", "/v1/node/abc", "node"),
    ],
)
def test_routes_reach_their_endpoints(method: str, path: str, endpoint: str) -> None:
    from starlette.routing import Match

    from services.gateway.app import routes

    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for route in routes():
        match, _ = route.matches(scope)
        if match is Match.FULL:
            assert route.endpoint.__name__ == endpoint, route  # type: ignore[attr-defined]
            return
    raise AssertionError(f"no route for {method} {path}")
