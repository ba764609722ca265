"""A task's templates and its Task API against a real state that enforces
ACLs (issue 28): the template manager reads Variables and services with
the task's own workload identity through blocking queries (a change is
seen at once, nothing is polled), renders again when they change or go,
and fails naming the 403 when it reads another job's variable; the Task
API socket answers 401 without a token and 403 for one the state does not
know, then proxies Nomad's HTTP API (the gateway, served in this process)
where the identity reads its own job's variables and not another job's,
an ACL token without variable rights is refused, and a blocking query
passes through."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from corral.domain import services
from corral.domain.template import block
from corral.runtime.http_server import HttpServer
from corral.runtime.settings import SecuritySettings
from corral.security.acl_resolve import RemoteResolver
from corral.testing import mock
from corral.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    service_pb2,
    service_pb2_grpc,
    variables_pb2,
    variables_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.agent.allocdir import AllocDir
from services.agent.task_api import TaskAPI
from services.agent.template_data import GrpcFetcher, Retry, TemplateData
from services.agent.template_hook import (
    RESTART_REASON,
    TaskPaths,
    TemplateFailed,
    TemplateManager,
    client_variables,
)
from services.gateway.app import create_app
from services.gateway.backend import Backend
from services.gateway.config import GatewaySettings
from services.state.app import StateApp
from tests.callers import user_channel
from tests.integration.state_api.settings import state_settings
from tests.wait import until

NODE_SECRET = "node-secret-templates-0123"


class World:
    def __init__(self, app: StateApp) -> None:
        self.app = app
        self.address = app.server.bound_address
        self.channels: list[grpc.aio.Channel] = []
        self.tokens: dict[str, str] = {}
        self.node = pb.Node()
        self.allocs: dict[str, pb.Allocation] = {}
        self.gateway = ""

    def channel(self, token: str = "") -> grpc.aio.Channel:
        ch = user_channel(self.address, token)
        self.channels.append(ch)
        return ch

    @property
    def mgmt(self) -> grpc.aio.Channel:
        return self.channel(self.tokens["management"])

    async def put_var(self, path: str, **items: str) -> None:
        v = pb.Variable(metadata=pb.VariableMetadata(path=path))
        v.items.update(items)
        await variables_pb2_grpc.VariablesStub(self.mgmt).Apply(
            variables_pb2.VariablesApplyRequest(op="set", variable=v)
        )

    async def identity(self, job_id: str) -> str:
        alloc = self.allocs[job_id]
        resp = await node_pb2_grpc.NodeStub(self.channel()).SignIdentities(
            node_pb2.NodeSignIdentitiesRequest(
                node_id=self.node.id,
                secret_id=NODE_SECRET,
                identities=[
                    node_pb2.WorkloadIdentityRequest(
                        alloc_id=alloc.id,
                        task=alloc_task(),
                        identity="default",
                    )
                ],
            )
        )
        assert not resp.rejections, resp.rejections
        return resp.signed[0].jwt

    def db_registration(self, port: int) -> pb.ServiceRegistration:
        alloc = self.allocs["db"]
        service = pb.Service(name="db", port_label="db")
        return pb.ServiceRegistration(
            id=services.registration_id(alloc.id, "db", service),
            service_name="db",
            alloc_id=alloc.id,
            address="10.0.0.9",
            port=port,
        )

    async def register_db(self, port: int) -> None:
        await service_pb2_grpc.ServiceRegistrationStub(self.channel()).Upsert(
            service_pb2.ServiceUpsertRequest(
                node_id=self.node.id,
                secret_id=NODE_SECRET,
                registrations=[self.db_registration(port)],
            )
        )

    async def deregister_db(self) -> None:
        await service_pb2_grpc.ServiceRegistrationStub(self.channel()).Deregister(
            service_pb2.ServiceDeregisterRequest(
                node_id=self.node.id,
                secret_id=NODE_SECRET,
                ids=[self.db_registration(0).id],
            )
        )


def alloc_task() -> str:
    return mock.job().task_groups[0].tasks[0].name


@pytest.fixture(scope="module")
async def state_app(pg_dsn: str) -> AsyncIterator[StateApp]:
    """ACLs on; heartbeat TTLs beyond the module's run (the node here never
    heartbeats, and a node marked down would lose its services)."""
    settings = state_settings(pg_dsn, acl=True)
    beats = settings.heartbeat.model_copy(update={"min_ttl": 3600.0})
    app = StateApp(settings.model_copy(update={"heartbeat": beats}))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture(scope="module")
async def world(state_app: StateApp) -> AsyncIterator[World]:
    w = World(state_app)
    boot = await acl_pb2_grpc.ACLStub(w.channel()).Bootstrap(acl_pb2.ACLBootstrapRequest())
    w.tokens["management"] = boot.token.secret_id
    acls = acl_pb2_grpc.ACLStub(w.mgmt)
    await acls.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[
                acl_pb2.ACLPolicy(name="jobs", rules='namespace "default" { policy = "read" }')
            ]
        )
    )
    made = await acls.CreateToken(acl_pb2.ACLCreateTokenRequest(name="jobs", policies=["jobs"]))
    w.tokens["jobs"] = made.token.secret_id
    node = mock.node()
    node.secret_id = NODE_SECRET
    await node_pb2_grpc.NodeStub(w.mgmt).Register(node_pb2.NodeRegisterRequest(node=node))
    w.node = node
    for job_id in ("web", "db"):
        await job_pb2_grpc.JobStub(w.mgmt).Register(
            job_pb2.JobRegisterRequest(job=mock.job(job_id=job_id, count=1))
        )
    async with state_app.db.write() as tx:
        for job_id in ("web", "db"):
            stored = await tx.get_job("default", job_id)
            assert stored is not None
            alloc = mock.alloc(stored, node)
            alloc.client_status = "running"
            tx.put_alloc(alloc, "AllocationUpdated")
            w.allocs[job_id] = alloc
    await state_app.feed.wait_visible(tx.index)
    await w.put_var("nomad/jobs/web", password="one")
    await w.put_var("nomad/jobs/db", password="not yours")
    await w.register_db(5432)

    backend = Backend(w.address)
    app = create_app(GatewaySettings(state_addr=w.address), backend)
    server = HttpServer("127.0.0.1:0", app, name="gateway")
    await server.start()
    w.gateway = server.url
    try:
        yield w
    finally:
        await server.stop()
        await backend.close()
        for ch in w.channels:
            await ch.close()


class Task:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.restarts: list[str] = []
        self.killed: list[str] = []

    def emit(self, kind: str, display: str, *, fails_task: bool = False) -> None:
        self.events.append((kind, display))

    def is_running(self) -> bool:
        return True

    async def restart_task(self, reason: str) -> None:
        self.restarts.append(reason)

    async def signal_task(self, name: str) -> None:
        raise AssertionError("no signal templates here")

    async def kill_task(self, display: str) -> None:
        self.killed.append(display)

    async def exec_in_task(self, command: Sequence[str], timeout: float) -> int:
        raise AssertionError("no script templates here")


class Counting(GrpcFetcher):
    calls = 0

    async def fetch(self, dep: Any, index: int) -> Any:
        type(self).calls += 1
        return await super().fetch(dep, index)


def manager(
    world: World, tmp_path: Path, token: str, text: str, task: Task, fetcher: type = GrpcFetcher
) -> tuple[TemplateManager, Path]:
    alloc = AllocDir.of(tmp_path, world.allocs["web"].id)
    alloc.build()
    task_dir = alloc.task("web")
    task_dir.build()
    t = pb.Task(templates=[pb.Template(embedded_tmpl=text, dest_path="local/out", splay=0)])
    block.canonicalize(t)

    async def identity() -> str:
        return token

    data = TemplateData(
        fetcher(world.channel(), identity, wait_ms=60_000),
        retry=Retry(attempts=1, backoff=0.05, max_backoff=0.05),
    )
    m = TemplateManager(
        t.templates,
        data=data,
        lifecycle=task,
        env=lambda: {},
        paths=TaskPaths(
            alloc_dir=str(alloc.dir),
            task_dir=str(task_dir.dir),
            shared_dir=str(alloc.shared),
            variables=client_variables({}, task_dir),
        ),
        namespace="default",
    )
    return m, task_dir.dir / "local" / "out"


TEMPLATE = (
    '{{ with nomadVar "nomad/jobs/web" }}password={{ .password }}{{ end }}\n'
    '{{ range nomadService "db" }}db={{ .Address }}:{{ .Port }}{{ else }}db=none{{ end }}\n'
)


async def test_templates_read_with_the_tasks_identity_and_follow_changes(
    world: World, tmp_path: Path
) -> None:
    task = Task()
    token = await world.identity("web")
    m, out = manager(world, tmp_path, token, TEMPLATE, task, Counting)
    await asyncio.wait_for(m.render_first(), 30)
    m.start()
    assert out.read_text() == "password=one\ndb=10.0.0.9:5432\n"
    # blocking queries: nothing changes, nothing is asked again
    calls = Counting.calls
    await asyncio.sleep(1.0)
    assert Counting.calls == calls

    await world.put_var("nomad/jobs/web", password="two")
    await until(lambda: out.read_text() == "password=two\ndb=10.0.0.9:5432\n", timeout=30)
    await until(lambda: task.restarts == [RESTART_REASON], timeout=10)

    await world.deregister_db()
    await until(lambda: out.read_text() == "password=two\ndb=none\n", timeout=30)
    await world.register_db(6543)
    await until(lambda: out.read_text() == "password=two\ndb=10.0.0.9:6543\n", timeout=30)
    assert task.killed == []
    await m.stop()


async def test_another_jobs_variable_fails_the_template(world: World, tmp_path: Path) -> None:
    task = Task()
    token = await world.identity("web")
    text = '{{ with nomadVar "nomad/jobs/db" }}{{ .password }}{{ end }}'
    m, out = manager(world, tmp_path, token, text, task)
    with pytest.raises(TemplateFailed, match=r"Template failed: nomad\.var\.get\(nomad/jobs/db"):
        await asyncio.wait_for(m.render_first(), 30)
    await m.stop()
    assert not out.exists()


# --------------------------------------------------------------------------- the Task API


@pytest.fixture
async def api(world: World, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    resolver = RemoteResolver(world.channel())
    task_api = TaskAPI(world.gateway, resolver, security=SecuritySettings())
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    sock = await task_api.open(secrets, "")
    client = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(secrets / "api.sock")),
        base_url="http://localhost",
        timeout=30,
    )
    try:
        yield client
    finally:
        await client.aclose()
        await sock.close()
        await task_api.close()
    assert not (secrets / "api.sock").exists()


async def test_the_task_api_needs_a_token(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/var/nomad/jobs/web")).status_code == 401
    assert (await api.get("/v1/agent/self")).status_code == 401
    bad = await api.get("/v1/var/nomad/jobs/web", headers={"X-Nomad-Token": "not-a-token"})
    assert (bad.status_code, bad.text) == (403, "Forbidden")


async def test_the_task_api_reads_the_tasks_own_variables(
    world: World, api: httpx.AsyncClient
) -> None:
    token = await world.identity("web")
    own = await api.get("/v1/var/nomad/jobs/web", headers={"X-Nomad-Token": token})
    assert own.status_code == 200, own.text
    assert own.json()["Items"]["password"] in ("one", "two")
    bearer = {"Authorization": f"Bearer {token}"}
    other = await api.get("/v1/var/nomad/jobs/db", headers=bearer)
    assert other.status_code == 403, other.text
    # an ACL token passes the socket; its rights (no variables) decide at the API
    jobs = {"X-Nomad-Token": world.tokens["jobs"]}
    assert (await api.get("/v1/var/nomad/jobs/web", headers=jobs)).status_code == 403
    assert (await api.get("/v1/jobs", headers=jobs)).status_code == 200


async def test_a_blocking_query_passes_through(world: World, api: httpx.AsyncClient) -> None:
    token = {"X-Nomad-Token": await world.identity("web")}
    first = await api.get("/v1/var/nomad/jobs/web", headers=token)
    index = int(first.headers["X-Nomad-Index"])
    waiting = asyncio.create_task(
        api.get("/v1/var/nomad/jobs/web", headers=token, params={"index": index, "wait": "20s"})
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await world.put_var("nomad/jobs/web", password="blocking")
    answer = await asyncio.wait_for(waiting, 20)
    assert answer.json()["Items"]["password"] == "blocking"
    assert int(answer.headers["X-Nomad-Index"]) > index


async def test_the_socket_belongs_to_the_tasks_user(world: World, tmp_path: Path) -> None:
    task_api = TaskAPI(
        world.gateway,
        RemoteResolver(world.channel()),
        security=SecuritySettings(),
    )
    for user, mode in (("", 0o666), ("nobody", 0o600)):
        secrets = tmp_path / (user or "none")
        secrets.mkdir()
        sock = await task_api.open(secrets, user)
        st = os.stat(secrets / "api.sock")
        assert stat.S_ISSOCK(st.st_mode)
        if os.geteuid() == 0:
            assert stat.S_IMODE(st.st_mode) == mode
            if user:
                assert st.st_uid == 65534
        await sock.close()
    await task_api.close()
