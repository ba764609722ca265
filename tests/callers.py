"""Channels as a particular kind of caller would open them.

The test process holds the session's server token (tests/conftest.py), so
`corral.security.transport.dial` makes it a server, which may call everything. A user
or a node has no server token: `user_channel` dials as one."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc
from pydantic import SecretStr

from corral.security import transport
from corral.v1 import acl_pb2, acl_pb2_grpc, namespace_pb2, namespace_pb2_grpc
from corral.v1 import structs_pb2 as pb


def user_channel(address: str, token: str = "") -> grpc.aio.Channel:
    """A channel carrying only the ACL token `token` (anonymous when '')."""
    settings = transport.current().model_copy(update={"server_token": SecretStr("")})
    return transport.dial(address, token=token, settings=settings)


async def bootstrap_tokens(
    channel: Callable[[str], grpc.aio.Channel], policies: Mapping[str, str], tokens: dict[str, str]
) -> grpc.aio.Channel:
    """ACLs bootstrapped through `channel(token)`: `tokens` gets the
    management token and, for each policy (name → rules), a token holding
    only it, under the policy's name; the namespace "other" exists beside
    "default". The management token's channel is returned."""
    boot = await acl_pb2_grpc.ACLStub(channel("")).Bootstrap(acl_pb2.ACLBootstrapRequest())
    tokens["management"] = boot.token.secret_id
    mgmt = channel(boot.token.secret_id)
    await namespace_pb2_grpc.NamespaceStub(mgmt).Upsert(
        namespace_pb2.NamespaceUpsertRequest(namespaces=[pb.Namespace(name="other")])
    )
    acls = acl_pb2_grpc.ACLStub(mgmt)
    await acls.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name=n, rules=r) for n, r in policies.items()]
        )
    )
    for name in policies:
        resp = await acls.CreateToken(acl_pb2.ACLCreateTokenRequest(name=name, policies=[name]))
        tokens[name] = resp.token.secret_id
    return mgmt
