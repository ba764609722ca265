"""Issue 26: namespaces stay apart in every read. A token with read in
namespace "team-a" only (plus node, agent and operator read, so that every
read it may make is made) calls

* every public RPC of every role, found by server reflection and the
  protobuf descriptors and governed by corral.security.access.RULES (writes are
  refused to it; reads answer), with requests naming team-b's objects by
  id and prefix in every namespace (team-b, `*`, team-a, none);
* every GET route of the gateway's route table, with the same ids in the
  path and the same namespaces;
* the event streams, gRPC Event.Stream and /v1/event/stream, replayed from
  before team-b's objects were written up to a sentinel written after;

and no answer may hold anything of team-b that its request did not name:
its job id, alloc, eval and deployment ids, the namespace's name, or the
marker in its job's meta and env. Team-a's objects must show (the audit
reads something)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
import requests
from google.protobuf import text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from starlette.routing import Mount, Route

from corral.security.access import Caller
from corral.security.acl import TOKEN_METADATA_KEY
from corral.v1 import event_pb2, event_pb2_grpc
from services.gateway import app, authz
from tests.e2e.gateway_security.conftest import READER_POLICY, Cluster
from tests.fuzz import rpcs
from tests.fuzz.messages import message_class

pytestmark = [pytest.mark.slow]

NAMESPACES = ("team-b", "*", "team-a", "")
STREAM_SECONDS = 30.0


def reader(cluster: Cluster) -> str:
    return cluster.token("team-a-reader", READER_POLICY)


def forbidden(cluster: Cluster) -> list[str]:
    return [*cluster.team_b.ids(), cluster.marker, cluster.team_b.namespace]


def leaks(cluster: Cluster, answer: str, request: str) -> list[str]:
    """What of team-b an answer shows that its request did not name."""
    return [s for s in forbidden(cluster) if s in answer and s not in request]


# -- gRPC --------------------------------------------------------------------


def _id_pool(cluster: Cluster) -> list[str]:
    b = cluster.team_b
    return [
        b.job_id,
        b.alloc_ids[0],
        b.alloc_ids[0][:8],
        b.eval_ids[0],
        b.deployment_ids[0],
        b.scaling_policy_ids[0],
        b.namespace,
        cluster.variable_path,
        cluster.node_id,
    ]


def _set_namespace(msg: Message, namespace: str) -> None:
    fields = msg.DESCRIPTOR.fields_by_name
    if "namespace" in fields:
        msg.namespace = namespace  # type: ignore[attr-defined]
    if "query" in fields:
        msg.query.namespace = namespace  # type: ignore[attr-defined]


def _id_fields(desc: Descriptor) -> list[str]:
    return [
        f.name
        for f in desc.fields
        if f.type == FieldDescriptor.TYPE_STRING
        and not f.is_repeated
        and (f.name.endswith("_id") or f.name in ("id", "key", "name", "path", "secret_id"))
    ]


def requests_for(cluster: Cluster, desc: Descriptor) -> Iterator[Message]:
    """Requests naming team-b's objects every way a field allows, in every
    namespace (see the module doc)."""
    cls = message_class(desc)
    for namespace in NAMESPACES:
        base = cls()
        _set_namespace(base, namespace)
        fields = desc.fields_by_name
        if "all" in fields:
            base.all = True  # type: ignore[attr-defined]
        if "task" in fields:
            base.task = cluster.team_b.task  # type: ignore[attr-defined]
        yield base
        for name, value in itertools.product(_id_fields(desc), _id_pool(cluster)):
            msg = cls()
            msg.CopyFrom(base)
            setattr(msg, name, value)
            yield msg
        if "query" in fields:
            for prefix in (cluster.team_b.job_id[:6], cluster.team_b.alloc_ids[0][:4]):
                msg = cls()
                msg.CopyFrom(base)
                msg.query.prefix = prefix  # type: ignore[attr-defined]
                yield msg


def _text(messages: list[Message]) -> str:
    return "\n".join(text_format.MessageToString(m) for m in messages)


def _public_rpcs(cluster: Cluster) -> list[rpcs.Rpc]:
    roles = cluster.dev.info["roles"]
    addresses = {role: r["address"] for role, r in roles.items() if role != "gateway"}
    found, unruled, _ = rpcs.discover(addresses)
    assert not unruled, unruled
    return [r for r in found if r.rule.caller is Caller.USER]


#: streams read by their own test (they answer until the caller leaves)
STREAMS = ("/corral.v1.Event/Stream",)


def test_every_rpc_keeps_namespaces_apart(cluster: Cluster) -> None:
    token = reader(cluster)
    callers = rpcs.Callers(acl_token=token)
    targets = _public_rpcs(cluster)
    methods = {r.method for r in targets}
    # the enumeration found the reads this audit is about
    for expected in ("Job/List", "Alloc/Get", "Node/Allocations", "Event/Stream", "Alloc/Logs"):
        assert any(m.endswith(expected) for m in methods), (expected, sorted(methods))
    found: list[str] = []
    shown_a = set()
    calls = 0
    try:
        for rpc in targets:
            if rpc.method in STREAMS:
                continue
            for request in requests_for(cluster, rpc.input):
                answer = callers.call(rpc, request, rpcs.As.USER, timeout=30, max_responses=20)
                calls += 1
                text = _text(answer.responses) + "\n" + "\n".join(answer.texts())
                sent = text_format.MessageToString(request)
                for leak in leaks(cluster, text, sent):
                    found.append(f"{rpc.name} {sent!r} -> {leak}")
                if answer.ok and cluster.team_a.job_id in text:
                    shown_a.add(rpc.method)
    finally:
        callers.close()
    assert not found, "\n".join(found[:20])
    # the reads answered team-a's objects: the audit is not vacuous
    for method in ("/corral.v1.Job/List", "/corral.v1.Alloc/List", "/corral.v1.Node/Allocations"):
        assert method in shown_a, (method, sorted(shown_a), calls)


def _read_grpc_stream(cluster: Cluster, token: str, request: Any) -> tuple[str, bool]:
    """The events a stream answers from `request`'s index until the
    sentinel's (text), and whether the sentinel was reached."""
    address = cluster.dev.info["roles"]["state"]["address"]
    texts: list[str] = []
    reached = False
    with grpc.insecure_channel(address) as channel:
        stream = event_pb2_grpc.EventStub(channel).Stream(
            request, metadata=((TOKEN_METADATA_KEY, token),), timeout=STREAM_SECONDS
        )
        try:
            for resp in stream:
                texts.append(text_format.MessageToString(resp))
                if resp.index >= cluster.sentinel_index:
                    reached = True
                    break
        except grpc.RpcError as exc:
            texts.append(f"{exc.code()} {exc.details()}")  # type: ignore[attr-defined]
        finally:
            stream.cancel()
    return "\n".join(texts), reached


def test_the_grpc_event_stream_keeps_namespaces_apart(cluster: Cluster) -> None:
    """Every stream reads until an answer at or past the sentinel's index
    (the state's heartbeats carry the index, so a stream that shows
    nothing ends at its first heartbeat); the streams run side by side."""
    token = reader(cluster)
    b = cluster.team_b
    cases = [
        event_pb2.EventStreamRequest(
            from_index=cluster.index_before_b, namespace=namespace, topics=topics
        )
        for namespace in NAMESPACES
        for topics in ([], [event_pb2.EventTopic(topic="*", key=b.job_id)])
    ]
    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(lambda r: _read_grpc_stream(cluster, token, r), cases))
    found = []
    for request, (text, reached) in zip(cases, results, strict=True):
        sent = text_format.MessageToString(request)
        found += [f"{sent!r} -> {leak}" for leak in leaks(cluster, text, sent)]
        assert reached, f"the stream {sent!r} did not reach the sentinel: {text[-500:]}"
        if request.namespace in ("*", "team-a") and not request.topics:
            assert "team-a-sentinel" in text, text[-2000:]
    assert not found, "\n".join(found)


# -- HTTP --------------------------------------------------------------------


def get_routes() -> Iterator[str]:
    """Path templates of every GET route of the gateway (mounts entered)."""

    def walk(routes: list[Any], prefix: str) -> Iterator[str]:
        for route in routes:
            if isinstance(route, Mount) and route.routes:
                yield from walk(list(route.routes), prefix + route.path)
            elif isinstance(route, Mount):
                yield prefix + route.path + "/{path}"
            elif isinstance(route, Route) and "GET" in authz.needs_of(route):
                yield prefix + route.path

    yield from walk(app.routes(), "")


def _paths(cluster: Cluster, template: str) -> Iterator[str]:
    b = cluster.team_b
    values = {
        "job_id": [b.job_id, cluster.team_a.job_id],
        "alloc_id": [b.alloc_ids[0], b.alloc_ids[0][:8]],
        "eval_id": [b.eval_ids[0]],
        "deployment_id": [b.deployment_ids[0]],
        "node_id": [cluster.node_id],
        "name": ["team-a-reader", b.namespace],
        "policy_id": [b.scaling_policy_ids[0]],
        "id": [b.alloc_ids[0]],
        "key_id": ["x"],
        "accessor_id": ["self"],
        "role_id": [b.job_id],
        "rest": ["x"],
        "action": ["allocations"],
        "path": ["app.js", cluster.variable_path],
    }
    names = []
    for part in template.split("{")[1:]:
        names.append(part.split("}")[0].split(":")[0])
    for combo in itertools.product(*(values[n] for n in names)):
        path = template
        for value in combo:
            start = path.index("{")
            path = path[:start] + value + path[path.index("}", start) + 1 :]
        yield path


def _read_http_stream(cluster: Cluster, token: str, params: dict[str, str]) -> tuple[str, bool]:
    """The NDJSON lines of /v1/event/stream until the sentinel's index, or
    until the first heartbeat (`{}`, written after 10 s without events: the
    replay of the events before the sentinel was written by then)."""
    lines: list[str] = []
    reached = False
    deadline = time.monotonic() + STREAM_SECONDS
    with requests.get(
        cluster.url + "/v1/event/stream",
        params=params,
        headers={"X-Nomad-Token": token},
        stream=True,
        timeout=STREAM_SECONDS,
    ) as resp:
        if resp.status_code != 200:
            return f"{resp.status_code} {resp.text}", False
        # the stream never ends by itself: close it once the sentinel passed
        timer = threading.Timer(STREAM_SECONDS, resp.close)
        timer.start()
        try:
            for raw in resp.iter_lines():
                line = raw.decode(errors="replace")
                lines.append(line)
                data = json.loads(line) if line.strip() else {}
                if int(data.get("Index", 0)) >= cluster.sentinel_index:
                    reached = True
                    break
                if line.strip() == "{}":
                    break
                if time.monotonic() > deadline:
                    break
        except (requests.RequestException, AttributeError):
            pass  # closed by the timer
        finally:
            timer.cancel()
    return "\n".join(lines), reached


def test_every_http_get_route_keeps_namespaces_apart(cluster: Cluster) -> None:
    token = reader(cluster)
    templates = list(get_routes())
    for expected in ("/v1/node/{node_id}/allocations", "/v1/jobs", "/v1/event/stream"):
        assert expected in templates, templates
    found = []
    shown_a = set()
    for template in templates:
        if template == "/v1/event/stream":
            continue
        for path, namespace in itertools.product(_paths(cluster, template), NAMESPACES):
            params = {"task": cluster.team_b.task, "type": "stdout", "plain": "true"}
            if namespace:
                params["namespace"] = namespace
            answer = cluster.http.call("GET", path, token=token, params=params)
            # 501: a Nomad endpoint Corral does not serve
            assert answer.status < 500 or answer.status == 501, (path, params, answer.text)
            sent = path + " " + json.dumps(params)
            found += [f"GET {sent} -> {leak}" for leak in leaks(cluster, answer.text, sent)]
            if answer.status == 200 and cluster.team_a.job_id in answer.text:
                shown_a.add(template)
    assert not found, "\n".join(found[:20])
    for template in ("/v1/jobs", "/v1/allocations", "/v1/node/{node_id}/allocations"):
        assert template in shown_a, (template, sorted(shown_a))


def test_the_http_event_stream_keeps_namespaces_apart(cluster: Cluster) -> None:
    token = reader(cluster)
    cases = []
    for namespace in NAMESPACES:
        for topic in (None, f"Job:{cluster.team_b.job_id}"):
            params = {"index": str(cluster.index_before_b)}
            if namespace:
                params["namespace"] = namespace
            if topic:
                params["topic"] = topic
            cases.append(params)
    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(lambda p: _read_http_stream(cluster, token, p), cases))
    found = []
    for params, (text, reached) in zip(cases, results, strict=True):
        sent = json.dumps(params)
        found += [f"{sent} -> {leak}" for leak in leaks(cluster, text, sent)]
        if params.get("namespace") in ("*", "team-a") and "topic" not in params:
            assert reached, f"/v1/event/stream {sent} did not reach the sentinel"
            assert "team-a-sentinel" in text
    assert not found, "\n".join(found)
