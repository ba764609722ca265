"""A real state service (in-process, port 0) over the module's database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from corral.security import transport
from corral.v1 import state_pb2_grpc
from services.state.app import StateApp, StateSettings
from tests.leaders import hold_leadership


@pytest.fixture(scope="module")
async def state_app(pg_dsn: str) -> AsyncIterator[StateApp]:
    app = StateApp(StateSettings(dsn=pg_dsn, retention_interval=3600))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture(scope="module")
async def state_addr(state_app: StateApp) -> str:
    return state_app.server.bound_address


@pytest.fixture(scope="module")
async def state_stub(state_addr: str) -> AsyncIterator[state_pb2_grpc.StateAsyncStub]:
    async with transport.dial(state_addr) as channel:
        yield state_pb2_grpc.StateStub(channel)


@pytest.fixture(scope="module")
def planner_leader(pg_dsn: str) -> Iterator[str]:
    """The planner leader's address (held for the module), for ApplyPlans."""
    with hold_leadership(pg_dsn, "planner") as address:
        yield address


@pytest.fixture(scope="module")
def broker_leader(pg_dsn: str) -> Iterator[str]:
    """The broker leader's address (held for the module), for eval writes."""
    with hold_leadership(pg_dsn, "broker") as address:
        yield address
