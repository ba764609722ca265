"""A real state service (in-process, port 0) over the module's database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from corral.security import transport
from services.state.app import StateApp
from tests.integration.state_api.settings import state_settings
from tests.leaders import hold_leadership


@pytest.fixture(scope="module")
async def state_app(pg_dsn: str, request: pytest.FixtureRequest) -> AsyncIterator[StateApp]:
    """The module's state; with ACLs when the module says `ACL_ENABLED = True`."""
    app = StateApp(state_settings(pg_dsn, acl=getattr(request.module, "ACL_ENABLED", False)))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture(scope="module")
async def channel(state_app: StateApp) -> AsyncIterator[grpc.aio.Channel]:
    async with transport.dial(state_app.server.bound_address) as ch:
        yield ch


@pytest.fixture(scope="module")
def broker_leader(pg_dsn: str) -> Iterator[str]:
    """The broker leader's address, for the state's fenced writes."""
    with hold_leadership(pg_dsn, "broker") as address:
        yield address
