"""The fuzzy search's matching inside a job and its order, as Nomad's."""

from __future__ import annotations

from google.protobuf import struct_pb2

from corral.v1 import structs_pb2
from services.gateway.routes.search_fuzzy import LIMIT_RESULTS, Found, match_job


def _config(**values: str) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(values)
    return s


def test_job_parts_are_matched_with_their_scope() -> None:
    job = structs_pb2.Job(
        id="web-id",
        namespace="prod",
        name="Web",
        task_groups=[
            structs_pb2.TaskGroup(
                name="webgroup",
                services=[structs_pb2.Service(name="web-svc")],
                tasks=[
                    structs_pb2.Task(
                        name="webtask",
                        driver="docker",
                        config=_config(image="nginx:web", command="ignored-web"),
                        services=[structs_pb2.Service(name="task-web")],
                    ),
                    structs_pb2.Task(
                        name="other", driver="raw_exec", config=_config(command="/bin/web")
                    ),
                ],
            )
        ],
    )
    found = Found("WEB")
    match_job(found, job)
    body = found.body()
    assert body["jobs"] == [{"ID": "Web", "Scope": ["prod", "web-id"]}]
    assert body["groups"] == [{"ID": "webgroup", "Scope": ["prod", "web-id"]}]
    assert body["tasks"] == [{"ID": "webtask", "Scope": ["prod", "web-id", "webgroup"]}]
    assert body["services"] == [
        {"ID": "web-svc", "Scope": ["prod", "web-id", "webgroup"]},
        {"ID": "task-web", "Scope": ["prod", "web-id", "webgroup", "webtask"]},
    ]
    assert body["images"] == [
        {"ID": "nginx:web", "Scope": ["prod", "web-id", "webgroup", "webtask"]}
    ]
    assert body["commands"] == [
        {"ID": "/bin/web", "Scope": ["prod", "web-id", "webgroup", "other"]}
    ]


def test_order_and_limit() -> None:
    found = Found("ab")
    for name in ("xxab", "abcd", "ab", "xab", "abc", "zzz"):
        found.add("nodes", name, [])
    assert [m["ID"] for m in found.body()["nodes"]] == ["ab", "abc", "abcd", "xab", "xxab"]
    assert "Scope" not in found.body()["nodes"][0]
    many = Found("n")
    for i in range(LIMIT_RESULTS + 1):
        many.add("allocs", f"n{i}", ["default", str(i)])
    assert len(many.body()["allocs"]) == LIMIT_RESULTS and many.truncations["allocs"]
