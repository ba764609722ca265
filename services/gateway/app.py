"""The gateway's ASGI application: Nomad's `/v1` routes (each module of
`services/gateway/routes/` exports `ROUTES`), Nomad's error handling, and
whatever else mounts beside them (the web UI at `/ui`)."""

from __future__ import annotations

from types import ModuleType

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from services.gateway import http
from services.gateway.backend import Backend
from services.gateway.config import GatewaySettings
from services.gateway.jobfiles import JobFileParser
from services.gateway.metrics import HttpMetrics
from services.gateway.routes import (
    acl,
    agent,
    alloc_exec,
    allocs,
    client_node,
    deployments,
    evals,
    events,
    fs,
    job_statuses,
    jobs,
    keyring,
    metrics,
    namespaces,
    node_pools,
    nodes,
    operator,
    parse,
    scaling,
    search,
    search_fuzzy,
    services,
    system,
    unserved,
    validate,
    variables,
)
from services.gateway.ui import routes as ui

#: the route modules (each exports ROUTES; add yours here). Order among
#: them matters once: node_pools before nodes (`/v1/node/pools` and
#: `/v1/node/pool/...` would otherwise be taken for node ids); the two
#: catch-alls (the bare /v1/job/{id}, then any other /v1 path: 501 for Nomad
#: endpoints we do not serve, 405 for a wrong method, else 404) come after
#: all of them.
ROUTE_MODULES: list[ModuleType] = [
    agent,
    job_statuses,
    jobs,
    allocs,
    alloc_exec,
    fs,
    client_node,
    evals,
    node_pools,
    nodes,
    operator,
    deployments,
    acl,
    events,
    parse,
    validate,
    services,
    namespaces,
    scaling,
    variables,
    keyring,
    metrics,
    search,
    search_fuzzy,
    system,
    ui,
]


def routes() -> list[BaseRoute]:
    out: list[BaseRoute] = []
    for module in ROUTE_MODULES:
        out.extend(module.ROUTES)
    return [*out, *jobs.FALLBACK, *unserved.ROUTES]


def create_app(settings: GatewaySettings, backend: Backend) -> Starlette:
    """The application; `backend`, `settings` and the job file parser
    (`jobfiles`, closed by the gateway process) are on `app.state` for the
    handlers (`http.backend_of(request)`)."""
    app = Starlette(
        routes=routes(),
        exception_handlers=http.EXCEPTION_HANDLERS,
        middleware=[Middleware(HttpMetrics)],
    )
    app.state.backend = backend
    app.state.settings = settings
    app.state.jobfiles = JobFileParser()
    return app
