"""Variables under ACLs (issue 28) on a state that enforces them: each
`variables` capability (read, write, list, destroy, deny) allows exactly
what it names; the keyring RPCs need operator read/write; a task's
workload identity (signed by the state for its node) reads its own job's
variables and nothing else, is verified by the published keys, and stops
working when it expires or its alloc ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import jwt
import pytest

from corral.security import keyring as kr
from corral.testing import mock
from corral.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    event_pb2,
    event_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    keyring_pb2,
    keyring_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    query_pb2,
    variables_pb2,
    variables_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.callers import user_channel
from tests.wait import until

ACL_ENABLED = True

POLICIES = {
    "reader": 'namespace "default" { variables { path "app/*" { capabilities = ["read"] } } }',
    "writer": 'namespace "default" { variables { path "app/*" { capabilities = ["write"] } } }',
    "lister": 'namespace "default" { variables { path "*" { capabilities = ["list"] } } }',
    "destroyer": (
        'namespace "default" { variables { path "app/*" { capabilities = ["destroy"] } } }'
    ),
    "denied": (
        'namespace "default" { variables {\n'
        '  path "app/*" { capabilities = ["read", "write", "list", "destroy"] }\n'
        '  path "app/secret" { capabilities = ["deny"] }\n'
        "} }"
    ),
    "job-reader": 'namespace "default" { policy = "read" }',
    "operator-reader": 'operator { policy = "read" }',
    "operator-writer": 'operator { policy = "write" }',
}
NODE_SECRET = "node-secret-variables-0123"


class World:
    def __init__(self, app: StateApp) -> None:
        self.app = app
        self.address = app.server.bound_address
        self.channels: list[grpc.aio.Channel] = []
        self.tokens: dict[str, str] = {}
        self.node_id = ""
        self.web_alloc = pb.Allocation()
        self.db_alloc = pb.Allocation()

    def channel(self, token: str = "") -> grpc.aio.Channel:
        ch = user_channel(self.address, token)
        self.channels.append(ch)
        return ch

    def variables(self, who: str) -> variables_pb2_grpc.VariablesAsyncStub:
        token = who if "." in who else self.tokens.get(who, "")
        return variables_pb2_grpc.VariablesStub(self.channel(token))


def _var(path: str, items: dict[str, str] | None = None) -> pb.Variable:
    v = pb.Variable(metadata=pb.VariableMetadata(path=path))
    v.items.update(items or {})
    return v


@pytest.fixture(scope="module")
async def world(state_app: StateApp) -> AsyncIterator[World]:
    w = World(state_app)
    boot = await acl_pb2_grpc.ACLStub(w.channel()).Bootstrap(acl_pb2.ACLBootstrapRequest())
    w.tokens["management"] = boot.token.secret_id
    mgmt = w.channel(boot.token.secret_id)
    acls = acl_pb2_grpc.ACLStub(mgmt)
    await acls.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name=n, rules=r) for n, r in POLICIES.items()]
        )
    )
    for name in POLICIES:
        resp = await acls.CreateToken(acl_pb2.ACLCreateTokenRequest(name=name, policies=[name]))
        w.tokens[name] = resp.token.secret_id
    node = mock.node()
    node.secret_id = NODE_SECRET
    await node_pb2_grpc.NodeStub(mgmt).Register(node_pb2.NodeRegisterRequest(node=node))
    w.node_id = node.id
    jobs = job_pb2_grpc.JobStub(mgmt)
    for job_id in ("web", "db"):
        job = mock.job(job_id=job_id, count=1)
        task = job.task_groups[0].tasks[0]
        task.identities.add(name="aws", audience=["sts.amazonaws.com"], ttl=3600 * 10**9)
        task.identities.add(name="short", audience=["x"], ttl=10**9)
        await jobs.Register(job_pb2.JobRegisterRequest(job=job))
    async with state_app.db.write() as tx:
        allocs = []
        for job_id in ("web", "db"):
            stored = await tx.get_job("default", job_id)
            assert stored is not None
            alloc = mock.alloc(stored, node)
            alloc.client_status = "running"
            tx.put_alloc(alloc, "AllocationUpdated")
            allocs.append(alloc)
    await state_app.feed.wait_for_index(await state_app.db.latest_index(), 30)
    w.web_alloc, w.db_alloc = allocs
    vars_ = variables_pb2_grpc.VariablesStub(mgmt)
    for path in ("app/config", "app/secret", "other/thing", "nomad/jobs/web", "nomad/jobs/db"):
        await vars_.Apply(
            variables_pb2.VariablesApplyRequest(op="set", variable=_var(path, {"k": path}))
        )
    group = w.web_alloc.task_group
    task_name = mock.job().task_groups[0].tasks[0].name
    await vars_.Apply(
        variables_pb2.VariablesApplyRequest(
            op="set", variable=_var(f"nomad/jobs/web/{group}/{task_name}", {"k": "task"})
        )
    )
    try:
        yield w
    finally:
        for ch in w.channels:
            await ch.close()


async def _code(call: Awaitable[Any]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


OK, DENIED = grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED


def _read(stub: variables_pb2_grpc.VariablesAsyncStub, path: str) -> Awaitable[Any]:
    return stub.Read(variables_pb2.VariablesReadRequest(path=path))


def _write(stub: variables_pb2_grpc.VariablesAsyncStub, path: str) -> Awaitable[Any]:
    return stub.Apply(
        variables_pb2.VariablesApplyRequest(op="set", variable=_var(path, {"k": "written"}))
    )


def _delete(stub: variables_pb2_grpc.VariablesAsyncStub, path: str) -> Awaitable[Any]:
    return stub.Apply(variables_pb2.VariablesApplyRequest(op="delete", variable=_var(path)))


async def _listed(stub: variables_pb2_grpc.VariablesAsyncStub, namespace: str = "") -> set[str]:
    resp = await stub.List(
        variables_pb2.VariablesListRequest(query=query_pb2.QueryOptions(namespace=namespace))
    )
    return {v.path for v in resp.variables}


@pytest.mark.parametrize(
    ("who", "read", "write", "destroy", "listed"),
    [
        ("management", OK, OK, OK, {"app/config", "app/secret", "other/thing"}),
        ("reader", OK, DENIED, DENIED, {"app/config", "app/secret"}),  # read implies list
        ("writer", DENIED, OK, DENIED, set()),
        ("lister", DENIED, DENIED, DENIED, {"app/config", "app/secret", "other/thing"}),
        ("destroyer", DENIED, DENIED, OK, set()),
        ("job-reader", DENIED, DENIED, DENIED, set()),  # namespace rights are not variables'
        ("anonymous", DENIED, DENIED, DENIED, set()),
    ],
)
async def test_each_capability(
    world: World,
    state_app: StateApp,
    who: str,
    read: grpc.StatusCode,
    write: grpc.StatusCode,
    destroy: grpc.StatusCode,
    listed: set[str],
) -> None:
    stub = world.variables(who)
    path = f"app/cap-{who}"
    mgmt = world.variables("management")
    await _write(mgmt, path)
    assert await _code(_read(stub, "app/config")) == read
    before = await state_app.db.latest_index()
    assert await _code(_write(stub, path)) == write
    if write != OK:
        assert await state_app.db.latest_index() == before
    assert await _code(_delete(stub, path)) == destroy
    fixed = {"app/config", "app/secret", "other/thing"}
    assert await _listed(stub) & fixed == listed


async def test_deny_wins_on_its_path(world: World) -> None:
    stub = world.variables("denied")
    assert await _code(_read(stub, "app/config")) == OK
    assert await _code(_read(stub, "app/secret")) == DENIED
    assert await _code(_write(stub, "app/secret")) == DENIED
    assert "app/secret" not in await _listed(stub)


async def test_a_redacted_conflict_shows_no_items(world: World) -> None:
    stub = world.variables("writer")
    resp = await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op="cas",
            variable=_var("app/config", {"k": "x"}),  # modify_index 0: exists
        )
    )
    assert resp.result == "conflict-redacted"
    assert resp.conflict.metadata.path == "app/config" and not resp.conflict.items
    reader_view = await world.variables("reader").Read(
        variables_pb2.VariablesReadRequest(path="app/config")
    )
    assert reader_view.variable.items["k"] == "app/config"


async def test_locks_are_shown_to_management_and_holders_only(world: World) -> None:
    mgmt = world.variables("management")
    acquired = await mgmt.Apply(
        variables_pb2.VariablesApplyRequest(op="lock-acquire", variable=_var("app/locked"))
    )
    lock_id = acquired.output.metadata.lock.id
    assert lock_id
    seen = await mgmt.Read(variables_pb2.VariablesReadRequest(path="app/locked"))
    assert seen.variable.metadata.lock.id == lock_id
    reader = await world.variables("reader").Read(
        variables_pb2.VariablesReadRequest(path="app/locked")
    )
    assert not reader.variable.metadata.lock.id
    listed = await world.variables("lister").List(variables_pb2.VariablesListRequest())
    assert all(not v.lock.id for v in listed.variables)


async def test_the_keyring_needs_operator_rights(world: World) -> None:
    for who, listing, rotating in (
        ("operator-reader", OK, DENIED),
        ("operator-writer", OK, OK),
        ("reader", DENIED, DENIED),
        ("anonymous", DENIED, DENIED),
    ):
        keys = keyring_pb2_grpc.KeyringStub(world.channel(world.tokens.get(who, "")))
        assert await _code(keys.List(keyring_pb2.KeyringListRequest())) == listing, who
        assert await _code(keys.Rotate(keyring_pb2.KeyringRotateRequest())) == rotating, who
        # the public keys and the issuer are for anyone, as Nomad's JWKS
        assert await _code(keys.ListPublic(keyring_pb2.KeyringListPublicRequest())) == OK
        assert await _code(keys.GetConfig(keyring_pb2.KeyringGetConfigRequest())) == OK


# ----------------------------------------------------------- workload identity


async def _sign(
    world: World, alloc: pb.Allocation, identity: str = "default", *, secret: str = NODE_SECRET
) -> node_pb2.NodeSignIdentitiesResponse:
    nodes = node_pb2_grpc.NodeStub(world.channel())
    return await nodes.SignIdentities(
        node_pb2.NodeSignIdentitiesRequest(
            node_id=world.node_id,
            secret_id=secret,
            identities=[
                node_pb2.WorkloadIdentityRequest(
                    alloc_id=alloc.id, task=_task_name(), identity=identity
                )
            ],
        )
    )


def _task_name() -> str:
    return mock.job().task_groups[0].tasks[0].name


async def _token(world: World, alloc: pb.Allocation, identity: str = "default") -> str:
    resp = await node_pb2_grpc.NodeStub(world.channel()).SignIdentities(
        node_pb2.NodeSignIdentitiesRequest(
            node_id=world.node_id,
            secret_id=NODE_SECRET,
            identities=[
                node_pb2.WorkloadIdentityRequest(
                    alloc_id=alloc.id, task=_task_name(), identity=identity
                )
            ],
        )
    )
    assert not resp.rejections, resp.rejections
    return resp.signed[0].jwt


async def test_a_task_reads_its_own_jobs_variables_only(world: World) -> None:
    token = await _token(world, world.web_alloc)
    stub = world.variables(token)
    group, task = world.web_alloc.task_group, _task_name()
    for path in ("nomad/jobs/web", f"nomad/jobs/web/{group}/{task}"):
        got = await stub.Read(variables_pb2.VariablesReadRequest(path=path))
        assert got.found, path
    assert await _code(_read(stub, "nomad/jobs/db")) == DENIED
    assert await _code(_read(stub, "app/config")) == DENIED
    assert await _code(_write(stub, "nomad/jobs/web")) == DENIED
    assert await _listed(stub) == {"nomad/jobs/web", f"nomad/jobs/web/{group}/{task}"}
    # another namespace: nothing
    assert (
        await _code(
            stub.Read(
                variables_pb2.VariablesReadRequest(
                    path="nomad/jobs/web", query=query_pb2.QueryOptions(namespace="prod")
                )
            )
        )
        == DENIED
    )
    # the other job's identity reads the other job's variables
    db_stub = world.variables(await _token(world, world.db_alloc))
    assert await _code(_read(db_stub, "nomad/jobs/db")) == OK
    assert await _code(_read(db_stub, "nomad/jobs/web")) == DENIED


async def test_the_identity_has_nomads_claims_and_verifies_with_the_jwks(world: World) -> None:
    token = await _token(world, world.web_alloc)
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "RS256" and header["typ"] == "JWT"
    public = await keyring_pb2_grpc.KeyringStub(world.channel()).ListPublic(
        keyring_pb2.KeyringListPublicRequest()
    )
    jwks = {"keys": [kr.public_jwk(k.key_id, k.public_key) for k in public.keys]}
    key = jwt.PyJWKSet.from_dict(jwks)[header["kid"]]
    claims = jwt.decode(token, key.key, algorithms=["RS256"], audience="nomadproject.io")
    assert claims["nomad_namespace"] == "default"
    assert claims["nomad_job_id"] == "web"
    assert claims["nomad_allocation_id"] == world.web_alloc.id
    assert claims["nomad_task"] == _task_name()
    assert (
        claims["sub"] == f"global:default:web:{world.web_alloc.task_group}:{_task_name()}:default"
    )
    assert "exp" not in claims and claims["iat"] == claims["nbf"]
    named = await _token(world, world.web_alloc, "aws")
    named_claims = jwt.decode(named, key.key, algorithms=["RS256"], audience="sts.amazonaws.com")
    assert named_claims["exp"] - named_claims["iat"] == 3600
    assert named_claims["sub"].endswith(":aws")


async def test_signing_refuses_what_is_not_the_nodes(world: World) -> None:
    nodes = node_pb2_grpc.NodeStub(world.channel())
    resp = await nodes.SignIdentities(
        node_pb2.NodeSignIdentitiesRequest(
            node_id=world.node_id,
            secret_id=NODE_SECRET,
            identities=[
                node_pb2.WorkloadIdentityRequest(alloc_id="nope", task="x"),
                node_pb2.WorkloadIdentityRequest(alloc_id=world.web_alloc.id, task="nope"),
                node_pb2.WorkloadIdentityRequest(
                    alloc_id=world.web_alloc.id, task=_task_name(), identity="nope"
                ),
            ],
        )
    )
    assert not resp.signed
    assert [r.reason for r in resp.rejections] == [
        "allocation not found",
        "task not found",
        "identity not found",
    ]
    bad = await _code(
        nodes.SignIdentities(
            node_pb2.NodeSignIdentitiesRequest(
                node_id=world.node_id,
                secret_id="wrong-secret",
                identities=[
                    node_pb2.WorkloadIdentityRequest(alloc_id=world.web_alloc.id, task="web")
                ],
            )
        )
    )
    assert bad == DENIED


async def test_an_expired_identity_is_refused(world: World) -> None:
    token = await _token(world, world.web_alloc, "short")  # 1 s TTL
    stub = world.variables(token)
    assert await _code(_read(stub, "nomad/jobs/web")) == OK

    async def expired() -> bool:
        return await _code(_read(stub, "nomad/jobs/web")) == DENIED

    await until(expired, timeout=15, what="the 1 s identity refused")
    resolved = await _code(
        acl_pb2_grpc.ACLStub(world.channel()).ResolveToken(
            acl_pb2.ACLResolveTokenRequest(secret_id=token)
        )
    )
    assert resolved == DENIED


async def test_a_forged_identity_is_refused(world: World) -> None:
    token = await _token(world, world.web_alloc)
    head, body, sig = token.split(".")
    forged = f"{head}.{body}.{sig[:-4]}AAAA"
    assert await _code(_read(world.variables(forged), "nomad/jobs/web")) == DENIED
    stranger = kr.RootKeyMaterial.generate("other-cluster")
    other = jwt.encode(
        jwt.decode(token, options={"verify_signature": False}),
        stranger.rsa_key,
        algorithm="RS256",
        headers={"kid": jwt.get_unverified_header(token)["kid"]},
    )
    assert await _code(_read(world.variables(other), "nomad/jobs/web")) == DENIED


async def test_the_identity_of_a_finished_alloc_is_refused(
    world: World, state_app: StateApp
) -> None:
    job = mock.job(job_id="finished", count=1)
    await job_pb2_grpc.JobStub(world.channel(world.tokens["management"])).Register(
        job_pb2.JobRegisterRequest(job=job)
    )
    node = state_app.feed.snapshot().node_by_id(world.node_id)
    assert node is not None
    async with state_app.db.write() as tx:
        stored = await tx.get_job("default", "finished")
        assert stored is not None
        alloc = mock.alloc(stored, node)
        alloc.client_status = "running"
        tx.put_alloc(alloc, "AllocationUpdated")
    await state_app.feed.wait_for_index(await state_app.db.latest_index(), 30)
    token = await _token(world, alloc)
    stub = world.variables(token)
    assert await _code(_read(stub, "nomad/jobs/finished")) == OK
    done = pb.Allocation()
    done.CopyFrom(alloc)
    done.client_status = "complete"
    async with state_app.db.write() as tx:
        tx.put_alloc(done, "AllocationUpdated")
    await state_app.feed.wait_for_index(await state_app.db.latest_index(), 30)
    assert await _code(_read(stub, "nomad/jobs/finished")) == DENIED
    resp = await _sign(world, done)
    assert not resp.signed and resp.rejections[0].reason == "allocation not found"


async def test_variable_events_are_filtered_by_path(world: World, state_app: StateApp) -> None:
    start = await state_app.db.latest_index()
    mgmt = world.variables("management")
    for path in ("other/ev", "app/ev"):
        await _write(mgmt, path)
    last = await state_app.db.latest_index()
    stream = event_pb2_grpc.EventStub(world.channel(world.tokens["reader"])).Stream(
        event_pb2.EventStreamRequest(
            from_index=start, topics=[event_pb2.EventTopic(topic="Variable")]
        )
    )
    seen: list[str] = []
    async for resp in stream:
        seen += [e.key for e in resp.events]
        if resp.index >= last:
            break
    stream.cancel()
    assert seen == ["app/ev"]
