"""The fuzz test's cluster and budgets.

One real cluster of processes (state, broker, planner, worker) per module,
seeded with nodes and jobs so that ids exist: ready nodes, a service job
with a deployment, a batch job, a parameterized and a periodic job, a job
in a second namespace; the worker places their allocs. Node heartbeat TTLs
are long and the broker's periodic GC is off, so the cluster writes only
when asked (the checks still tolerate the writes a successful request sets
off; see checks.py).

Budgets (`CORRAL_FUZZ_PROFILE`):

* `bounded` (default, what `make test` runs): 50 examples per public RPC,
  6 per internal one, derandomized so every run sends the same requests,
  about a minute and a half on two cores;
* `long`: thousands of examples per RPC with fresh randomness on each run
  (docs/contributing.md);
* `CORRAL_FUZZ_EXAMPLES=<n>` sets the examples per public RPC of either.

`CORRAL_FUZZ_ACL=1` runs the cluster with ACLs enforced (needs the ACL
service): the fuzzer's own client then uses the bootstrap token.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
from hypothesis import HealthCheck, settings

from corral.devtools.pgserver import with_database
from corral.domain import structs
from corral.security import transport
from corral.testing import mock
from corral.v1 import (
    job_pb2,
    job_pb2_grpc,
    namespace_pb2,
    namespace_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    operator_pb2,
    operator_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.conftest import drop_database, new_database
from tests.fuzz import rpcs
from tests.fuzz.checks import StateProbe
from tests.fuzz.messages import message_class
from tests.fuzz.pool import Pool, refresh
from tests.wait import wait_for


@dataclass(frozen=True)
class Budget:
    """Examples per RPC: public RPCs get many, internal ones (which must
    refuse everything from a non-server) fewer."""

    public: int
    internal: int
    derandomize: bool


PROFILES = {
    "bounded": Budget(public=50, internal=6, derandomize=True),
    "long": Budget(public=2_000, internal=300, derandomize=False),
}


def budget() -> Budget:
    name = os.environ.get("CORRAL_FUZZ_PROFILE", "bounded")
    if name not in PROFILES:
        raise pytest.UsageError(
            f"CORRAL_FUZZ_PROFILE={name!r}: expected one of {', '.join(PROFILES)}"
        )
    b = PROFILES[name]
    examples = os.environ.get("CORRAL_FUZZ_EXAMPLES")
    if examples:  # e.g. a hunt of a few hundred per RPC, between the two
        n = int(examples)
        b = Budget(public=n, internal=max(1, n // 5), derandomize=b.derandomize)
    return b


def hypothesis_settings(max_examples: int) -> settings:
    b = budget()
    return settings(
        max_examples=max_examples,
        derandomize=b.derandomize,
        database=None,
        deadline=None,
        print_blob=not b.derandomize,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


@dataclass
class Fuzz:
    cluster: Cluster
    targets: list[rpcs.Rpc]
    unruled: list[str]
    #: served methods that take a request stream (not fuzzed: rpcs.discover)
    request_streams: list[str]
    callers: rpcs.Callers
    probe: StateProbe
    pool: Pool
    token: str = ""
    #: the scheduler configuration the cluster started with
    initial_config: pb.SchedulerConfiguration | None = None

    def refresh(self) -> Pool:
        return refresh(self.pool, self.cluster.dsn)

    def top_up(self) -> Pool:
        """Put back what earlier RPCs' fuzz took away (successful requests
        deregister nodes, stop jobs, stop the scheduler loops, pause the
        broker), so each RPC meets a cluster with ready nodes, live jobs
        and working schedulers."""
        pool = self.refresh()
        with transport.dial_sync(self.cluster.state_addr, token=self.token) as ch:
            usable = [
                n
                for n in pool.nodes
                if n.id in pool.secrets
                and n.status == structs.NodeStatus.READY
                and n.scheduling_eligibility == structs.Eligibility.ELIGIBLE
                and not n.drain
            ]
            nodes = node_pb2_grpc.NodeStub(ch)
            for _ in range(SEED_NODES - len(usable)):
                n = mock.node()
                nodes.Register(node_pb2.NodeRegisterRequest(node=n), timeout=30)
                pool.secrets[n.id] = n.secret_id
            _seed_namespaces(ch)
            live = _live_jobs(self.cluster.dsn)
            jobs = job_pb2_grpc.JobStub(ch)
            for j in _seed_jobs():
                if (j.namespace, j.id) not in live:
                    jobs.Register(job_pb2.JobRegisterRequest(job=j), timeout=30)
            if _settings_of(pool.scheduler_config) != _settings_of(self.initial_config):
                operator_pb2_grpc.OperatorStub(ch).SchedulerSetConfiguration(
                    operator_pb2.SchedulerSetConfigurationRequest(
                        config=_settings_of(self.initial_config)
                    ),
                    timeout=30,
                )
        with transport.dial_sync(self.cluster.procs["worker"].address, token=self.token) as ch:
            workers = worker_pb2_grpc.WorkerStub(ch)
            want = worker_pb2.WorkerPoolConfig(
                num_schedulers=WORKER_LOOPS, enabled_schedulers=list(structs.JobType.ALL)
            )
            if workers.GetConfig(worker_pb2.WorkerConfigRequest(), timeout=30) != want:
                workers.SetConfig(want, timeout=60)
            listed = workers.List(worker_pb2.WorkerListRequest(), timeout=30)
            if any(w.status in ("pausing", "paused") for w in listed.workers):
                workers.Resume(worker_pb2.WorkerControlRequest(), timeout=30)
        return self.refresh()


SEED_NODES = 3
WORKER_LOOPS = 2


def _settings_of(config: pb.SchedulerConfiguration | None) -> pb.SchedulerConfiguration:
    """The configuration without its indexes."""
    out = pb.SchedulerConfiguration()
    if config is not None:
        out.CopyFrom(config)
    out.create_index = out.modify_index = 0
    return out


def _live_jobs(dsn: str) -> set[tuple[str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT namespace, id FROM jobs WHERE NOT stop").fetchall()
    return {(str(ns), str(i)) for ns, i in rows}


def _seed_jobs() -> list[pb.Job]:
    service = mock.job(job_id="fuzz-web", count=2)
    service.task_groups[0].update.CopyFrom(
        pb.UpdateStrategy(
            max_parallel=1,
            health_check="task_states",
            min_healthy_time=10 * structs.SECOND,
            healthy_deadline=5 * structs.MINUTE,
            progress_deadline=10 * structs.MINUTE,
        )
    )
    batch = mock.batch_job(job_id="fuzz-batch", count=1)
    dispatchable = mock.batch_job(job_id="fuzz-dispatch", count=1)
    dispatchable.parameterized.CopyFrom(
        pb.ParameterizedConfig(payload="optional", meta_optional=["who"])
    )
    periodic = mock.batch_job(job_id="fuzz-periodic", count=1)
    periodic.periodic.CopyFrom(
        pb.PeriodicConfig(enabled=True, spec="0 0 1 1 *", prohibit_overlap=True)
    )
    other_namespace = mock.job(job_id="fuzz-prod", count=1)
    other_namespace.namespace = "prod"
    return [service, batch, dispatchable, periodic, other_namespace]


def _seed_namespaces(ch: grpc.Channel) -> None:
    """The seed jobs' namespaces, as plain as they started (an earlier RPC's
    fuzz may have deleted "prod", or narrowed what a namespace admits);
    unchanged ones cost no write."""
    namespace_pb2_grpc.NamespaceStub(ch).Upsert(
        namespace_pb2.NamespaceUpsertRequest(
            namespaces=[
                pb.Namespace(name="default", description="Default shared namespace"),
                pb.Namespace(name="prod"),
            ]
        ),
        timeout=30,
    )


def _seed(c: Cluster, pool: Pool, token: str) -> None:
    with transport.dial_sync(c.state_addr, token=token) as ch:
        nodes = node_pb2_grpc.NodeStub(ch)
        for _ in range(SEED_NODES):
            n = mock.node()
            nodes.Register(node_pb2.NodeRegisterRequest(node=n), timeout=30)
            pool.secrets[n.id] = n.secret_id
        _seed_namespaces(ch)
        jobs = job_pb2_grpc.JobStub(ch)
        for j in _seed_jobs():
            jobs.Register(job_pb2.JobRegisterRequest(job=j), timeout=30)

    def placed() -> bool:
        with psycopg.connect(c.dsn, autocommit=True) as conn:
            allocs = conn.execute("SELECT count(*) FROM allocs").fetchone()
            deployments = conn.execute("SELECT count(*) FROM deployments").fetchone()
        # fuzz-web 2, fuzz-batch 1, fuzz-prod 1
        return bool(allocs and allocs[0] >= 4 and deployments and deployments[0] >= 1)

    wait_for("the seed jobs' allocs placed", placed, timeout=60)


def _bootstrap_token(found: list[rpcs.Rpc]) -> str:
    """A management token from the state's ACL service (`ACL.Bootstrap`)."""
    bootstrap = [r for r in found if r.method == "/corral.v1.ACL/Bootstrap"]
    if not bootstrap:
        raise pytest.UsageError("CORRAL_FUZZ_ACL=1 needs the state's ACL service")
    rpc = bootstrap[0]
    answer = rpcs.Callers().call(rpc, message_class(rpc.input)(), rpcs.As.USER, timeout=30)
    assert answer.ok, answer.details
    token = getattr(answer.responses[0], "token", None)
    return str(getattr(token, "secret_id", ""))


@pytest.fixture(scope="module")
def fuzz(
    request: pytest.FixtureRequest,
    pg_admin_dsn: str,
    pg_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fuzz]:
    acl = os.environ.get("CORRAL_FUZZ_ACL", "") == "1"
    name = new_database(pg_admin_dsn, pg_template, "fuzz")
    workdir: Path = tmp_path_factory.mktemp("fuzz-cluster")
    env = {"CORRAL_ACL_ENABLED": "true"} if acl else {}
    c = Cluster(with_database(pg_admin_dsn, name), workdir, env=env)
    probe: StateProbe | None = None
    callers: rpcs.Callers | None = None
    try:
        c.start("state", "--heartbeat-min-ttl", "3600")
        c.start("broker", "--core-gc-interval", "0")
        c.start("planner")
        c.start("worker", "--num-schedulers", str(WORKER_LOOPS))
        addresses = {p.role: p.address for p in c.procs.values()}
        found, unruled, request_streams = rpcs.discover(addresses)
        token = _bootstrap_token(found) if acl else ""
        pool = Pool()
        # unknown (a deleted token looks the same to the server) and garbage
        callers = rpcs.Callers(acl_token=token)
        _seed(c, pool, token)
        probe = StateProbe(c.state_addr, c.dsn)
        pool = refresh(pool, c.dsn)
        yield Fuzz(
            c, found, unruled, request_streams, callers, probe, pool, token, pool.scheduler_config
        )
    finally:
        if probe is not None:
            probe.close()
        if callers is not None:
            callers.close()
        c.stop_all()
        drop_database(pg_admin_dsn, name)
