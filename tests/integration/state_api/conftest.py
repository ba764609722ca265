"""A real state service (in-process, port 0) over the module's database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from corral import security
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
async def channel(state_app: StateApp) -> AsyncIterator[grpc.aio.Channel]:
    async with security.dial(state_app.server.bound_address) as ch:
        yield ch


@pytest.fixture(scope="module")
def broker_leader(pg_dsn: str) -> Iterator[str]:
    """The broker leader's address, for the state's fenced writes."""
    with hold_leadership(pg_dsn, "broker") as address:
        yield address
