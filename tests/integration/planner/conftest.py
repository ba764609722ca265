"""The planner's applier core (replica, plan queue, applier) in-process, over
the state service of tests/integration/conftest.py.

Plans are put straight into the plan queue here; the token check and the
process with leader election are exercised in test_planner_process.py. The
applier writes as the planner leader: the test holds that lock
(`planner_leader`), since the state refuses plans from anyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

from corral.domain.structs import copy_msg
from corral.runtime.replica import Replica
from corral.testing.invariants import check_state, errors
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb
from services.planner.applier import PlanApplier
from services.planner.config import PlannerSettings
from services.planner.plan_queue import PlanQueue
from services.planner.state_client import StateClient
from services.state.app import StateApp
from tests.cluster import Cluster
from tests.leaders import in_office


@pytest.fixture(scope="module")
async def cluster(
    pg_dsn: str, state_addr: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cluster]:
    """A broker process around the in-process state service; a test starts
    its planner processes in it."""
    c = Cluster(pg_dsn, tmp_path_factory.mktemp("planner-procs"), state_address=state_addr)
    broker = await c.start_async("broker")
    await in_office(broker.address)  # the tests call it with a bare stub
    try:
        yield c
    finally:
        for name in reversed(list(c.procs)):
            await c.stop_async(name)


async def seed(
    app: StateApp,
    *,
    nodes: list[pb.Node] | tuple[()] = (),
    jobs: list[pb.Job] | tuple[()] = (),
    allocs: list[pb.Allocation] | tuple[()] = (),
) -> int:
    """Write objects through the state's own indexed write path (as the
    public Node/Job APIs would); returns the index."""
    async with app.db.write() as tx:
        for n in nodes:
            tx.put_node(copy_msg(n))
        for j in jobs:
            tx.put_job(copy_msg(j))
        for a in allocs:
            tx.put_alloc(copy_msg(a))
    return tx.index


@dataclass
class PlannerCore:
    replica: Replica
    queue: PlanQueue
    applier: PlanApplier
    client: GatedStateClient
    task: asyncio.Task[None]

    async def submit(self, plan: pb.Plan, timeout: float = 30.0) -> pb.PlanResult:
        pending = self.queue.enqueue(plan)
        return await asyncio.wait_for(pending.future, timeout)


class GatedStateClient(StateClient):
    """The real state client, with a gate a test can close to hold writes
    (to evaluate the next plan while one is being written)."""

    def __init__(self, state_addr: str, *, leader_id: str) -> None:
        super().__init__(state_addr, leader_id=leader_id)
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    async def apply_plans(
        self, plans: Sequence[state_pb2.AppliedPlan], *, timeout: float
    ) -> list[int]:
        self.waiting.set()
        await self.gate.wait()
        return await super().apply_plans(plans, timeout=timeout)


@pytest.fixture
async def core(state_addr: str, planner_leader: str) -> AsyncIterator[PlannerCore]:
    replica = Replica(state_addr, name="planner-test")
    await replica.start()
    client = GatedStateClient(state_addr, leader_id=planner_leader)
    queue = PlanQueue()
    applier = PlanApplier(queue, replica, client, PlannerSettings())
    queue.set_enabled(True)
    task = asyncio.create_task(applier.run())
    try:
        yield PlannerCore(replica, queue, applier, client, task)
    finally:
        queue.set_enabled(False)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
        await replica.stop()
    violations = await check_state(state_addr)
    assert not errors(violations), [str(v) for v in violations]
