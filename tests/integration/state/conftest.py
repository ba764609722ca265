"""The state tests' own fixtures (the state service and the planner's leader
lock come from tests/integration/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from corral.security import transport
from corral.v1 import state_pb2_grpc
from tests.leaders import hold_leadership


@pytest.fixture(scope="module")
async def state_stub(state_addr: str) -> AsyncIterator[state_pb2_grpc.StateAsyncStub]:
    async with transport.dial(state_addr) as channel:
        yield state_pb2_grpc.StateStub(channel)


@pytest.fixture(scope="module")
def broker_leader(pg_dsn: str) -> Iterator[str]:
    """The broker leader's address (held for the module), for eval writes."""
    with hold_leadership(pg_dsn, "broker") as address:
        yield address
