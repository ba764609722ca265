"""The client side of Nomad's native service discovery, piece by piece: the
port variables tasks see, the instances an alloc registers (address,
canary tags, interpolation), http and tcp checks against real sockets,
deployment health that waits for the checks, check_restart's timing, and
the sync that keeps the catalog told (retrying what the state refused)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import grpc
import pytest

from corral.domain import services
from corral.domain.structs import SECOND, TaskStateName
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.agent import taskenv
from services.agent.alloc_services import AllocServices, resolve_address
from services.agent.check_watch import CheckWatcher, watch_for
from services.agent.checks import Checker, CheckRunner, CheckTarget
from services.agent.drivers.mock import MockDriver
from services.agent.health import HealthJudge
from services.agent.runner import AllocRunner
from services.agent.service_sync import ServiceSync
from tests.wait import until

# ------------------------------------------------------------------ fixtures


def job_with_services() -> pb.Job:
    job = mock.job(job_id="shop", count=1)
    tg = job.task_groups[0]
    tg.networks.add(
        mode="host",
        dynamic_ports=[pb.Port(label="http")],
        reserved_ports=[pb.Port(label="admin", value=9000)],
    )
    tg.services.add(
        name="shop-${NOMAD_ALLOC_INDEX}",
        port_label="http",
        provider="nomad",
        tags=["live"],
        canary_tags=["canary"],
        meta={"dc": "${node.datacenter}"},
        checks=[
            pb.ServiceCheck(
                name="alive", type="tcp", interval=SECOND, timeout=SECOND, port_label="admin"
            )
        ],
    )
    tg.tasks[0].services.add(name="web-task", port_label="http", provider="nomad", task_name="web")
    services.canonicalize(job)
    return job


def placed(job: pb.Job, node: pb.Node) -> pb.Allocation:
    alloc = mock.alloc(job, node)
    alloc.resources.networks.add(
        mode="host",
        dynamic_ports=[pb.Port(label="http", value=23456)],
        reserved_ports=[pb.Port(label="admin", value=9000)],
    )
    return alloc


def _dirs(tmp: Path) -> taskenv.TaskDirs:
    return taskenv.TaskDirs(str(tmp / "alloc"), str(tmp / "local"), str(tmp / "secrets"))


class FakeCatalog:
    """The state's side of ServiceSync: records calls, refuses on demand."""

    def __init__(self) -> None:
        self.registered: dict[str, pb.ServiceRegistration] = {}
        self.calls = 0
        self.refuse = 0

    def _maybe_refuse(self) -> None:
        self.calls += 1
        if self.refuse:
            self.refuse -= 1
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="state unavailable",
            )

    async def upsert(self, regs: Sequence[pb.ServiceRegistration]) -> None:
        self._maybe_refuse()
        for r in regs:
            self.registered[r.id] = r

    async def deregister(self, namespace: str, ids: Sequence[str]) -> None:
        self._maybe_refuse()
        for i in ids:
            self.registered.pop(i, None)


@pytest.fixture
async def catalog() -> AsyncIterator[tuple[FakeCatalog, ServiceSync]]:
    fake = FakeCatalog()
    sync = ServiceSync(fake.upsert, fake.deregister)
    sync.start()
    try:
        yield fake, sync
    finally:
        await sync.stop()


# ------------------------------------------------------------------ ports and addresses


def test_tasks_see_nomads_port_variables(tmp_path: Path) -> None:
    job = job_with_services()
    node = mock.node()
    alloc = placed(job, node)
    alloc.resources.networks[0].dynamic_ports[0].to = 8080
    env = taskenv.build(
        alloc, job, job.task_groups[0].tasks[0], node, dirs=_dirs(tmp_path), home=str(tmp_path)
    ).env
    assert env["NOMAD_PORT_http"] == "8080" and env["NOMAD_HOST_PORT_http"] == "23456"
    assert env["NOMAD_ADDR_http"] == "192.168.0.100:23456"
    assert env["NOMAD_IP_admin"] == "192.168.0.100" and env["NOMAD_PORT_admin"] == "9000"
    assert env["NOMAD_ALLOC_PORT_admin"] == "9000"


def test_address_resolution() -> None:
    ports = [pb.Port(label="http", value=23456)]
    assert resolve_address("", "auto", "http", ports, "10.0.0.1") == ("10.0.0.1", 23456)
    assert resolve_address("", "host", "", ports, "10.0.0.1") == ("10.0.0.1", 0)
    assert resolve_address("lb.example", "auto", "http", ports, "10.0.0.1") == ("lb.example", 23456)
    assert resolve_address("lb.example", "auto", "8443", ports, "10.0.0.1") == ("lb.example", 8443)
    assert resolve_address("", "host", "8080", ports, "10.0.0.1") == ("10.0.0.1", 8080)
    with pytest.raises(ValueError, match="port label not found"):
        resolve_address("", "host", "grpc", ports, "10.0.0.1")


async def test_an_alloc_registers_its_group_and_task_services(
    tmp_path: Path, catalog: tuple[FakeCatalog, ServiceSync]
) -> None:
    fake, sync = catalog
    job = job_with_services()
    node = mock.node()
    alloc = placed(job, node)
    restarts: list[tuple[str, str]] = []

    def env_of(task: str) -> taskenv.TaskEnv:
        t = job.task_groups[0].tasks[0] if task else pb.Task()
        return taskenv.build(alloc, job, t, node, dirs=_dirs(tmp_path), home=str(tmp_path))

    checker = Checker()
    svc = AllocServices(
        lambda: alloc,
        lambda: job,
        node,
        sync,
        checker,
        env_of,
        lambda t, r: restarts.append((t, r)),
    )
    svc.start()
    try:
        await until(lambda: len(fake.registered) == 1, what="the group's service")
        (group,) = fake.registered.values()
        assert group.id == f"_nomad-task-{alloc.id}-group-web-shop-0-http"
        assert (group.service_name, group.address, group.port) == ("shop-0", "192.168.0.100", 23456)
        assert list(group.tags) == ["live"] and dict(group.meta) == {"dc": "dc1"}
        svc.task_started("web")
        await until(lambda: len(fake.registered) == 2, what="the task's service")
        assert fake.registered[f"_nomad-task-{alloc.id}-web-web-task-http"].port == 23456
        # a canary registers its canary tags; the update is an upsert of the same instance
        alloc.deployment_status.canary = True
        svc.refresh()
        await until(lambda: list(fake.registered[group.id].tags) == ["canary"], what="canary tags")
        svc.task_stopped("web")
        await until(lambda: len(fake.registered) == 1, what="the task's service gone")
        (result,) = svc.results()
        assert result.check == "alive" and result.group == alloc.name
        await svc.deregister()
        assert fake.registered == {}
    finally:
        await svc.stop()
        await checker.close()


async def test_the_sync_retries_what_the_state_refused(
    catalog: tuple[FakeCatalog, ServiceSync],
) -> None:
    fake, sync = catalog
    fake.refuse = 2
    reg = pb.ServiceRegistration(id="_nomad-task-a-t-s-", service_name="s", alloc_id="a")
    sync.set("owner", [reg])
    assert await sync.flush(10)
    assert fake.calls == 3 and list(fake.registered) == [reg.id]
    sync.clear("owner")
    assert await sync.flush(10)
    assert fake.registered == {}


# ------------------------------------------------------------------ checks


class _Handler(BaseHTTPRequestHandler):
    status = 200
    seen: list[tuple[str, str, str | None]] = []

    def _answer(self) -> None:
        self.seen.append((self.command, self.path, self.headers.get("X-Probe")))
        body = b"not today" if self.status >= 400 else b"fine"
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        _Handler.status = 200
        _Handler.seen.clear()


def target(port: int, **check: object) -> CheckTarget:
    spec = pb.ServiceCheck(interval=SECOND, timeout=SECOND, **check)  # type: ignore[arg-type]
    return CheckTarget(
        id="c1", check=spec, group="g", task="", service="s", host="127.0.0.1", port=port
    )


async def test_http_checks(http_server: int) -> None:
    checker = Checker()
    try:
        probe = target(
            http_server, name="h", type="http", path="/health?x=1", method="POST",
            header={"X-Probe": pb.CheckHeaderValues(values=["yes"])},
        )  # fmt: skip
        ok = await checker.run(probe)
        assert (ok.status, ok.status_code, ok.output) == ("success", 200, "nomad: http ok")
        assert _Handler.seen[-1] == ("POST", "/health?x=1", "yes")
        _Handler.status = 503
        down = await checker.run(probe)
        assert (down.status, down.status_code, down.output) == ("failure", 503, "not today")
        _Handler.status = 302  # a 3xx answer passes, as in Nomad
        assert (await checker.run(probe)).status == "success"
    finally:
        await checker.close()


async def test_tcp_checks_and_unreachable_addresses(http_server: int) -> None:
    checker = Checker()
    try:
        assert (await checker.run(target(http_server, type="tcp"))).output == "nomad: tcp ok"
        with contextlib.closing(__import__("socket").socket()) as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        refused = await checker.run(target(closed, type="tcp"))
        assert refused.status == "failure" and "dial tcp" in refused.output
        http = await checker.run(target(closed, type="http", path="/"))
        assert http.status == "failure" and http.output.startswith("nomad: http://127.0.0.1")
    finally:
        await checker.close()


async def test_the_runner_keeps_the_latest_result_per_check(http_server: int) -> None:
    checker = Checker()
    runner = CheckRunner(checker)
    try:
        first = target(http_server, name="h", type="http", path="/", initial_status="critical")
        runner.observe([first])
        assert runner.results["c1"].status == "failure"  # its initial status, before it ran
        await until(lambda: runner.results["c1"].status == "success", what="the first run")
        runner.observe([])
        assert runner.results == {}
    finally:
        await runner.stop()
        await checker.close()


# ------------------------------------------------------------------ health and restarts


def _result(status: str, mode: str = services.HEALTHINESS) -> pb.CheckResult:
    return pb.CheckResult(id=status + mode, status=status, mode=mode)


def test_deployment_health_waits_for_the_checks() -> None:
    up = pb.UpdateStrategy(
        health_check="checks", min_healthy_time=2 * SECOND, healthy_deadline=10 * SECOND
    )
    states = [pb.TaskState(state=TaskStateName.RUNNING)]
    judge = HealthJudge(up, 100.0, states)
    pending = [_result("pending")]
    assert judge.observe(states, 100.0, pending) is None
    assert judge.observe(states, 103.0, pending) is None  # the task has run long enough
    passing = [_result("success"), _result("failure", services.READINESS)]
    assert judge.observe(states, 103.0, passing) is None  # checks start their wait
    assert judge.observe(states, 104.5, [_result("failure")]) is None  # and start it over
    assert judge.observe(states, 105.0, passing) is None
    assert judge.observe(states, 107.0, passing) is True
    stuck = HealthJudge(up, 100.0, states)
    assert stuck.observe(states, 105.0, [_result("failure")]) is None
    assert stuck.observe(states, 110.0, [_result("failure")]) is False  # healthy_deadline


def test_check_restart_timing() -> None:
    check = pb.ServiceCheck(
        name="alive", interval=2 * SECOND, check_restart=pb.CheckRestart(limit=3, grace=5 * SECOND)
    )
    restarted: list[tuple[str, str]] = []
    watcher = CheckWatcher(lambda task, reason: restarted.append((task, reason)))
    w = watch_for("c1", check, "web", now=100.0)
    assert w is not None and w.time_limit == 4.0
    watcher.watch(w)
    failing = {"c1": pb.CheckResult(status="failure")}
    watcher.poll(failing, now=104.0)  # within grace
    watcher.poll(failing, now=106.0)  # unhealthy from here
    watcher.poll({"c1": pb.CheckResult(status="success")}, now=108.0)  # healthy again: reset
    watcher.poll(failing, now=109.0)
    watcher.poll(failing, now=112.9)
    assert restarted == []
    watcher.poll(failing, now=113.0)
    assert restarted == [("web", 'healthcheck: check "alive" unhealthy')]
    assert watcher.watches == {}  # re-armed when the task runs again
    assert watch_for("c2", pb.ServiceCheck(interval=SECOND), "web") is None


# ------------------------------------------------------------------ an alloc stopping


async def test_a_stopping_alloc_deregisters_then_waits_its_shutdown_delays(
    tmp_path: Path, catalog: tuple[FakeCatalog, ServiceSync]
) -> None:
    fake, sync = catalog
    job = job_with_services()
    tg = job.task_groups[0]
    tg.shutdown_delay = SECOND // 5
    tg.tasks[0].shutdown_delay = SECOND // 5
    tg.tasks[0].config.Clear()
    tg.tasks[0].config.update({"run_for": "0"})
    alloc = placed(job, mock.node())
    checker = Checker()
    runner = AllocRunner(
        alloc,
        job,
        {"mock": MockDriver()},
        tmp_path,
        lambda r: None,
        node=mock.node(),
        sync=sync,
        checker=checker,
    )
    runner.start()
    try:
        await until(lambda: len(fake.registered) == 2, what="group and task services")
        task = runner.tasks[0]
        await runner.stop()
        assert fake.registered == {}
        kinds = [e.type for e in task.state.events]
        # deregistered, waited, then killed; Nomad records the Killing event
        # when the kill is asked for, before the delay is waited out
        assert kinds.index("Killing") < kinds.index("Waiting for shutdown delay")
        assert kinds.index("Waiting for shutdown delay") < kinds.index("Terminated")
        assert task.state.state == TaskStateName.DEAD
    finally:
        await checker.close()


async def test_no_shutdown_delay_skips_it(tmp_path: Path) -> None:
    job = job_with_services()
    job.task_groups[0].tasks[0].shutdown_delay = 60 * SECOND
    job.task_groups[0].tasks[0].config.Clear()
    job.task_groups[0].tasks[0].config.update({"run_for": "0"})
    alloc = placed(job, mock.node())
    alloc.desired_transition.no_shutdown_delay = True
    runner = AllocRunner(alloc, job, {"mock": MockDriver()}, tmp_path, lambda r: None)
    runner.start()
    await until(lambda: runner.tasks[0].state.state == TaskStateName.RUNNING, what="running")
    await asyncio.wait_for(runner.stop(), 10)
    assert "Skipping shutdown delay" in [e.type for e in runner.tasks[0].state.events]
