"""The web UI's routes, mounted at /ui by the gateway's app.py: the pages,
their static files (shipped as package data) and the UI's own JSON.

The pages and static files are open, as Nomad's UI assets: they hold no
data (the script fetches it with the browser's token). The UI's JSON
answers are decided like the /v1 routes (services/gateway/authz.py)."""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from services.gateway.authz import OPEN, OPERATOR_READ, READ_JOB_OBJECT, ApiRoute, Need
from services.gateway.ui import api, pages

STATIC = pages.HERE / "static"

PAGE = {"GET": OPEN}
#: Eval.Stats and Plan.Stats need operator:read; each refused part answers
#: its error in the body (the page shows it)
#: resolved here: an unknown token is a 403, any other is described
CAPABILITIES = Need(
    summary="any valid token, or none (it describes the token)", any_token=True, gateway=True
)
OVERVIEW = Need(
    summary="`operator:read` (each refused part answers its error)",
    scopes=(("operator", "read"),),
    partial=True,
)
#: counted from Job.List, Node.List and Alloc.List with the request's token
CLUSTER = Need(
    summary="`node:read` for the node counts; jobs and allocations of the namespaces with "
    "`list-jobs` / `read-job` (each refused part answers its error)",
    scopes=(("node", "read"),),
    partial=True,
)
#: Node.List needs node:read; Alloc.List over `*` keeps the namespaces the
#: token may read-job in
TOPOLOGY = Need(
    summary="`node:read` (allocations: those of the namespaces with `read-job`)",
    scopes=(("node", "read"),),
    filters=True,
)


def _static() -> Mount:
    mount = Mount("/static", StaticFiles(directory=str(STATIC)), name="ui-static")
    mount.needs = {"GET": OPEN, "HEAD": OPEN}  # type: ignore[attr-defined]
    return mount


ROUTES: list[BaseRoute] = [
    Mount(
        "/ui",
        routes=[
            ApiRoute("/", pages.overview, PAGE),
            ApiRoute("/jobs", pages.jobs, PAGE),
            ApiRoute("/jobs/{job_id:path}", pages.job, PAGE),
            ApiRoute("/allocations/{alloc_id}", pages.alloc, PAGE),
            ApiRoute("/evaluations", pages.evals, PAGE),
            ApiRoute("/evaluations/{eval_id}", pages.eval_page, PAGE),
            ApiRoute("/services", pages.services, PAGE),
            ApiRoute("/allocations", pages.allocs, PAGE),
            ApiRoute("/nodes", pages.nodes, PAGE),
            ApiRoute("/clients", pages.nodes, PAGE),
            ApiRoute("/nodes/{node_id}", pages.node, PAGE),
            ApiRoute("/topology", pages.topology, PAGE),
            ApiRoute("/deployments", pages.deployments, PAGE),
            ApiRoute("/servers", pages.servers, PAGE),
            ApiRoute("/api/overview", api.overview, {"GET": OVERVIEW}),
            ApiRoute("/api/capabilities", api.capabilities, {"GET": CAPABILITIES}),
            ApiRoute("/api/cluster", api.cluster, {"GET": CLUSTER}),
            ApiRoute("/api/topology", api.topology, {"GET": TOPOLOGY}),
            ApiRoute("/api/members", api.members, {"GET": OPERATOR_READ}),
            ApiRoute(
                "/api/evaluation/{eval_id}/journey", api.eval_journey, {"GET": READ_JOB_OBJECT}
            ),
            _static(),
            ApiRoute("/{rest:path}", pages.not_found, PAGE),
        ],
    ),
]
