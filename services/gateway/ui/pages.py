"""The UI's pages: server-rendered shells (Jinja2) that name the page and the
object it shows; static/app.js fills them from the /v1 API in the browser.

Nothing user-supplied is rendered except through Jinja2's autoescaping, and
path parameters travel to the script as data attributes."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

HERE = Path(__file__).resolve().parent
TEMPLATES = Jinja2Templates(directory=str(HERE / "templates"))


def _render(
    request: Request,
    template: str,
    *,
    page: str,
    section: str,
    title: str,
    params: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    prefix = str(request.scope.get("root_path", "")).rstrip("/")
    return TEMPLATES.TemplateResponse(
        request,
        template,
        {
            "prefix": prefix,
            "page": page,
            "section": section,
            "title": title,
            "params": params or {},
        },
        status_code=status_code,
        headers={"Cache-Control": "no-store"},
    )


def _namespace(request: Request) -> str:
    return request.query_params.get("namespace") or "default"


async def overview(request: Request) -> Response:
    return _render(request, "overview.html", page="overview", section="overview", title="Cluster")


async def jobs(request: Request) -> Response:
    return _render(request, "jobs.html", page="jobs", section="jobs", title="Jobs")


async def job(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    return _render(
        request,
        "job.html",
        page="job",
        section="jobs",
        title=f"Job {job_id}",
        params={"job": job_id, "namespace": _namespace(request)},
    )


async def alloc(request: Request) -> Response:
    alloc_id = request.path_params["alloc_id"]
    return _render(
        request,
        "alloc.html",
        page="alloc",
        section="jobs",
        title=f"Allocation {alloc_id[:8]}",
        params={"alloc": alloc_id},
    )


async def evals(request: Request) -> Response:
    return _render(request, "evals.html", page="evals", section="evaluations", title="Evaluations")


async def eval_page(request: Request) -> Response:
    eval_id = request.path_params["eval_id"]
    return _render(
        request,
        "eval.html",
        page="eval",
        section="evaluations",
        title=f"Evaluation {eval_id[:8]}",
        params={"eval": eval_id},
    )


async def nodes(request: Request) -> Response:
    return _render(request, "nodes.html", page="nodes", section="nodes", title="Nodes")


async def node(request: Request) -> Response:
    node_id = request.path_params["node_id"]
    return _render(
        request,
        "node.html",
        page="node",
        section="nodes",
        title=f"Node {node_id[:8]}",
        params={"node": node_id},
    )


async def not_found(request: Request) -> Response:
    return _render(
        request, "notfound.html", page="notfound", section="", title="Not found", status_code=404
    )
