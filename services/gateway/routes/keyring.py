"""The keyring over HTTP (Nomad's command/agent/keyring_endpoint.go):
/v1/operator/keyring/keys, /v1/operator/keyring/rotate (`?full`,
`?publish_time=`, `?algo=`), DELETE /v1/operator/keyring/key/:id
(`?force`); and, for anyone who verifies workload identities,
/.well-known/jwks.json and /.well-known/openid-configuration (the latter
only when the state has an OIDC issuer, else 404 as Nomad)."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain import variables as var_map
from corral.security import keyring as kr
from corral.v1 import keyring_pb2
from services.gateway.authz import OPEN, OPERATOR_READ, OPERATOR_WRITE, ApiRoute
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    NomadError,
    QueryOptions,
    backend_of,
    bad_request,
    bool_param,
    metadata_of,
    respond,
)

JWKS_PATH = "/.well-known/jwks.json"
#: the shortest a JWKS may be cached (Nomad's jwksMinMaxAge)
JWKS_MIN_MAX_AGE_S = 15 * 60


async def keys(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).keyring.List(
        keyring_pb2.KeyringListRequest(query=q.proto(paginate=False)),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, [var_map.root_key(k) for k in resp.keys], index=resp.meta.index)


async def rotate(request: Request) -> Response:
    p = request.query_params
    raw_time = p.get("publish_time", "")
    try:
        publish_time = int(raw_time) if raw_time else 0
    except ValueError:
        raise bad_request(f"invalid publish_time: {raw_time!r}") from None
    algorithm = p.get("algo", "")
    resp = await backend_of(request).keyring.Rotate(
        keyring_pb2.KeyringRotateRequest(
            algorithm=algorithm if algorithm == kr.ALGORITHM_AES256_GCM else "",
            full="full" in p,
            publish_time=publish_time,
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    body = {"Key": var_map.root_key(resp.key), "Index": resp.index}
    return respond(request, body, index=resp.index)


async def delete_key(request: Request) -> Response:
    try:
        force = bool_param(request, "force")
    except NomadError:
        raise NomadError(422, "invalid force parameter") from None
    resp = await backend_of(request).keyring.Delete(
        keyring_pb2.KeyringDeleteRequest(key_id=request.path_params["key_id"], force=force),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, {"Index": resp.index}, index=resp.index)


async def jwks(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).keyring.ListPublic(
        keyring_pb2.KeyringListPublicRequest(query=q.proto(paginate=False)),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    body: dict[str, Any] = {
        "keys": [kr.public_jwk(k.key_id, k.public_key, algorithm=k.algorithm) for k in resp.keys]
    }
    answer = respond(request, body, index=resp.meta.index)
    newest = max((k.create_time for k in resp.keys), default=0)
    if newest and resp.rotation_threshold:
        expires_s = (newest + resp.rotation_threshold) / 1e9
        max_age = max(JWKS_MIN_MAX_AGE_S, int((expires_s - time.time()) / 2))
        answer.headers["Cache-Control"] = f"max-age={max_age}"
    return answer


async def openid_configuration(request: Request) -> Response:
    resp = await backend_of(request).keyring.GetConfig(
        keyring_pb2.KeyringGetConfigRequest(),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    if not resp.issuer:
        raise NomadError(404, "OIDC Discovery endpoint disabled")
    issuer = resp.issuer
    body = {
        "issuer": issuer,
        "jwks_uri": issuer.rstrip("/") + JWKS_PATH,
        "id_token_signing_alg_values_supported": [kr.SIGNING_ALGORITHM],
        "response_types_supported": ["code"],
        "subject_types_supported": ["public"],
    }
    return respond(request, body)


ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/operator/keyring/keys", keys, {"GET": OPERATOR_READ}),
    ApiRoute(
        "/v1/operator/keyring/rotate", rotate, {"PUT": OPERATOR_WRITE, "POST": OPERATOR_WRITE}
    ),
    ApiRoute("/v1/operator/keyring/key/{key_id}", delete_key, {"DELETE": OPERATOR_WRITE}),
    # public keys and the issuer's metadata: open, as Nomad's
    ApiRoute(JWKS_PATH, jwks, {"GET": OPEN}),
    ApiRoute("/.well-known/openid-configuration", openid_configuration, {"GET": OPEN}),
]
