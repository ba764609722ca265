"""The state's settings for these tests: a module that sets `ACL_ENABLED =
True` gets a state that enforces ACLs from the package's `state_app`."""

from __future__ import annotations

from corral.security import transport
from services.state.app import StateSettings


def state_settings(dsn: str, *, acl: bool = False) -> StateSettings:
    return StateSettings(
        dsn=dsn,
        retention_interval=3600,
        security=transport.current().model_copy(update={"acl_enabled": acl}),
    )
