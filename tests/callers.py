"""Channels as a particular kind of caller would open them.

The test process holds the session's server token (tests/conftest.py), so
`corral.security.transport.dial` makes it a server, which may call everything. A user
or a node has no server token: `user_channel` dials as one."""

from __future__ import annotations

import grpc
from pydantic import SecretStr

from corral.security import transport


def user_channel(address: str, token: str = "") -> grpc.aio.Channel:
    """A channel carrying only the ACL token `token` (anonymous when '')."""
    settings = transport.current().model_copy(update={"server_token": SecretStr("")})
    return transport.dial(address, token=token, settings=settings)
