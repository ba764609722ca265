"""What integration tests of several rooms share: a real state service
(in-process, port 0) over the module's database, and the planner's leader
lock held for the module (so ApplyPlans accepts the test's plans)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

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
def planner_leader(pg_dsn: str) -> Iterator[str]:
    """The planner leader's address (held for the module), for ApplyPlans."""
    with hold_leadership(pg_dsn, "planner") as address:
        yield address
