"""The gRPC handlers of the state service, one module per proto service:
the public API (`job`, `node`, `alloc`, `eval` for `Evals`, `event`,
`operator`, `deployment`, `acl`, `namespace`, `node_pool`, `scaling`,
`variables`, `keyring`, `service` for the service catalog, and `periodic` and
`system`, which relay to the broker leader) and the internal `State` service
(`state`) the other roles call."""

from __future__ import annotations

from corral.runtime.server import GrpcServer
from services.state.app_context import StateContext
from services.state.handlers import (
    alloc,
    deployment,
    eval,
    event,
    job,
    keyring,
    namespace,
    node_pool,
    operator,
    periodic,
    scaling,
    service,
    system,
    variables,
)


def register(server: GrpcServer, ctx: StateContext) -> None:
    """Add every public servicer but `Node` (it needs the heartbeats) and
    `ACL` (it needs the ACL settings) to the server."""
    for module in (
        job,
        alloc,
        eval,
        event,
        operator,
        deployment,
        periodic,
        system,
        namespace,
        node_pool,
        scaling,
        variables,
        keyring,
        service,
    ):
        module.register(server, ctx)
