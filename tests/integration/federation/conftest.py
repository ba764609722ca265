"""Two regions in one test process: two state services (`west`, the
authoritative region, and `east`), each over a database of its own, with
ACLs on. East is configured with west's address; west learns east from
east's first probe. Plaintext, with the session's server token: the
federation's servers share it, as they would share a CA with TLS."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import pytest
from pydantic import SecretStr

from corral.devtools.pgserver import with_database
from corral.security import transport
from services.state.app import StateApp, StateSettings
from services.state.config import FederationSettings
from tests.conftest import drop_database, new_database
from tests.integration.state_api.settings import state_settings

WEST, EAST = "west", "east"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def region_settings(dsn: str, region: str, port: int, **federation: object) -> StateSettings:
    base = state_settings(dsn, acl=True)
    return base.model_copy(
        update={
            "listen": f"127.0.0.1:{port}",
            "security": base.security.model_copy(update={"region": region}),
            "federation": FederationSettings.model_validate(
                {"probe_interval": 0.2, "replication_backoff": 0.2, **federation}
            ),
        }
    )


@dataclass
class Regions:
    west: StateApp
    east: StateApp
    east_settings: StateSettings

    @property
    def west_addr(self) -> str:
        return self.west.server.bound_address

    @property
    def east_addr(self) -> str:
        return self.east.server.bound_address

    async def restart_east(self) -> None:
        """Start east again on its port, over its database."""
        self.east = StateApp(self.east_settings)
        await self.east.start()


@pytest.fixture(scope="module")
def east_dsn(pg_admin_dsn: str, pg_template: str) -> Iterator[str]:
    name = new_database(pg_admin_dsn, pg_template, "federation_east")
    try:
        yield with_database(pg_admin_dsn, name)
    finally:
        drop_database(pg_admin_dsn, name)


@pytest.fixture(scope="module")
async def regions(pg_dsn: str, east_dsn: str) -> AsyncIterator[Regions]:
    west = StateApp(region_settings(pg_dsn, WEST, free_port()))
    await west.start()
    east_settings = region_settings(
        east_dsn,
        EAST,
        free_port(),
        peers=[f"{WEST}={west.server.bound_address}"],
        authoritative_region=WEST,
    )
    east = StateApp(east_settings)
    await east.start()
    pair = Regions(west, east, east_settings)
    try:
        yield pair
    finally:
        await pair.east.stop()
        await west.stop()


def dial(address: str) -> grpc.aio.Channel:
    """A channel as a user: no server token (the session's would make every
    call a server's, for which no ACL applies)."""
    user = transport.current().model_copy(update={"server_token": SecretStr("")})
    return transport.dial(address, settings=user)


def metadata(token: str = "", region: str = "") -> list[tuple[str, str]]:
    return transport.call_metadata(
        transport.current(), peer="cli", token=token, request_region=region
    )
