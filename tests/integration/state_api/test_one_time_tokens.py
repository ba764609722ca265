"""One-time tokens (Nomad's ACL.UpsertOneTimeToken / ExchangeOneTimeToken)
against a real state service and PostgreSQL: made only for a real token,
exchanged once for that token and its secret, refused when expired, used
or raced, reaped by the expired-token GC, and never stored in the clear."""

from __future__ import annotations

import asyncio
import hashlib
import time
import urllib.parse
from collections.abc import AsyncIterator

import grpc
import psycopg
import pytest

from cli.main import main
from corral.testing import mock
from corral.v1 import acl_pb2, acl_pb2_grpc, job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from services.state.app import StateApp
from services.state.token_gc import collect_expired
from tests.callers import user_channel
from tests.integration.state_api import gateway

#: the package's `state_app` enforces ACLs for this module (conftest.py)
ACL_ENABLED = True
TEN_MINUTES_NS = 600 * 10**9
READ_DEFAULT = 'namespace "default" { policy = "read" }'


@pytest.fixture(scope="module")
async def anonymous(state_app: StateApp) -> AsyncIterator[acl_pb2_grpc.ACLAsyncStub]:
    async with user_channel(state_app.server.bound_address) as ch:
        yield acl_pb2_grpc.ACLStub(ch)


@pytest.fixture(scope="module")
async def management(
    state_app: StateApp, anonymous: acl_pb2_grpc.ACLAsyncStub
) -> AsyncIterator[acl_pb2_grpc.ACLAsyncStub]:
    boot = await anonymous.Bootstrap(acl_pb2.ACLBootstrapRequest())
    async with user_channel(state_app.server.bound_address, boot.token.secret_id) as ch:
        stub = acl_pb2_grpc.ACLStub(ch)
        await stub.UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[acl_pb2.ACLPolicy(name="readers", rules=READ_DEFAULT)]
            )
        )
        yield stub


async def _client_token(management: acl_pb2_grpc.ACLAsyncStub, **kw: object) -> acl_pb2.ACLToken:
    resp = await management.CreateToken(
        acl_pb2.ACLCreateTokenRequest(name="ui user", policies=["readers"], **kw)  # type: ignore[arg-type]
    )
    token: acl_pb2.ACLToken = resp.token
    return token


async def _one_time(state_app: StateApp, secret: str) -> acl_pb2.ACLOneTimeTokenResponse:
    async with user_channel(state_app.server.bound_address, secret) as ch:
        resp: acl_pb2.ACLOneTimeTokenResponse = await acl_pb2_grpc.ACLStub(ch).UpsertOneTimeToken(
            acl_pb2.ACLUpsertOneTimeTokenRequest()
        )
        return resp


async def _exchange(stub: acl_pb2_grpc.ACLAsyncStub, secret: str) -> acl_pb2.ACLTokenResponse:
    request = acl_pb2.ACLExchangeOneTimeTokenRequest(one_time_secret_id=secret)
    resp: acl_pb2.ACLTokenResponse = await stub.ExchangeOneTimeToken(request)
    return resp


async def _code(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code(), err.value.details() or ""


async def test_exchange_gives_the_token_once(
    state_app: StateApp,
    management: acl_pb2_grpc.ACLAsyncStub,
    anonymous: acl_pb2_grpc.ACLAsyncStub,
) -> None:
    token = await _client_token(management)
    made = await _one_time(state_app, token.secret_id)
    ott = made.one_time_token
    assert ott.accessor_id == token.accessor_id
    assert ott.one_time_secret_id and ott.one_time_secret_id != token.secret_id
    assert ott.create_index == ott.modify_index == made.index > token.create_index
    assert 0 < ott.expires_at - time.time_ns() <= TEN_MINUTES_NS  # Nomad's 10 minutes

    # anyone holding the one-time secret exchanges it, with no token of their own
    got = await anonymous.ExchangeOneTimeToken(
        acl_pb2.ACLExchangeOneTimeTokenRequest(one_time_secret_id=ott.one_time_secret_id)
    )
    assert got.token.accessor_id == token.accessor_id
    assert got.token.secret_id == token.secret_id
    assert list(got.token.policies) == ["readers"] and got.token.name == "ui user"
    assert got.index > made.index

    code, details = await _code(_exchange(anonymous, ott.one_time_secret_id))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "already exchanged" in details


async def test_lasts_ten_minutes_and_replaces_the_earlier_one(
    state_app: StateApp,
    management: acl_pb2_grpc.ACLAsyncStub,
    anonymous: acl_pb2_grpc.ACLAsyncStub,
) -> None:
    token = await _client_token(management)
    first = (await _one_time(state_app, token.secret_id)).one_time_token
    second = (await _one_time(state_app, token.secret_id)).one_time_token
    async with state_app.db.read() as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM expires_at - now()) FROM acl_one_time_tokens "
            "WHERE accessor_id = %s",
            (token.accessor_id,),
        )
        rows = await cur.fetchall()
    assert len(rows) == 1 and 590 < float(rows[0][0]) <= 600
    code, _ = await _code(_exchange(anonymous, first.one_time_secret_id))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    got = await _exchange(anonymous, second.one_time_secret_id)
    assert got.token.secret_id == token.secret_id


async def test_creating_needs_a_real_token(
    state_app: StateApp,
    management: acl_pb2_grpc.ACLAsyncStub,
    anonymous: acl_pb2_grpc.ACLAsyncStub,
) -> None:
    before = await state_app.db.latest_index()
    request = acl_pb2.ACLUpsertOneTimeTokenRequest()
    code, details = await _code(anonymous.UpsertOneTimeToken(request))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "carries none" in details
    code, _ = await _code(_one_time(state_app, "8a0b5d63-3c3f-4a3c-9d8e-000000000000"))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert await state_app.db.latest_index() == before


async def test_expired_one_time_tokens_are_refused_and_reaped(
    state_app: StateApp,
    management: acl_pb2_grpc.ACLAsyncStub,
    anonymous: acl_pb2_grpc.ACLAsyncStub,
    pg_dsn: str,
) -> None:
    token = await _client_token(management)
    ott = (await _one_time(state_app, token.secret_id)).one_time_token
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE acl_one_time_tokens SET expires_at = now() - interval '1 second' "
            "WHERE accessor_id = %s",
            (token.accessor_id,),
        )
    before = await state_app.db.latest_index()
    code, _ = await _code(_exchange(anonymous, ott.one_time_secret_id))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert await state_app.db.latest_index() == before  # refused: nothing written

    await collect_expired(state_app.ctx, 3600 * 10**9)  # the GC's pass, default threshold
    async with state_app.db.read() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM acl_one_time_tokens WHERE accessor_id = %s",
            (token.accessor_id,),
        )
        assert (await cur.fetchone()) == (0,)
    assert await state_app.db.latest_index() > before


async def test_an_expired_acl_token_makes_and_exchanges_none(
    state_app: StateApp,
    management: acl_pb2_grpc.ACLAsyncStub,
    anonymous: acl_pb2_grpc.ACLAsyncStub,
    pg_dsn: str,
) -> None:
    token = await _client_token(management, expiration_ttl=3600 * 10**9)
    ott = (await _one_time(state_app, token.secret_id)).one_time_token
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE acl_tokens SET expiration_time = now() - interval '1 second' "
            "WHERE accessor_id = %s",
            (token.accessor_id,),
        )
    code, details = await _code(_exchange(anonymous, ott.one_time_secret_id))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "expired" in details


async def test_concurrent_exchanges_give_the_token_once(
    state_app: StateApp,
    management: acl_pb2_grpc.ACLAsyncStub,
    anonymous: acl_pb2_grpc.ACLAsyncStub,
) -> None:
    token = await _client_token(management)
    ott = (await _one_time(state_app, token.secret_id)).one_time_token
    results = await asyncio.gather(
        *(_exchange(anonymous, ott.one_time_secret_id) for _ in range(8)),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, acl_pb2.ACLTokenResponse)]
    lost = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(won) == 1 and won[0].token.secret_id == token.secret_id
    assert len(lost) == 7
    assert all(e.code() == grpc.StatusCode.PERMISSION_DENIED for e in lost)


async def test_deleting_the_token_deletes_its_one_time_token(
    state_app: StateApp,
    management: acl_pb2_grpc.ACLAsyncStub,
    anonymous: acl_pb2_grpc.ACLAsyncStub,
) -> None:
    token = await _client_token(management)
    ott = (await _one_time(state_app, token.secret_id)).one_time_token
    await management.DeleteTokens(acl_pb2.ACLDeleteTokensRequest(accessor_ids=[token.accessor_id]))
    code, _ = await _code(_exchange(anonymous, ott.one_time_secret_id))
    assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_no_secret_is_stored_in_the_clear(
    state_app: StateApp, management: acl_pb2_grpc.ACLAsyncStub
) -> None:
    token = await _client_token(management)
    ott = (await _one_time(state_app, token.secret_id)).one_time_token
    async with state_app.db.read() as conn:
        cur = await conn.execute(
            "SELECT secret_hash, sealed_secret FROM acl_one_time_tokens WHERE accessor_id = %s",
            (token.accessor_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    assert row[0] == hashlib.sha256(ott.one_time_secret_id.encode()).hexdigest()
    sealed = bytes(row[1])
    for secret in (token.secret_id, ott.one_time_secret_id):
        assert secret.encode() not in sealed


async def test_an_empty_exchange_is_refused(anonymous: acl_pb2_grpc.ACLAsyncStub) -> None:
    code, details = await _code(_exchange(anonymous, ""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "one_time_secret_id" in details


# ------------------------------------------------- over Nomad's HTTP API


@pytest.fixture(scope="module")
async def http(
    state_app: StateApp, management: acl_pb2_grpc.ACLAsyncStub
) -> AsyncIterator[gateway.Http]:
    token = await _client_token(management)
    async with gateway.served_gateway(state_app.server.bound_address) as url:
        yield gateway.Http(url, {"client": token.secret_id})


async def test_http_routes_answer_nomads_json(http: gateway.Http) -> None:
    def work() -> None:
        status, made, headers = http.call("PUT", "/v1/acl/token/onetime", who="client")
        assert status == 200, made
        ott = made["OneTimeToken"]
        fields = {"OneTimeSecretID", "AccessorID", "ExpiresAt", "CreateIndex", "ModifyIndex"}
        assert set(ott) == fields
        assert int(headers["x-nomad-index"]) == ott["CreateIndex"]
        assert ott["ExpiresAt"].endswith("Z")

        # the exchange needs no token: the one-time secret is the authorization
        body = {"OneTimeSecretID": ott["OneTimeSecretID"]}
        status, got, _ = http.call("POST", "/v1/acl/token/onetime/exchange", body, who="")
        assert status == 200, got
        assert got["Token"]["SecretID"] == http.tokens["client"]
        assert got["Token"]["AccessorID"] == ott["AccessorID"]
        assert got["Token"]["Policies"] == ["readers"]

        status, again, _ = http.call("PUT", "/v1/acl/token/onetime/exchange", body, who="")
        assert status == 403, again

        # POST makes one too; an anonymous caller gets none
        status, made, _ = http.call("POST", "/v1/acl/token/onetime", who="client")
        assert status == 200 and made["OneTimeToken"]["OneTimeSecretID"]
        status, text, _ = http.call("PUT", "/v1/acl/token/onetime", who="")
        assert status == 403, text

        status, text, _ = http.call("POST", "/v1/acl/token/onetime/exchange", {}, who="")
        assert status == 400 and "OneTimeSecretID" in text
        status, text, _ = http.call("GET", "/v1/acl/token/onetime", who="client")
        assert status == 405, text

    await asyncio.to_thread(work)


# ------------------------------------------------------- corral ui


async def _corral(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_corral_ui_authenticate_hands_the_ui_a_one_time_token(
    state_app: StateApp, http: gateway.Http, capsys: pytest.CaptureFixture[str]
) -> None:
    address = ["-address", state_app.server.bound_address, "-http-addr", http.url]
    code, out, err = await _corral(
        capsys, "ui", *address, "-token", http.tokens["client"], "-authenticate", "-show-url"
    )
    assert code == 0, err
    assert out.startswith(f"URL for web UI: {http.url}/ui/?ott=")
    url = urllib.parse.urlsplit(out.split(": ", 1)[1].strip())
    ott = urllib.parse.parse_qs(url.query)["ott"][0]

    def exchange() -> tuple[int, object, dict[str, str]]:
        return http.call("POST", "/v1/acl/token/onetime/exchange", {"OneTimeSecretID": ott}, "")

    status, got, _ = await asyncio.to_thread(exchange)
    assert status == 200 and got["Token"]["SecretID"] == http.tokens["client"]  # type: ignore[index]

    # without -authenticate: the address alone, and no token is made
    code, out, err = await _corral(capsys, "ui", *address, "-show-url")
    assert (code, out) == (0, f"URL for web UI: {http.url}/ui/\n"), err
    # anonymous -authenticate: refused, in words
    code, out, err = await _corral(capsys, "ui", *address, "-authenticate", "-show-url")
    assert code == 1 and "Permission denied" in err and not out


async def test_corral_ui_without_a_browser_prints_the_address(
    state_app: StateApp,
    http: gateway.Http,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BROWSER", "false")  # a "browser" that fails to open anything
    monkeypatch.setenv("CORRAL_HTTP_ADDR", http.url)
    code, out, err = await _corral(
        capsys, "ui", "-address", state_app.server.bound_address,
        "-token", http.tokens["client"], "-authenticate",
    )  # fmt: skip
    assert code == 0, err
    first, second = out.splitlines()
    assert first == f'Opening URL "{http.url}/ui/" with one-time token'
    assert second.startswith("No browser to open it with here; the address is: ")
    assert second.split(": ", 1)[1].startswith(f"{http.url}/ui/?ott=")


async def test_corral_ui_opens_an_objects_page(
    state_app: StateApp,
    management: acl_pb2_grpc.ACLAsyncStub,
    http: gateway.Http,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mgmt = await management.CreateToken(acl_pb2.ACLCreateTokenRequest(type="management"))
    secret = mgmt.token.secret_id
    async with user_channel(state_app.server.bound_address, secret) as ch:
        node = mock.node()
        await node_pb2_grpc.NodeStub(ch).Register(node_pb2.NodeRegisterRequest(node=node))
        await job_pb2_grpc.JobStub(ch).Register(
            job_pb2.JobRegisterRequest(job=mock.job(job_id="ui-web", count=1))
        )
    base = ["ui", "-address", state_app.server.bound_address, "-http-addr", http.url]
    base += ["-token", secret, "-show-url"]
    code, out, err = await _corral(capsys, *base, "ui-w")
    assert (code, out) == (0, f"URL for web UI: {http.url}/ui/jobs/ui-web\n"), err
    code, out, err = await _corral(capsys, *base, node.id[:8])
    assert (code, out) == (0, f"URL for web UI: {http.url}/ui/nodes/{node.id}\n"), err
    code, out, err = await _corral(capsys, *base, "-namespace", "default", "ui-web")
    assert out == f"URL for web UI: {http.url}/ui/jobs/ui-web?namespace=default\n", err
    code, out, err = await _corral(capsys, *base, "no-such-thing")
    assert code == 1 and 'no job, allocation or node with id or prefix "no-such-thing"' in err
