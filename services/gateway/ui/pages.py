"""The UI's pages: server-rendered shells (Jinja2) that name the page and the
object it shows; static/app.js fills them from the /v1 API in the browser.

Nothing user-supplied is rendered except through Jinja2's autoescaping, and
path parameters travel to the script as data attributes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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


def _object_page(
    template: str, section: str, label: str, param: str, key: str
) -> Callable[[Request], Awaitable[Response]]:
    """The handler of a page that shows one object, named by the path
    parameter `param` (its id, shortened to 8 characters in the title as the
    CLI does; a job keeps its whole id) and handed to the script as `key`."""
    page = template.removesuffix(".html")

    async def handler(request: Request) -> Response:
        object_id = request.path_params[param]
        params = {key: object_id}
        if page == "job":
            params["namespace"] = _namespace(request)
        shown = object_id if page == "job" else object_id[:8]
        return _render(
            request, template, page=page, section=section, title=f"{label} {shown}", params=params
        )

    return handler


job = _object_page("job.html", "jobs", "Job", "job_id", "job")
alloc = _object_page("alloc.html", "jobs", "Allocation", "alloc_id", "alloc")
eval_page = _object_page("eval.html", "evaluations", "Evaluation", "eval_id", "eval")
node = _object_page("node.html", "nodes", "Node", "node_id", "node")


async def evals(request: Request) -> Response:
    return _render(request, "evals.html", page="evals", section="evaluations", title="Evaluations")


async def services(request: Request) -> Response:
    return _render(request, "services.html", page="services", section="services", title="Services")


async def nodes(request: Request) -> Response:
    """The client nodes (Nomad's UI calls them clients: /ui/clients and
    /ui/nodes are the same page)."""
    return _render(request, "nodes.html", page="nodes", section="nodes", title="Clients")


async def allocs(request: Request) -> Response:
    return _render(
        request, "allocs.html", page="allocs", section="allocations", title="Allocations"
    )


async def topology(request: Request) -> Response:
    return _render(request, "topology.html", page="topology", section="topology", title="Topology")


async def deployments(request: Request) -> Response:
    return _render(
        request, "deployments.html", page="deployments", section="deployments", title="Deployments"
    )


async def servers(request: Request) -> Response:
    return _render(request, "servers.html", page="servers", section="servers", title="Servers")


async def not_found(request: Request) -> Response:
    return _render(
        request, "notfound.html", page="notfound", section="", title="Not found", status_code=404
    )
