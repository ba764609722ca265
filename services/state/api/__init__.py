"""The public API served by the state service: Job, Node, Alloc, Evals,
Event, Operator and Periodic (one module per service)."""

from __future__ import annotations

from corral.server import GrpcServer
from services.state.app_context import StateContext


def register(server: GrpcServer, ctx: StateContext) -> None:
    """Add every public servicer to the server."""
    from services.state.api import allocs, evals, events, jobs, operator, periodic

    for module in (jobs, allocs, evals, events, operator, periodic):
        module.register(server, ctx)
