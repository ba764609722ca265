"""The ACL API against a real state service and PostgreSQL: bootstrap once,
policies and tokens, secrets stored only as hashes, expiry, ResolveToken
and TokenSelf, and the management gate of each RPC."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator

import grpc
import psycopg
import pytest

from corral.domain.errors import PermissionDenied
from corral.security import acl
from corral.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    event_pb2,
    event_pb2_grpc,
    operator_pb2,
    operator_pb2_grpc,
    query_pb2,
)
from services.state.acl import DatabaseResolver
from services.state.app import StateApp
from services.state.token_gc import collect_expired
from tests.callers import user_channel
from tests.integration.state_api.settings import state_settings

READ_DEFAULT = 'namespace "default" { policy = "read" }'
WRITE_DEV = 'namespace "dev-*" { policy = "write" }\nnode { policy = "read" }'


#: the package's `state_app` enforces ACLs for this module (conftest.py)
ACL_ENABLED = True


@pytest.fixture(scope="module")
async def anonymous(state_app: StateApp) -> AsyncIterator[acl_pb2_grpc.ACLAsyncStub]:
    async with user_channel(state_app.server.bound_address) as ch:
        yield acl_pb2_grpc.ACLStub(ch)


@pytest.fixture(scope="module")
async def bootstrap(anonymous: acl_pb2_grpc.ACLAsyncStub) -> acl_pb2.ACLTokenResponse:
    resp: acl_pb2.ACLTokenResponse = await anonymous.Bootstrap(acl_pb2.ACLBootstrapRequest())
    return resp


@pytest.fixture(scope="module")
async def channel(
    state_app: StateApp, bootstrap: acl_pb2.ACLTokenResponse
) -> AsyncIterator[grpc.aio.Channel]:
    """Calls with the bootstrap (management) token."""
    address = state_app.server.bound_address
    async with user_channel(address, bootstrap.token.secret_id) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.aio.Channel) -> acl_pb2_grpc.ACLAsyncStub:
    return acl_pb2_grpc.ACLStub(channel)


@pytest.fixture(scope="module")
async def policies(stub: acl_pb2_grpc.ACLAsyncStub) -> list[str]:
    await stub.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[
                acl_pb2.ACLPolicy(name="readers", description="read default", rules=READ_DEFAULT),
                acl_pb2.ACLPolicy(name="dev-writers", rules=WRITE_DEV),
            ]
        )
    )
    return ["readers", "dev-writers"]


async def _create(stub: acl_pb2_grpc.ACLAsyncStub, **kw: object) -> acl_pb2.ACLToken:
    resp = await stub.CreateToken(acl_pb2.ACLCreateTokenRequest(**kw))  # type: ignore[arg-type]
    token: acl_pb2.ACLToken = resp.token
    return token


async def _code(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code(), err.value.details() or ""


async def _index(state_app: StateApp) -> int:
    return await state_app.db.latest_index()


# ------------------------------------------------------------------ bootstrap


async def test_bootstrap_gives_a_management_token_once(
    stub: acl_pb2_grpc.ACLAsyncStub, bootstrap: acl_pb2.ACLTokenResponse, state_app: StateApp
) -> None:
    token = bootstrap.token
    assert token.type == "management" and token.name == "Bootstrap Token"
    assert token.secret_id and token.accessor_id and token.secret_id != token.accessor_id
    assert token.is_global and not token.policies and not token.expiration_time
    assert token.create_index == token.modify_index == bootstrap.index > 0
    assert (await state_app.ctx.acl.resolve(token.secret_id)).is_management

    before = await _index(state_app)
    code, details = await _code(stub.Bootstrap(acl_pb2.ACLBootstrapRequest()))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert details == "ACL bootstrap already done"
    assert await _index(state_app) == before


async def test_bootstrap_with_an_operator_secret(fresh_pg_dsn: str) -> None:
    app = StateApp(state_settings(fresh_pg_dsn, acl=True))
    await app.start()
    try:
        async with grpc.aio.insecure_channel(app.server.bound_address) as ch:
            s = acl_pb2_grpc.ACLStub(ch)
            code, details = await _code(s.Bootstrap(acl_pb2.ACLBootstrapRequest(secret_id="x")))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "secret_id" in details
            secret = acl.new_secret()
            resp = await s.Bootstrap(acl_pb2.ACLBootstrapRequest(secret_id=secret))
            assert resp.token.secret_id == secret
            assert (await app.ctx.acl.resolve(secret)).is_management
    finally:
        await app.stop()


async def test_concurrent_bootstraps_make_one_token(fresh_pg_dsn: str) -> None:
    import asyncio

    app = StateApp(state_settings(fresh_pg_dsn, acl=True))
    await app.start()
    try:
        async with grpc.aio.insecure_channel(app.server.bound_address) as ch:
            s = acl_pb2_grpc.ACLStub(ch)
            outcomes = await asyncio.gather(
                *(s.Bootstrap(acl_pb2.ACLBootstrapRequest()) for _ in range(5)),
                return_exceptions=True,
            )
            won = [o for o in outcomes if isinstance(o, acl_pb2.ACLTokenResponse)]
            lost = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
            assert len(won) == 1 and len(lost) == 4
            assert all(e.code() == grpc.StatusCode.FAILED_PRECONDITION for e in lost)
            secret = won[0].token.secret_id
            listed = await s.ListTokens(
                acl_pb2.ACLListTokensRequest(), metadata=(("x-corral-token", secret),)
            )
            assert [t.accessor_id for t in listed.tokens] == [won[0].token.accessor_id]
    finally:
        await app.stop()


# ------------------------------------------------------------------- policies


async def test_policies_upsert_list_get_delete(
    stub: acl_pb2_grpc.ACLAsyncStub, policies: list[str]
) -> None:
    listed = await stub.ListPolicies(acl_pb2.ACLListPoliciesRequest())
    assert [p.name for p in listed.policies] == ["dev-writers", "readers"]
    assert all(not p.rules for p in listed.policies)  # the list leaves rules out
    assert listed.meta.index > 0

    got = await stub.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="readers"))
    assert got.policy.rules == READ_DEFAULT and got.policy.description == "read default"
    created = got.policy.create_index

    w = await stub.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name="scratch", rules='operator { policy = "read" }')]
        )
    )
    again = await stub.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name="scratch", rules='operator { policy = "write" }')]
        )
    )
    got = await stub.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="scratch"))
    assert got.policy.rules == 'operator { policy = "write" }'
    assert (got.policy.create_index, got.policy.modify_index) == (w.index, again.index)
    assert (
        await stub.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="readers"))
    ).policy.create_index == created

    page = await stub.ListPolicies(
        acl_pb2.ACLListPoliciesRequest(query=query_pb2.QueryOptions(per_page=1, prefix="s"))
    )
    assert [p.name for p in page.policies] == ["scratch"] and not page.meta.next_token

    await stub.DeletePolicies(acl_pb2.ACLDeletePoliciesRequest(names=["scratch"]))
    code, details = await _code(stub.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="scratch")))
    assert code == grpc.StatusCode.NOT_FOUND and "scratch" in details


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (acl_pb2.ACLPolicy(name="", rules=READ_DEFAULT), "policies[1].name: is required"),
        (acl_pb2.ACLPolicy(name="a b", rules=READ_DEFAULT), "policies[1].name: may contain"),
        (acl_pb2.ACLPolicy(name="fine", rules=READ_DEFAULT), "policies[1].name: 'fine' is given"),
        (acl_pb2.ACLPolicy(name="x", rules="nope {"), "policies[1].rules: not valid HCL"),
        (
            acl_pb2.ACLPolicy(name="x", rules='namespace "a" { capabilities = ["root"] }'),
            "policies[1].rules: namespace \"a\".capabilities[0]: unknown capability 'root'",
        ),
        (
            acl_pb2.ACLPolicy(name="x", rules=READ_DEFAULT, description="d" * 257),
            "policies[1].description: is longer than 256",
        ),
    ],
)
async def test_bad_policies_are_refused_and_nothing_is_written(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp, policy: acl_pb2.ACLPolicy, message: str
) -> None:
    before = await _index(state_app)
    got, details = await _code(
        stub.UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[acl_pb2.ACLPolicy(name="fine", rules=READ_DEFAULT), policy]
            )
        )
    )
    assert got == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(message), details
    assert "Traceback" not in details
    assert await _index(state_app) == before
    got, _ = await _code(stub.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="fine")))
    assert got == grpc.StatusCode.NOT_FOUND


async def test_deleting_a_missing_policy_deletes_nothing(
    stub: acl_pb2_grpc.ACLAsyncStub, policies: list[str], state_app: StateApp
) -> None:
    before = await _index(state_app)
    code, details = await _code(
        stub.DeletePolicies(acl_pb2.ACLDeletePoliciesRequest(names=["readers", "ghost"]))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "ghost" in details
    assert await _index(state_app) == before
    assert (await stub.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="readers"))).policy.name


# --------------------------------------------------------------------- tokens


async def test_token_create_list_info_delete(
    stub: acl_pb2_grpc.ACLAsyncStub, policies: list[str], bootstrap: acl_pb2.ACLTokenResponse
) -> None:
    token = await _create(stub, name="ci", policies=["readers", "readers", "dev-writers"])
    assert token.secret_id and token.type == "client" and token.name == "ci"
    assert list(token.policies) == ["readers", "dev-writers"]  # once each, in order
    assert token.create_time > 0 and token.expiration_time == 0

    listed = await stub.ListTokens(acl_pb2.ACLListTokensRequest())
    by_id = {t.accessor_id: t for t in listed.tokens}
    assert token.accessor_id in by_id and bootstrap.token.accessor_id in by_id
    assert all(not t.secret_id for t in listed.tokens)

    info = await stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))
    assert not info.token.secret_id
    expected = acl_pb2.ACLToken()
    expected.CopyFrom(token)
    expected.secret_id = ""
    assert info.token == expected

    mgmt = await _create(stub, name="ops", type="management")
    assert mgmt.type == "management" and not mgmt.policies

    await stub.DeleteTokens(acl_pb2.ACLDeleteTokensRequest(accessor_ids=[token.accessor_id]))
    code, _ = await _code(stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id)))
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = await _code(
        stub.ResolveToken(acl_pb2.ACLResolveTokenRequest(secret_id=token.secret_id))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and details == "ACL token not found"


async def test_token_expiry_ttl_is_bounded(
    stub: acl_pb2_grpc.ACLAsyncStub, policies: list[str]
) -> None:
    hour = 3600 * 10**9
    token = await _create(stub, name="short", policies=["readers"], expiration_ttl=hour)
    assert abs(token.expiration_time - token.create_time - hour) < 10**6
    for ttl in (10**9, 25 * hour):  # 1 s < 1 min default minimum; 25 h > 24 h maximum
        code, details = await _code(
            stub.CreateToken(
                acl_pb2.ACLCreateTokenRequest(policies=["readers"], expiration_ttl=ttl)
            )
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "expiration_ttl" in details


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (acl_pb2.ACLCreateTokenRequest(type="client"), "client token needs at least one policy"),
        (
            acl_pb2.ACLCreateTokenRequest(type="management", policies=["readers"]),
            "management token takes no policies",
        ),
        (acl_pb2.ACLCreateTokenRequest(type="root", policies=["readers"]), "type: must be one of"),
        (acl_pb2.ACLCreateTokenRequest(policies=["ghost"]), "no such ACL policy: ghost"),
        (acl_pb2.ACLCreateTokenRequest(policies=["a b"]), "policies[0]"),
        (acl_pb2.ACLCreateTokenRequest(name="n" * 257, policies=["readers"]), "name"),
        (
            acl_pb2.ACLCreateTokenRequest(policies=["readers"], expiration_ttl=-1),
            "must not be negative",
        ),
    ],
)
async def test_bad_tokens_are_refused_and_nothing_is_written(
    stub: acl_pb2_grpc.ACLAsyncStub,
    state_app: StateApp,
    policies: list[str],
    request_: acl_pb2.ACLCreateTokenRequest,
    message: str,
) -> None:
    before = await _index(state_app)
    count = len((await stub.ListTokens(acl_pb2.ACLListTokensRequest())).tokens)
    code, details = await _code(stub.CreateToken(request_))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    assert await _index(state_app) == before
    assert len((await stub.ListTokens(acl_pb2.ACLListTokensRequest())).tokens) == count


async def test_a_token_is_updated_in_place(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp, policies: list[str]
) -> None:
    """Nomad's token update: name, type and policies change; the secret,
    Global and the expiration stay; what the token may do follows at once."""
    hour = 3600 * 10**9
    made = await stub.CreateToken(
        acl_pb2.ACLCreateTokenRequest(name="before", policies=["readers"], expiration_ttl=hour)
    )
    token, secret = made.token, made.token.secret_id
    assert not (await state_app.ctx.acl.resolve(secret)).allows("node", "read")
    ttl = token.expiration_time - token.create_time
    resp = await stub.UpdateToken(
        acl_pb2.ACLUpdateTokenRequest(
            accessor_id=token.accessor_id,
            name="after",
            policies=["readers", "dev-writers", "readers"],
            expiration_ttl=ttl,
            expiration_time=token.expiration_time,
        )
    )
    updated = resp.token
    assert (updated.name, list(updated.policies)) == ("after", ["readers", "dev-writers"])
    assert updated.modify_index == resp.index > token.modify_index
    assert updated.create_index == token.create_index and not updated.secret_id
    assert updated.expiration_time == token.expiration_time
    read = (await stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))).token
    assert read == updated
    # the same secret, the new rules (dev-writers reads nodes)
    assert (await state_app.ctx.acl.resolve(secret)).allows("node", "read")
    to_management = acl_pb2.ACLUpdateTokenRequest(accessor_id=token.accessor_id, type="management")
    assert (await stub.UpdateToken(to_management)).token.type == "management"
    assert (await state_app.ctx.acl.resolve(secret)).is_management


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"is_global": True}, "cannot toggle global mode"),
        ({"expiration_ttl": 2 * 3600 * 10**9}, "cannot update expiration TTL"),
        ({"expiration_time": 1}, "cannot update expiration time"),
        ({"policies": ["ghost"]}, "no such ACL policy: ghost"),
        ({"policies": []}, "client token needs at least one policy"),
        ({"type": "management"}, "management token takes no policies"),
    ],
)
async def test_a_token_update_nomad_refuses_writes_nothing(
    stub: acl_pb2_grpc.ACLAsyncStub,
    state_app: StateApp,
    policies: list[str],
    change: dict[str, object],
    message: str,
) -> None:
    token = await _create(stub, name="kept", policies=["readers"], expiration_ttl=3600 * 10**9)
    request = acl_pb2.ACLUpdateTokenRequest(
        accessor_id=token.accessor_id, name="changed", policies=["readers"]
    )
    for key, value in change.items():
        if isinstance(value, list):
            request.ClearField(key)  # type: ignore[arg-type]
            getattr(request, key).extend(value)
        else:
            setattr(request, key, value)
    before = await _index(state_app)
    code, details = await _code(stub.UpdateToken(request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, details
    assert await _index(state_app) == before
    read = (await stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))).token
    assert read.name == "kept"


async def test_updating_an_unknown_token_is_not_found(stub: acl_pb2_grpc.ACLAsyncStub) -> None:
    code, _ = await _code(
        stub.UpdateToken(
            acl_pb2.ACLUpdateTokenRequest(accessor_id=str(uuid.uuid4()), policies=["readers"])
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND


async def test_deleting_unknown_tokens_deletes_nothing(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp, policies: list[str]
) -> None:
    token = await _create(stub, policies=["readers"])
    before = await _index(state_app)
    code, details = await _code(
        stub.DeleteTokens(acl_pb2.ACLDeleteTokensRequest(accessor_ids=[token.accessor_id, "nope"]))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in details
    assert await _index(state_app) == before
    await stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))


# -------------------------------------------------------------- secrets at rest


async def test_the_database_holds_only_secret_hashes(
    stub: acl_pb2_grpc.ACLAsyncStub,
    pg_dsn: str,
    policies: list[str],
    bootstrap: acl_pb2.ACLTokenResponse,
) -> None:
    token = await _create(stub, name="hashed", policies=["readers"])
    secrets = [token.secret_id, bootstrap.token.secret_id]
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute(
            "SELECT secret_hash FROM acl_tokens WHERE accessor_id = %s", (token.accessor_id,)
        )
        row = await cur.fetchone()
        assert row is not None
        assert row[0] == hashlib.sha256(token.secret_id.encode()).hexdigest()
        # a dump of every table (the change log included) holds no secret
        cur = await conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
        tables = [r[0] for r in await cur.fetchall()]
        assert "acl_tokens" in tables and "change_log" in tables
        for table in tables:
            cur = await conn.execute(f'SELECT t::text FROM "{table}" t')  # noqa: S608
            dump = "\n".join(r[0] for r in await cur.fetchall())
            for secret in secrets:
                assert secret not in dump, f"secret found in {table}"
                assert secret.replace("-", "") not in dump.replace("-", "")
        cur = await conn.execute("SELECT payload FROM change_log")
        for (payload,) in await cur.fetchall():
            for secret in secrets:
                assert secret.encode() not in bytes(payload)


# ------------------------------------------------------------- resolving


async def test_resolve_token_answers_type_expiry_and_rules(
    stub: acl_pb2_grpc.ACLAsyncStub, policies: list[str], bootstrap: acl_pb2.ACLTokenResponse
) -> None:
    token = await _create(stub, policies=["readers", "dev-writers"])
    resp = await stub.ResolveToken(acl_pb2.ACLResolveTokenRequest(secret_id=token.secret_id))
    assert resp.accessor_id == token.accessor_id and resp.type == "client"
    assert {p.name: p.rules for p in resp.policies} == {
        "readers": READ_DEFAULT,
        "dev-writers": WRITE_DEV,
    }
    mgmt = await stub.ResolveToken(
        acl_pb2.ACLResolveTokenRequest(secret_id=bootstrap.token.secret_id)
    )
    assert mgmt.type == "management" and not mgmt.policies
    code, details = await _code(
        stub.ResolveToken(acl_pb2.ACLResolveTokenRequest(secret_id=acl.new_secret()))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and details == "ACL token not found"


async def test_anonymous_is_the_anonymous_policy_or_nothing(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp
) -> None:
    resolver = DatabaseResolver(state_app.db)
    assert (await stub.ResolveToken(acl_pb2.ACLResolveTokenRequest())).policies == []
    assert (await resolver.resolve("")) is acl.DENY_ALL
    await stub.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name="anonymous", rules=READ_DEFAULT)]
        )
    )
    try:
        resp = await stub.ResolveToken(acl_pb2.ACLResolveTokenRequest())
        assert resp.accessor_id == "anonymous" and [p.name for p in resp.policies] == ["anonymous"]
        anon = await DatabaseResolver(state_app.db).resolve("")
        assert anon.allows_namespace("default", "read-job")
        assert not anon.allows_namespace("default", "submit-job")
    finally:
        await stub.DeletePolicies(acl_pb2.ACLDeletePoliciesRequest(names=["anonymous"]))


async def test_expired_tokens_are_refused(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp, pg_dsn: str, policies: list[str]
) -> None:
    token = await _create(stub, policies=["readers"], expiration_ttl=3600 * 10**9)
    # a resolver whose clock is past the expiry refuses it, from the cache too
    late = DatabaseResolver(state_app.db, wall_clock=lambda: token.expiration_time + 1)
    with pytest.raises(PermissionDenied, match="ACL token expired"):
        await late.resolve(token.secret_id)
    now = {"ns": token.create_time}
    soon = DatabaseResolver(state_app.db, ttl=3600, wall_clock=lambda: now["ns"])
    assert not (await soon.resolve(token.secret_id)).is_management
    now["ns"] = token.expiration_time
    with pytest.raises(PermissionDenied, match="ACL token expired"):
        await soon.resolve(token.secret_id)
    assert soon.lookups == 1

    # and over the API, once the stored expiry has passed
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE acl_tokens SET expiration_time = now() - interval '1 second' "
            "WHERE accessor_id = %s",
            (token.accessor_id,),
        )
    state_app.ctx.acl.invalidate()
    code, details = await _code(
        stub.ResolveToken(acl_pb2.ACLResolveTokenRequest(secret_id=token.secret_id))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and details == "ACL token expired"


async def test_the_state_resolver_caches_and_forgets_on_acl_writes(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp, policies: list[str]
) -> None:
    resolver = state_app.ctx.acl
    resolver.invalidate()
    token = await _create(stub, policies=["readers"])
    first = await resolver.resolve(token.secret_id)
    looked = resolver.lookups
    assert await resolver.resolve(token.secret_id) is first
    assert resolver.lookups == looked  # served from the cache

    bad = acl.new_secret()
    for _ in range(3):
        with pytest.raises(PermissionDenied, match="ACL token not found"):
            await resolver.resolve(bad)
    assert resolver.lookups == looked + 1  # the miss is cached too

    # a policy change reaches the next resolve at once (the write invalidates)
    await stub.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name="readers", rules=WRITE_DEV)]
        )
    )
    try:
        changed = await resolver.resolve(token.secret_id)
        assert changed is not first and changed.allows_namespace("dev-1", "submit-job")
    finally:
        await stub.UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[acl_pb2.ACLPolicy(name="readers", rules=READ_DEFAULT)]
            )
        )
    await stub.DeleteTokens(acl_pb2.ACLDeleteTokensRequest(accessor_ids=[token.accessor_id]))
    with pytest.raises(PermissionDenied, match="ACL token not found"):
        await resolver.resolve(token.secret_id)


async def test_an_acl_write_elsewhere_reaches_the_cache_through_the_feed(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp, policies: list[str]
) -> None:
    """Another state process's write arrives only through the change feed;
    a write made straight through the database stands in for it."""
    from services.state.writes import acl as acl_writes
    from tests.wait import until

    resolver = state_app.ctx.acl
    token = await _create(stub, policies=["readers"])
    await resolver.resolve(token.secret_id)
    async with state_app.db.write() as tx:
        await acl_writes.delete_tokens(tx, [token.accessor_id])

    async def refused() -> bool:
        try:
            await resolver.resolve(token.secret_id)
        except PermissionDenied:
            return True
        return False

    await until(refused, 10, what="the deleted token refused")


# ------------------------------------------------------------------ token self


async def test_token_self_reads_the_callers_token(
    stub: acl_pb2_grpc.ACLAsyncStub, anonymous: acl_pb2_grpc.ACLAsyncStub, policies: list[str]
) -> None:
    token = await _create(stub, name="me", policies=["readers"])
    for md in (
        (("x-corral-token", token.secret_id),),
        (("authorization", f"Bearer {token.secret_id}"),),
    ):
        me = await anonymous.TokenSelf(acl_pb2.ACLTokenSelfRequest(), metadata=md)
        assert me.token.accessor_id == token.accessor_id and me.token.name == "me"
        assert not me.token.secret_id
    anon = await anonymous.TokenSelf(acl_pb2.ACLTokenSelfRequest())
    assert anon.token.accessor_id == "anonymous" and anon.token.type == "client"
    code, details = await _code(
        anonymous.TokenSelf(
            acl_pb2.ACLTokenSelfRequest(), metadata=(("x-corral-token", acl.new_secret()),)
        )
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and details == "ACL token not found"


# ---------------------------------------------------------- the management gate


@pytest.fixture
async def as_client(
    state_app: StateApp, stub: acl_pb2_grpc.ACLAsyncStub, policies: list[str]
) -> AsyncIterator[acl_pb2_grpc.ACLAsyncStub]:
    """The ACL API as a client token holding the `readers` policy calls it."""
    token = await _create(stub, policies=["readers"])
    async with user_channel(state_app.server.bound_address, token.secret_id) as ch:
        yield acl_pb2_grpc.ACLStub(ch)


async def test_a_client_token_cannot_manage_acls(
    as_client: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp
) -> None:
    before = await _index(state_app)
    calls = [
        as_client.UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[acl_pb2.ACLPolicy(name="mine", rules=WRITE_DEV)]
            )
        ),
        as_client.DeletePolicies(acl_pb2.ACLDeletePoliciesRequest(names=["readers"])),
        as_client.CreateToken(acl_pb2.ACLCreateTokenRequest(type="management")),
        as_client.ListTokens(acl_pb2.ACLListTokensRequest()),
        as_client.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id="x")),
        as_client.DeleteTokens(acl_pb2.ACLDeleteTokensRequest(accessor_ids=["x"])),
        as_client.UpdateToken(acl_pb2.ACLUpdateTokenRequest(accessor_id="x", type="management")),
        as_client.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="dev-writers")),
    ]
    for call in calls:
        code, details = await _code(call)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "Permission denied" in details
    assert await _index(state_app) == before


async def test_a_client_token_sees_its_own_policies(as_client: acl_pb2_grpc.ACLAsyncStub) -> None:
    listed = await as_client.ListPolicies(acl_pb2.ACLListPoliciesRequest())
    assert [p.name for p in listed.policies] == ["readers"]
    got = await as_client.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="readers"))
    assert got.policy.rules == READ_DEFAULT


# ------------------------------------------------------------ the event stream


async def test_acl_changes_stay_out_of_the_event_stream(
    stub: acl_pb2_grpc.ACLAsyncStub, channel: grpc.aio.Channel, state_app: StateApp
) -> None:
    start = await _index(state_app)
    await stub.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name="streamed", rules=READ_DEFAULT)]
        )
    )
    ops = operator_pb2_grpc.OperatorStub(channel)
    cfg = (
        await ops.SchedulerGetConfiguration(operator_pb2.SchedulerGetConfigurationRequest())
    ).config
    after = await ops.SchedulerSetConfiguration(
        operator_pb2.SchedulerSetConfigurationRequest(config=cfg)
    )
    events = event_pb2_grpc.EventStub(channel).Stream(
        event_pb2.EventStreamRequest(from_index=start)
    )
    try:
        async for resp in events:
            if resp.heartbeat:
                continue
            assert all(e.topic not in ("ACLPolicy", "ACLToken") for e in resp.events)
            assert resp.index == after.index  # the ACL write before it was skipped
            break
    finally:
        events.cancel()


async def test_expired_tokens_are_deleted_after_the_threshold(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp, pg_dsn: str, policies: list[str]
) -> None:
    hour = 3600 * 10**9
    old, recent, valid = [
        await _create(stub, policies=["readers"], expiration_ttl=hour) for _ in range(3)
    ]
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        for token, ago in ((old, "2 hours"), (recent, "10 seconds")):
            await conn.execute(
                "UPDATE acl_tokens SET expiration_time = now() - %s::interval "
                "WHERE accessor_id = %s",
                (ago, token.accessor_id),
            )
    deleted = await collect_expired(state_app.ctx, hour)  # the default threshold
    assert old.accessor_id in deleted
    assert {recent.accessor_id, valid.accessor_id}.isdisjoint(deleted)
    deleted = await collect_expired(state_app.ctx, 0)  # `corral system gc`
    assert recent.accessor_id in deleted and valid.accessor_id not in deleted
    for token in (old, recent):
        code, _ = await _code(
            stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))
        )
        assert code == grpc.StatusCode.NOT_FOUND
    # nothing left to delete: no write, the index stays
    index = await state_app.db.latest_index()
    assert await collect_expired(state_app.ctx, 0) == []
    assert await state_app.db.latest_index() == index


async def test_a_deleted_token_ends_its_event_stream(
    stub: acl_pb2_grpc.ACLAsyncStub, channel: grpc.aio.Channel, state_app: StateApp
) -> None:
    await stub.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name="ops-readers", rules='operator { policy = "read" }')]
        )
    )
    token = await _create(stub, policies=["ops-readers"])
    ops = operator_pb2_grpc.OperatorStub(channel)
    cfg = (
        await ops.SchedulerGetConfiguration(operator_pb2.SchedulerGetConfigurationRequest())
    ).config
    start = await _index(state_app)
    first = await ops.SchedulerSetConfiguration(
        operator_pb2.SchedulerSetConfigurationRequest(config=cfg)
    )
    async with user_channel(state_app.server.bound_address, token.secret_id) as ch:
        events = event_pb2_grpc.EventStub(ch).Stream(event_pb2.EventStreamRequest(from_index=start))
        try:
            async for resp in events:  # open, and delivering what the token may read
                if not resp.heartbeat:
                    assert resp.index == first.index
                    break
            await stub.DeleteTokens(
                acl_pb2.ACLDeleteTokensRequest(accessor_ids=[token.accessor_id])
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async with asyncio.timeout(30):  # heartbeats every 10 s recheck too
                    async for resp in events:
                        assert resp.heartbeat, "nothing after the deletion is delivered"
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "ACL token not found" in (err.value.details() or "")
        finally:
            events.cancel()
