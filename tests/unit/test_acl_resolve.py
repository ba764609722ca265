"""The resolvers' token cache: answers for a TTL, misses for a shorter one,
bounded size, and no answer kept that a lookup fetched before a clear."""

from __future__ import annotations

from corral.security import acl
from corral.security.acl_resolve import Resolved, TokenCache, acl_from_response
from corral.v1 import acl_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _resolved() -> Resolved:
    resp = acl_pb2.ACLResolveTokenResponse(type="management")
    return Resolved(resp, acl_from_response(resp))


def test_answers_and_misses_live_for_their_ttl() -> None:
    clock = Clock()
    cache = TokenCache(30, 5, clock=clock)
    hit = _resolved()
    cache.put("a", hit)
    cache.put("b", "ACL token not found")
    clock.now += 4
    assert cache.get("a") is hit and cache.get("b") == "ACL token not found"
    clock.now += 2
    assert cache.get("a") is hit and cache.get("b") is None
    clock.now += 25
    assert cache.get("a") is None
    assert cache.stale("a") is hit  # still there for an outage
    assert cache.stale("b") is None


def test_the_least_recently_used_entry_goes_first() -> None:
    cache = TokenCache(30, 5, max_entries=2, clock=Clock())
    cache.put("a", "x")
    cache.put("b", "x")
    cache.get("a")
    cache.put("c", "x")
    assert len(cache) == 2 and cache.get("b") is None and cache.get("a") == "x"


def test_a_lookup_that_raced_a_clear_is_not_kept() -> None:
    cache = TokenCache(30, 5, clock=Clock())
    before = cache.generation
    cache.clear()  # an ACL write while the lookup was in flight
    cache.put("a", _resolved(), before)
    assert cache.get("a") is None
    cache.put("a", _resolved(), cache.generation)
    assert cache.get("a") is not None


def test_responses_compile_to_acls() -> None:
    assert acl_from_response(acl_pb2.ACLResolveTokenResponse(type="management")) is acl.MANAGEMENT
    assert acl_from_response(acl_pb2.ACLResolveTokenResponse(type="client")) is acl.DENY_ALL
    resp = acl_pb2.ACLResolveTokenResponse(
        type="client",
        policies=[
            acl_pb2.ACLPolicy(name="a", rules='namespace "x" { policy = "write" }'),
            acl_pb2.ACLPolicy(name="broken", rules="not hcl {"),
        ],
    )
    compiled = acl_from_response(resp)
    assert compiled.policies == {"a"}  # a policy that no longer parses grants nothing
    assert compiled.allows_namespace("x", "submit-job")
