"""The web UI's routes, mounted at /ui by the gateway's app.py: the pages,
their static files (shipped as package data) and the UI's own JSON."""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from services.gateway.ui import api, pages

STATIC = pages.HERE / "static"

ROUTES: list[BaseRoute] = [
    Mount(
        "/ui",
        routes=[
            Route("/", pages.overview),
            Route("/jobs", pages.jobs),
            Route("/jobs/{job_id:path}", pages.job),
            Route("/allocations/{alloc_id}", pages.alloc),
            Route("/evaluations", pages.evals),
            Route("/evaluations/{eval_id}", pages.eval_page),
            Route("/services", pages.services),
            Route("/nodes", pages.nodes),
            Route("/nodes/{node_id}", pages.node),
            Route("/api/overview", api.overview),
            Route("/api/capabilities", api.capabilities),
            Route("/api/evaluation/{eval_id}/journey", api.eval_journey),
            Mount("/static", StaticFiles(directory=str(STATIC)), name="ui-static"),
            Route("/{rest:path}", pages.not_found),
        ],
    ),
]
