"""RemoteResolver (what workers and agents use) against a real state
service: answers from ACL.ResolveToken, cached for a TTL, misses cached
briefly, one call for many concurrent lookups, and cached tokens still
honoured (unless expired) while the state is unreachable."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from corral.domain.errors import PermissionDenied, Unavailable
from corral.security import acl
from corral.security.acl_resolve import RemoteResolver
from corral.v1 import acl_pb2, acl_pb2_grpc
from services.state.app import StateApp
from tests.integration.state_api.settings import state_settings

RULES = 'namespace "web-*" { policy = "write" }\noperator { policy = "read" }'


class Clock:
    """A monotonic clock the test moves by hand (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


#: the package's `state_app` enforces ACLs for this module (conftest.py)
ACL_ENABLED = True


@pytest.fixture(scope="module")
async def secrets(channel: grpc.aio.Channel) -> dict[str, str]:
    stub = acl_pb2_grpc.ACLStub(channel)
    boot = await stub.Bootstrap(acl_pb2.ACLBootstrapRequest())
    md = (("x-corral-token", boot.token.secret_id),)
    await stub.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(policies=[acl_pb2.ACLPolicy(name="web", rules=RULES)]),
        metadata=md,
    )
    client = await stub.CreateToken(acl_pb2.ACLCreateTokenRequest(policies=["web"]), metadata=md)
    hour = await stub.CreateToken(
        acl_pb2.ACLCreateTokenRequest(policies=["web"], expiration_ttl=3600 * 10**9),
        metadata=md,
    )
    return {
        "management": boot.token.secret_id,
        "client": client.token.secret_id,
        "hour": hour.token.secret_id,
        "hour_expiry": str(hour.token.expiration_time),
    }


async def test_resolves_management_client_and_anonymous(
    channel: grpc.aio.Channel, secrets: dict[str, str]
) -> None:
    r = RemoteResolver(channel)
    assert await r.resolve(secrets["management"]) is acl.MANAGEMENT
    client = await r.resolve(secrets["client"])
    assert client.policies == {"web"}
    assert client.allows_namespace("web-1", "submit-job")
    assert not client.allows_namespace("default", "list-jobs")
    assert client.allows("operator", "read") and not client.allows("operator", "write")
    assert await r.resolve("") is acl.DENY_ALL  # no "anonymous" policy


async def test_answers_are_cached_for_the_ttl(
    channel: grpc.aio.Channel, secrets: dict[str, str]
) -> None:
    clock = Clock()
    r = RemoteResolver(channel, ttl=30, clock=clock)
    first = await r.resolve(secrets["client"])
    assert await r.resolve(secrets["client"]) is first
    clock.now += 29
    await r.resolve(secrets["client"])
    assert r.calls == 1
    clock.now += 2
    await r.resolve(secrets["client"])
    assert r.calls == 2


async def test_misses_are_cached_briefly(channel: grpc.aio.Channel) -> None:
    clock = Clock()
    r = RemoteResolver(channel, miss_ttl=5, clock=clock)
    bad = acl.new_secret()
    for _ in range(50):
        with pytest.raises(PermissionDenied, match="ACL token not found"):
            await r.resolve(bad)
    assert r.calls == 1
    clock.now += 6
    with pytest.raises(PermissionDenied, match="ACL token not found"):
        await r.resolve(bad)
    assert r.calls == 2


async def test_concurrent_lookups_share_one_call(
    channel: grpc.aio.Channel, secrets: dict[str, str]
) -> None:
    r = RemoteResolver(channel)
    results = await asyncio.gather(*(r.resolve(secrets["client"]) for _ in range(20)))
    assert r.calls == 1 and all(x is results[0] for x in results)
    bad = acl.new_secret()
    outcomes = await asyncio.gather(*(r.resolve(bad) for _ in range(20)), return_exceptions=True)
    assert r.calls == 2 and all(isinstance(o, PermissionDenied) for o in outcomes)


async def test_a_cached_token_expires_on_time(
    channel: grpc.aio.Channel, secrets: dict[str, str]
) -> None:
    expiry = int(secrets["hour_expiry"])
    wall = {"ns": expiry - 10**9}
    r = RemoteResolver(channel, ttl=3600, wall_clock=lambda: wall["ns"])
    await r.resolve(secrets["hour"])
    wall["ns"] = expiry
    with pytest.raises(PermissionDenied, match="ACL token expired"):
        await r.resolve(secrets["hour"])
    assert r.calls == 1


async def test_cache_is_bounded(channel: grpc.aio.Channel) -> None:
    r = RemoteResolver(channel, max_entries=8)
    for _ in range(20):
        with pytest.raises(PermissionDenied):
            await r.resolve(acl.new_secret())
    assert len(r.cache) == 8


async def test_a_cached_token_survives_the_state_going_away(fresh_pg_dsn: str) -> None:
    app = StateApp(state_settings(fresh_pg_dsn, acl=True))
    await app.start()
    clock = Clock()
    try:
        channel = grpc.aio.insecure_channel(app.server.bound_address)
        boot = await acl_pb2_grpc.ACLStub(channel).Bootstrap(acl_pb2.ACLBootstrapRequest())
        r = RemoteResolver(channel, ttl=30, timeout=2, clock=clock)
        assert (await r.resolve(boot.token.secret_id)).is_management
    finally:
        await app.stop()
    try:
        clock.now += 60  # the answer is stale: the resolver asks again, and cannot reach the state
        assert (await r.resolve(boot.token.secret_id)).is_management
        assert r.calls == 2
        with pytest.raises(Unavailable, match="cannot resolve the ACL token"):
            await r.resolve(acl.new_secret())
    finally:
        await channel.close()
