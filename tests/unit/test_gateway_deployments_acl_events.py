"""The gateway's deployment, ACL and event mappings: our protos as Nomad's
JSON shapes, Nomad's request bodies as our requests (bad ones named), and
the event stream's topics and lines."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.v1 import acl_pb2, deployment_pb2, event_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping import acl, deployments, events
from services.gateway.mapping.common import ZERO_TIME
from services.gateway.routes.events import _from_index

NS = 1_000_000_000


def a_deployment() -> pb.Deployment:
    d = pb.Deployment(
        id="d-1",
        namespace="default",
        job_id="web",
        job_version=3,
        job_modify_index=40,
        job_create_index=10,
        status="running",
        status_description="Deployment is running",
        create_index=41,
        modify_index=45,
        create_time=1_700_000_000 * NS,
        modify_time=1_700_000_001 * NS,
    )
    d.task_groups["web"].CopyFrom(
        pb.DeploymentState(
            auto_revert=True,
            placed_canaries=["a-1"],
            desired_canaries=1,
            desired_total=3,
            placed_allocs=1,
            healthy_allocs=1,
            progress_deadline=600 * NS,
            require_progress_by=1_700_000_600 * NS + 5,
        )
    )
    return d


def test_deployment_is_nomads_shape() -> None:
    out = deployments.deployment(a_deployment())
    assert out["ID"] == "d-1" and out["JobID"] == "web" and out["JobVersion"] == 3
    assert out["Status"] == "running" and out["StatusDescription"] == "Deployment is running"
    assert out["JobSpecModifyIndex"] == 40 and out["IsMultiregion"] is False
    assert (out["CreateIndex"], out["ModifyIndex"]) == (41, 45)
    state = out["TaskGroups"]["web"]
    assert state == {
        "PlacedCanaries": ["a-1"],
        "AutoRevert": True,
        "AutoPromote": False,
        "ProgressDeadline": 600 * NS,
        "RequireProgressBy": "2023-11-14T22:23:20.000000005Z",
        "Promoted": False,
        "DesiredCanaries": 1,
        "DesiredTotal": 3,
        "PlacedAllocs": 1,
        "HealthyAllocs": 1,
        "UnhealthyAllocs": 0,
    }
    empty = deployments.deployment_state(pb.DeploymentState())
    assert empty["PlacedCanaries"] is None and empty["RequireProgressBy"] == ZERO_TIME
    json.dumps(out)  # plain JSON


def test_update_response() -> None:
    plain = deployments.update_response(
        deployment_pb2.DeploymentUpdateResponse(
            eval_id="e-1", eval_create_index=7, deployment_modify_index=7, index=7
        )
    )
    assert plain["EvalID"] == "e-1" and plain["RevertedJobVersion"] is None
    assert plain["Index"] == 7 and plain["DeploymentModifyIndex"] == 7
    reverted = deployments.update_response(
        deployment_pb2.DeploymentUpdateResponse(reverted=True, reverted_job_version=0, index=9)
    )
    assert reverted["RevertedJobVersion"] == 0


def test_action_bodies() -> None:
    promote = deployments.promote_request("d", {"All": True, "DeploymentID": "d"})
    assert promote.all and not promote.groups
    promote = deployments.promote_request("d", {"Groups": ["web", "api"]})
    assert list(promote.groups) == ["web", "api"] and not promote.all
    assert deployments.pause_request("d", {"Pause": True}).pause
    assert not deployments.pause_request("d", {"pause": False}).pause  # any case, as Go decodes
    health = deployments.alloc_health_request(
        "d", {"HealthyAllocationIDs": ["a"], "UnHealthyAllocationIDs": ["b"]}
    )
    assert list(health.healthy_alloc_ids) == ["a"] and list(health.unhealthy_alloc_ids) == ["b"]
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"All": "yes"}, deployments.promote_request),
        ({"Groups": "web"}, deployments.promote_request),
        ({"Pause": 1}, deployments.pause_request),
        ({"HealthyAllocationIDs": [1]}, deployments.alloc_health_request),
    ]
    for bad, build in cases:
        with pytest.raises(ValueError):
            build("d", bad)


def test_tokens_show_secrets_only_when_given() -> None:
    t = acl_pb2.ACLToken(
        accessor_id="acc",
        name="ci",
        type="client",
        policies=["readers"],
        create_time=1_700_000_000 * NS,
        expiration_time=1_700_003_600 * NS,
        create_index=5,
        modify_index=5,
    )
    stub = acl.token_stub(t)
    assert "SecretID" not in stub
    assert stub["Policies"] == ["readers"] and stub["Global"] is False
    assert stub["CreateTime"] == "2023-11-14T22:13:20Z"
    assert stub["ExpirationTime"] == "2023-11-14T23:13:20Z"
    full = acl.token(t)
    assert full["SecretID"] == "" and full["ExpirationTTL"] == 3600 * NS
    assert acl.token(t, secret_id="s3cret")["SecretID"] == "s3cret"
    never = acl.token(acl_pb2.ACLToken(accessor_id="m", type="management", secret_id="x"))
    assert never["ExpirationTime"] is None and never["ExpirationTTL"] == 0
    assert never["SecretID"] == "x" and never["Policies"] is None


def test_policies() -> None:
    p = acl_pb2.ACLPolicy(name="readers", description="d", rules="node { policy = 'read' }")
    assert acl.policy_stub(p) == {
        "Name": "readers",
        "Description": "d",
        "JobACL": None,
        "CreateIndex": 0,
        "ModifyIndex": 0,
    }
    assert acl.policy(p)["Rules"] == p.rules
    made = acl.policy_from_body("readers", {"Name": "readers", "Rules": "x", "Description": "y"})
    assert (made.name, made.rules, made.description) == ("readers", "x", "y")
    with pytest.raises(ValueError, match="does not match the URL"):
        acl.policy_from_body("readers", {"Name": "writers"})
    with pytest.raises(ValueError, match="Rules must be a string"):
        acl.policy_from_body("readers", {"Rules": 3})


def test_token_create_body() -> None:
    req = acl.create_token_request(
        {"Name": "ci", "Type": "client", "Policies": ["readers"], "ExpirationTTL": "1h"}
    )
    assert (req.name, req.type, list(req.policies)) == ("ci", "client", ["readers"])
    assert req.expiration_ttl == 3600 * NS
    assert acl.create_token_request({"ExpirationTTL": 5 * NS}).expiration_ttl == 5 * NS
    assert acl.create_token_request({}).type == "client"
    # Nomad's Go client sends "" for a token without a TTL
    assert acl.create_token_request({"ExpirationTTL": ""}).expiration_ttl == 0
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"AccessorID": "x"}, "AccessorID must be empty"),
        ({"Global": "yes"}, "Global must be"),
        ({"Policies": "readers"}, "Policies must be a list"),
        ({"ExpirationTTL": "soon"}, "ExpirationTTL"),
        ({"ExpirationTTL": True}, "ExpirationTTL"),
        ({"Roles": {"Name": "r"}}, "Roles must be a list"),
        ({"Roles": ["r"]}, r"Roles\[0\] must be an object"),
        ({"Roles": [{"ID": 3}]}, r"Roles\[0\].ID must be a string"),
    ]
    for bad, message in refusals:
        with pytest.raises(ValueError, match=message):
            acl.create_token_request(bad)
    linked = acl.create_token_request({"Roles": [{"ID": "i"}, {"Name": "n"}], "roles": None})
    assert [(r.id, r.name) for r in linked.roles] == [("i", ""), ("", "n")]
    assert acl.bootstrap_request(None).secret_id == ""
    assert acl.bootstrap_request({"BootstrapSecret": "abc"}).secret_id == "abc"


def test_role_body_and_json() -> None:
    role = acl.role_from_body(
        {"ID": "r1", "Name": "ops", "Description": "d", "Policies": [{"Name": "a"}, {"Name": "b"}]},
        "r1",
    )
    assert (role.id, role.name, role.description, list(role.policies)) == (
        "r1",
        "ops",
        "d",
        ["a", "b"],
    )
    assert acl.role(role) == {
        "ID": "r1",
        "Name": "ops",
        "Description": "d",
        "Policies": [{"Name": "a"}, {"Name": "b"}],
        "CreateIndex": 0,
        "ModifyIndex": 0,
    }
    refusals: list[tuple[dict[str, Any], str, str]] = [
        ({"ID": "other", "Name": "ops"}, "r1", "does not match request path"),
        ({"Name": "ops", "Policies": "a"}, "", "Policies must be a list"),
        ({"Name": "ops", "Policies": ["a"]}, "", r"Policies\[0\] must be an object"),
        ({"Name": 3}, "", "Name must be a string"),
    ]
    for bad, path_id, message in refusals:
        with pytest.raises(ValueError, match=message):
            acl.role_from_body(bad, path_id)


def test_topics() -> None:
    assert events.topic("Job") == event_pb2.EventTopic(topic="Job")
    assert events.topic("Job:*") == event_pb2.EventTopic(topic="Job")
    assert events.topic("Job:web") == event_pb2.EventTopic(topic="Job", key="web")
    assert events.topic("*") == event_pb2.EventTopic(topic="*")
    assert events.topic("Deployment:web:x").key == "web:x"
    with pytest.raises(events.TopicError, match="unknown topic 'Jobs'"):
        events.topic("Jobs")
    with pytest.raises(events.TopicError):
        events.topic("ACLToken")  # ACL changes are never streamed


def test_from_index() -> None:
    assert _from_index(0) == 0  # from now
    assert _from_index(1) == 1
    assert _from_index(2) == 1  # index 2 included
    assert _from_index(100) == 99


def test_event_lines() -> None:
    ev = pb.Event(
        index=12,
        topic="Evaluation",
        type="EvaluationUpdated",
        key="e-1",
        namespace="default",
        evaluation=pb.Evaluation(id="e-1", job_id="web", deployment_id="d-1", status="pending"),
    )
    dep = pb.Event(
        index=12, topic="Deployment", type="DeploymentStatusUpdate", key="d-1",
        deployment=a_deployment(),
    )  # fmt: skip
    job = pb.Event(index=12, topic="Job", type="JobRegistered", key="web", job=pb.Job(id="web"))
    line = events.events(event_pb2.EventStreamResponse(index=12, events=[ev, dep, job]))
    assert line["Index"] == 12
    e, d, j = line["Events"]
    assert (e["Topic"], e["Type"], e["Key"], e["Index"]) == (
        "Evaluation",
        "EvaluationUpdated",
        "e-1",
        12,
    )
    assert e["FilterKeys"] == ["web", "d-1"]
    assert e["Payload"]["Evaluation"]["ID"] == "e-1"
    assert e["Payload"]["Evaluation"]["JobID"] == "web"
    assert d["FilterKeys"] == ["web"] and d["Payload"]["Deployment"]["ID"] == "d-1"
    assert j["FilterKeys"] is None and j["Payload"]["Job"]["ID"] == "web"
    json.dumps(line)


def test_node_events_carry_no_node_secret() -> None:
    ev = pb.Event(
        index=3, topic="Node", type="NodeRegistration", key="n-1",
        node=pb.Node(id="n-1", secret_id="s3cret", secret_hash="abc"),
    )  # fmt: skip
    payload = events.event(ev)["Payload"]["Node"]
    assert payload["ID"] == "n-1"
    assert "SecretID" not in payload and "SecretHash" not in payload
    assert "s3cret" not in json.dumps(payload)
