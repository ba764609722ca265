"""The end of the route list: Nomad endpoints Corral does not serve answer
501 with a pointer to docs/http-api.md; a known path with the wrong method
405 "Invalid method"; any other /v1 path 404, as Nomad."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match

from services.gateway.authz import UNSERVED, ApiRoute
from services.gateway.http import NomadError, unserved

#: path prefixes of Nomad's API that Corral documents as not served
UNSERVED_PREFIXES: tuple[str, ...] = (
    "/v1/agent/",
    "/v1/client/",
    "/v1/evaluations/",
    "/v1/operator/",
    "/v1/plugin",
    "/v1/quota",
    "/v1/recommendation",
    "/v1/search",
    "/v1/sentinel",
    "/v1/system/",
    "/v1/volume",
    "/v1/acl/",
    "/v1/jobs/",
)


def wrong_method(request: Request, *, skip: BaseRoute | None = None) -> bool:
    """Whether another route serves this path with other methods."""
    for route in request.app.router.routes:
        if route is skip:
            continue
        match, _ = route.matches(request.scope)
        if match is Match.PARTIAL:
            return True
    return False


async def catch_all(request: Request) -> Response:
    if wrong_method(request, skip=CATCH_ALL):
        raise NomadError(405, "Invalid method")
    path = request.url.path
    if path.startswith(UNSERVED_PREFIXES):
        raise unserved(f"{request.method} {path}")
    raise NomadError(404, f"Invalid URL path: {path}")


#: answers only 404, 405 or 501: nothing a token guards
CATCH_ALL = ApiRoute(
    "/v1/{rest:path}",
    catch_all,
    dict.fromkeys(("GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"), UNSERVED),
)

ROUTES: list[BaseRoute] = [CATCH_ALL]
