"""What every `/v1` endpoint shares: reading Nomad's query parameters,
answering with Nomad's headers, and turning failures into Nomad's error
shape (a status code and a one-line plain-text body, never a traceback).

Nomad's conventions, as its HTTP API documents them:

* blocking queries: `?index=N&wait=5m` (Go durations; Nomad caps the wait
  at 10 minutes) answer once the index moved past N or the wait expired;
* every read answers `X-Nomad-Index`, `X-Nomad-KnownLeader` and
  `X-Nomad-LastContact`; a paginated list adds `X-Nomad-NextToken`;
* the ACL token comes as `X-Nomad-Token`, or `Authorization: Bearer`, or
  (for clients that cannot set headers) `?token=`;
* `?region=` names the region a request is for: it travels with every
  gRPC call the request causes (`x-corral-region`), and the state server
  forwards the call to that region (none: the gateway's own region);
* errors are plain text with the status code (400, 403 "Permission denied",
  404, 405 "Invalid method", 500).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from corral.domain import paging
from corral.domain.errors import (
    FIELD_METADATA_KEY,
    NO_REGION_PATH,
    CorralError,
    PermissionDenied,
    Unavailable,
    bounded_message,
)
from corral.domain.jobspec import limits
from corral.domain.jobspec.duration import parse_duration
from corral.domain.jobspec.json import nomad_path
from corral.runtime.settings import REGION_NAME
from corral.security.access import MAX_PUBLIC_REQUEST_BYTES
from corral.security.transport import REGION_METADATA_KEY
from corral.v1 import query_pb2
from services.gateway import filter as bexpr
from services.gateway.backend import DEFAULT_TIMEOUT, Backend, token_metadata

log = logging.getLogger(__name__)

#: Nomad's own cap on a blocking query's wait
MAX_WAIT_MS = 10 * 60 * 1000
#: a list page larger than this is refused (Nomad has no cap; ours keeps a
#: single answer bounded)
MAX_PER_PAGE = 10_000


UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class NomadError(Exception):
    """An HTTP error with Nomad's plain-text body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bad_request(message: str) -> NomadError:
    return NomadError(400, message)


def not_found(message: str) -> NomadError:
    return NomadError(404, message)


def unserved(what: str) -> NomadError:
    """A Nomad endpoint Corral documents as not served (docs/http-api.md)."""
    return NomadError(501, f"{what} is not served by Corral's gateway (see docs/http-api.md)")


def token_of(request: HTTPConnection) -> str:
    """The ACL secret the request carries ('' for none)."""
    token = request.headers.get("x-nomad-token", "").strip()
    if token:
        return token
    auth = request.headers.get("authorization", "").strip()
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.query_params.get("token", "").strip()


def region_of(request: Request) -> str:
    """The region `?region=` names ('' for none: the gateway's own)."""
    region = request.query_params.get("region", "").strip()
    if region and not REGION_NAME.match(region):
        raise bad_request(f"Invalid region: {region[:100]!r}")
    return region


def call_metadata(token: str, region: str) -> list[tuple[str, str]]:
    """gRPC call metadata: the request's token and the region it is for."""
    pairs = token_metadata(token)
    if region:
        pairs.append((REGION_METADATA_KEY, region))
    return pairs


def _int_param(request: Request, name: str, default: int = 0) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"Invalid {name} value: {raw!r} is not an integer") from None
    if value < 0:
        raise bad_request(f"Invalid {name} value: {raw!r} is negative")
    if value > INT64_MAX:
        raise bad_request(f"Invalid {name} value: {raw!r} is too large")
    return value


def _bool_param(request: Request, name: str) -> bool:
    raw = request.query_params.get(name)
    if raw is None:
        return False
    if raw == "":
        return True  # `?stale` alone, as Nomad
    lowered = raw.lower()
    if lowered in ("1", "true", "t", "yes"):
        return True
    if lowered in ("0", "false", "f", "no"):
        return False
    raise bad_request(f"Invalid {name} value: {raw!r} is not a boolean")


def bool_param(request: Request, name: str) -> bool:
    """A boolean query parameter (`true`/`false`/`1`/`0`; present alone = true)."""
    return _bool_param(request, name)


def int_param(request: Request, name: str, default: int = 0) -> int:
    """A non-negative integer query parameter."""
    return _int_param(request, name, default)


def whole(value: Any, name: str, *, low: int = 0, high: int = UINT64_MAX, default: int = 0) -> int:
    """A whole number from a JSON body within [low, high] (a proto field's
    range), else Nomad's 400 naming the field; null or absent is `default`."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise bad_request(f"{name} must be a whole number, got {value!r}")
        value = int(value)
    if not low <= value <= high:
        raise bad_request(f"{name} must be between {low} and {high}, got {value}")
    return int(value)


def parse_wait(raw: str) -> int:
    """Nomad's `wait` (a Go duration such as "5m") in milliseconds, capped
    at Nomad's 10 minutes."""
    try:
        ns = parse_duration(raw)
    except ValueError:
        raise bad_request(f"Invalid wait time: {raw!r}") from None
    if ns < 0:
        raise bad_request(f"Invalid wait time: {raw!r}")
    return min(ns // 1_000_000, MAX_WAIT_MS)


@dataclass(frozen=True)
class QueryOptions:
    """Nomad's query parameters of a read (api.QueryOptions)."""

    index: int = 0
    wait_ms: int = 0
    namespace: str = "default"
    region: str = ""
    prefix: str = ""
    per_page: int = 0
    next_token: str = ""
    filter: str = ""
    stale: bool = False
    reverse: bool = False
    token: str = ""

    @classmethod
    def from_request(cls, request: Request) -> QueryOptions:
        q = request.query_params
        wait = q.get("wait", "")
        per_page = _int_param(request, "per_page")
        if per_page > MAX_PER_PAGE:
            raise bad_request(f"Invalid per_page value: at most {MAX_PER_PAGE}")
        return cls(
            index=_int_param(request, "index"),
            wait_ms=parse_wait(wait) if wait else 0,
            namespace=q.get("namespace", "") or "default",
            region=region_of(request),
            prefix=q.get("prefix", ""),
            per_page=per_page,
            next_token=q.get("next_token", ""),
            filter=q.get("filter", ""),
            stale=_bool_param(request, "stale"),
            reverse=_bool_param(request, "reverse"),
            token=token_of(request),
        )

    @property
    def metadata(self) -> list[tuple[str, str]]:
        """gRPC call metadata carrying the request's token and region."""
        return call_metadata(self.token, self.region)

    @property
    def blocking(self) -> bool:
        return self.index > 0

    @property
    def timeout(self) -> float:
        """The gRPC deadline of the read: the wait plus the normal timeout."""
        wait = (self.wait_ms or 300_000) if self.blocking else 0
        return DEFAULT_TIMEOUT + wait / 1000

    def proto(self, *, paginate: bool = True) -> query_pb2.QueryOptions:
        """Our QueryOptions: the gRPC API's own blocking query and pages.
        Nomad's `index=N` means "answer when the index is > N", which is our
        min_index exactly."""
        return query_pb2.QueryOptions(
            min_index=self.index,
            wait_ms=self.wait_ms if self.blocking else 0,
            prefix=self.prefix,
            per_page=self.per_page if paginate else 0,
            next_token=self.next_token if paginate else "",
            namespace=self.namespace,
            reverse=self.reverse,
        )


def metadata_of(request: Request, region: str | None = None) -> list[tuple[str, str]]:
    """gRPC call metadata for a write: the token, and the region (`?region=`
    unless `region` is given)."""
    return call_metadata(token_of(request), region_of(request) if region is None else region)


def respond(
    request: Request,
    body: Any,
    *,
    index: int | None = None,
    next_token: str = "",
    status: int = 200,
) -> Response:
    """Nomad's JSON answer with its query-meta headers."""
    headers = {"X-Nomad-KnownLeader": "true", "X-Nomad-LastContact": "0"}
    if index is not None:
        headers["X-Nomad-Index"] = str(max(index, 1))
    if next_token:
        headers["X-Nomad-NextToken"] = next_token
    if request.query_params.get("pretty") is not None:
        text = json.dumps(body, indent=4) + "\n"
        return Response(text, status_code=status, headers=headers, media_type="application/json")
    return JSONResponse(body, status_code=status, headers=headers)


def written(index: int) -> Response:
    """A write Nomad answers with no body, only its index."""
    return Response(
        status_code=200,
        headers={
            "X-Nomad-Index": str(max(index, 1)),
            "X-Nomad-KnownLeader": "true",
            "X-Nomad-LastContact": "0",
        },
    )


async def object_body(request: Request, *, required: bool = True) -> dict[str, Any]:
    """The request's JSON object (Nomad's 400 for anything else); with
    `required` false an empty body is an empty object."""
    body = await json_body(request)
    if body is None and not required:
        return {}
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


async def body_bytes(request: Request) -> bytes:
    """The request's body; one larger than the public API takes
    (corral.security.access.MAX_PUBLIC_REQUEST_BYTES) is 413, read no
    further than that."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_PUBLIC_REQUEST_BYTES:
        raise NomadError(413, f"request body larger than {MAX_PUBLIC_REQUEST_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_PUBLIC_REQUEST_BYTES:
            raise NomadError(413, f"request body larger than {MAX_PUBLIC_REQUEST_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Request) -> Any:
    """The request's JSON body (`body_bytes`); bad JSON is Nomad's 400, and
    so is JSON nested deeper than a job may be
    (corral/domain/jobspec/limits.py: the decoder recurses per level)."""
    raw = await body_bytes(request)
    if not raw.strip():
        return None
    try:
        return limits.load_json(raw)
    except limits.NestingError as exc:
        raise bad_request(f"Failed to decode request body: {exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"Failed to decode request body: {exc}") from None


# -- errors ----------------------------------------------------------------

GRPC_TO_HTTP = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return bounded_message(line, 1000)


def grpc_error_response(exc: grpc.aio.AioRpcError) -> PlainTextResponse:
    """Nomad's error for a failed gRPC call. Permission errors answer Nomad's
    exact "Permission denied" text (clients match on it)."""
    code = exc.code()
    status = GRPC_TO_HTTP.get(code, 500)
    details = _one_line(exc.details() or "")
    if status == 403:
        message = "Permission denied"
    elif status == 500:
        # the details stay in the log: an unexpected status may carry a
        # server's exception text, which no caller is shown
        log.warning("gRPC call failed: %s %s", code.name, details)
        message = f"internal error ({code.name.lower()}; details in the gateway's log)"
    elif status == 503 and details.startswith(NO_REGION_PATH):
        message = details  # another region is unreachable, not ours
    elif status == 503:
        message = f"No cluster leader or the state service is unreachable: {details}"
    else:
        message = details or code.name.lower().replace("_", " ")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            message = _in_nomads_words(exc, message)
    return PlainTextResponse(message, status_code=status)


def _in_nomads_words(exc: grpc.aio.AioRpcError, message: str) -> str:
    """A state's refusal of a job names the field by its proto path
    (`job.task_groups[0].count: ...`, in its trailing metadata too); the
    caller sent Nomad's JSON, so it reads `Job.TaskGroups[0].Count: ...`."""
    field = next((str(v) for k, v in exc.trailing_metadata() or () if k == FIELD_METADATA_KEY), "")
    if not (field == "job" or field.startswith(("job.", "job["))):
        return message
    if not message.startswith(field):
        return message
    return nomad_path(field) + message[len(field) :]


@contextlib.contextmanager
def body_fields(strip: str = "") -> Iterator[None]:
    """Within it, a state's refusal naming a request field by its proto
    path (`roles[0].policies[1]: ...`) is answered naming Nomad's JSON field
    of the body (`Policies[1]: ...`), `strip` (what wraps the body in the
    request: `roles[0]` for the one role of an ACL role write) taken off
    first."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise
        field = next(
            (str(v) for k, v in exc.trailing_metadata() or () if k == FIELD_METADATA_KEY), ""
        )
        details = _one_line(exc.details() or "")
        path = field.removeprefix(strip).lstrip(".") if field.startswith(strip) else ""
        if not path or not details.startswith(field):
            raise
        raise NomadError(400, nomad_path(path) + details[len(field) :]) from None


async def handle_grpc_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, grpc.aio.AioRpcError)
    return grpc_error_response(exc)


async def handle_nomad_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, NomadError)
    return PlainTextResponse(_one_line(exc.message), status_code=exc.status)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors in Nomad's words: an unknown path is 404,
    a known path with the wrong method 405 "Invalid method"."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return PlainTextResponse("Invalid method", status_code=405)
    if exc.status_code == 404:
        return PlainTextResponse(f"Invalid URL path: {request.url.path}", status_code=404)
    return PlainTextResponse(_one_line(str(exc.detail)), status_code=exc.status_code)


async def handle_corral_error(request: Request, exc: Exception) -> Response:
    """A domain error raised in the gateway itself (resolving a token)."""
    assert isinstance(exc, CorralError)
    if isinstance(exc, PermissionDenied):
        return PlainTextResponse("Permission denied", status_code=403)
    if isinstance(exc, Unavailable):
        message = f"No cluster leader or the state service is unreachable: {exc.message}"
        return PlainTextResponse(_one_line(message), status_code=503)
    return await handle_unexpected(request, exc)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    """Anything else: logged here, a one-line 500 to the caller that names
    no exception (the log has it)."""
    log.exception("unhandled error serving %s %s", request.method, request.url.path)
    return PlainTextResponse("internal error (details in the gateway's log)", status_code=500)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    grpc.aio.AioRpcError: handle_grpc_error,
    NomadError: handle_nomad_error,
    HTTPException: handle_http_exception,
    CorralError: handle_corral_error,
    Exception: handle_unexpected,
}


def backend_of(request: Request) -> Backend:
    """The app's gRPC backend."""
    backend: Backend = request.app.state.backend
    return backend


# -- lists -----------------------------------------------------------------

#: a list read: given our QueryOptions, the Nomad JSON items and the meta
ListCall = Callable[[query_pb2.QueryOptions], Awaitable[tuple[list[dict[str, Any]], Any]]]


def apply_filter(expression: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nomad's `filter` expression over the items' Nomad JSON
    (services/gateway/filter.py); a bad expression is Nomad's 400."""
    try:
        return bexpr.apply(expression, items)
    except bexpr.FilterError as exc:
        raise bad_request(f"failed to read filter expression: {exc}") from None


#: a list's sort key and paging token: a field's name, or a function of the item
ItemKey = str | Callable[[dict[str, Any]], str]


def _field(name: str) -> Callable[[dict[str, Any]], str]:
    return lambda item: str(item.get(name, ""))


def local_page(
    q: QueryOptions, items: list[dict[str, Any]], key: ItemKey = "ID"
) -> tuple[list[dict[str, Any]], str]:
    """One page of `items` as the state pages (sorted by `key`, the next
    token being the first key of the next page)."""
    key_of = key if callable(key) else _field(key)
    items = sorted(items, key=key_of)
    if q.next_token:
        items = [i for i in items if key_of(i) >= q.next_token]
    if q.per_page and len(items) > q.per_page:
        return items[: q.per_page], key_of(items[q.per_page])
    return items, ""


async def listing(
    request: Request,
    q: QueryOptions,
    call: ListCall,
    key: ItemKey = "ID",
    *,
    by_creation: bool = False,
) -> Response:
    """A list endpoint's answer: the state pages it, unless a filter is
    given; then the whole list is read, filtered here, then paged (Nomad
    filters before it pages) in the state's order: by `key`, or
    `by_creation` as Nomad orders evaluations, allocations and deployments
    (corral/domain/paging.py)."""
    if not q.filter:
        items, meta = await call(q.proto())
        return respond(request, items, index=meta.index, next_token=meta.next_token)
    items, meta = await call(q.proto(paginate=False))
    kept = apply_filter(q.filter, items)
    if by_creation:
        page, token = paging.creation_page(
            kept,
            create_index=lambda i: int(i.get("CreateIndex") or 0),
            ident=lambda i: str(i.get("ID", "")),
            by_id=bool(q.prefix),
            next_token=q.next_token,
            per_page=q.per_page,
            reverse=q.reverse,
        )
    else:
        page, token = local_page(q, kept, key)
    return respond(request, page, index=meta.index, next_token=token)
