"""The state's settings for these tests: a module that sets `ACL_ENABLED =
True` gets a state that enforces ACLs from the package's `state_app`. Every
state gets a key-encryption key (the session's, tests/keyring.py), so
Variables and workload identities work."""

from __future__ import annotations

from corral.security import transport
from services.state.app import StateSettings
from services.state.config import KeyringSettings
from tests.keyring import session_kek_file


def state_settings(dsn: str, *, acl: bool = False, kek: bool = True) -> StateSettings:
    return StateSettings(
        dsn=dsn,
        retention_interval=3600,
        security=transport.current().model_copy(update={"acl_enabled": acl}),
        keyring=KeyringSettings(kek_file=session_kek_file() if kek else None),
    )
