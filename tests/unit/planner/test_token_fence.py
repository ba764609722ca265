"""The planner's eval token check (services/planner/fence.py) against the
broker's half (services/broker/plan_fence.py), without processes: a token
is checked with the key the broker sent, a forged, foreign or revoked one
is refused, no key means UNAVAILABLE, and a revocation of a token whose
plan is in flight is confirmed only once that plan is done."""

from __future__ import annotations

import asyncio

import pytest

from corral.domain.errors import FailedPrecondition, Unavailable
from corral.security import eval_token
from services.broker.plan_fence import PlanFence
from services.planner.fence import TokenFence


def pair() -> tuple[PlanFence, TokenFence]:
    broker = PlanFence(wait_limit=5.0)
    planner = TokenFence("broker:1", lambda: "planner:1", key_wait=0.05)
    return broker, planner


def test_tokens_verify_only_for_their_eval_term_and_key() -> None:
    term, key = eval_token.new_key()
    token = eval_token.sign(key, term, "e1")
    assert eval_token.term_of(token) == term
    assert eval_token.verify(key, term, "e1", token)
    assert not eval_token.verify(key, term, "e2", token)
    other_term, other_key = eval_token.new_key()
    assert not eval_token.verify(other_key, other_term, "e1", token)
    assert not eval_token.verify(key, term, "e1", "not-" + token)
    assert not eval_token.verify(key, term, "e1", "")
    assert eval_token.sign(key, term, "e1") != token  # a fresh nonce per delivery


async def test_the_planner_checks_with_the_brokers_key() -> None:
    broker, planner = pair()
    token = broker.issue("e1")
    with pytest.raises(Unavailable, match="key is not known"):
        await planner.check("e1", token)  # no stream yet
    conn = broker.connect("planner:1")
    hello = conn.updates.get_nowait()
    assert hello is not None
    planner.on_update(hello)
    await planner.check("e1", token)
    with pytest.raises(FailedPrecondition, match="token does not match"):
        await planner.check("e1", "not-" + token)
    with pytest.raises(FailedPrecondition, match="token does not match"):
        await planner.check("e2", token)
    # a new broker term: the old term's tokens mean nothing
    broker.new_term()
    assert conn.updates.get_nowait() is None  # that stream ends
    conn = broker.connect("planner:1")
    hello = conn.updates.get_nowait()
    assert hello is not None
    planner.on_update(hello)
    with pytest.raises(FailedPrecondition, match="token does not match"):
        await planner.check("e1", token)


async def test_a_revoked_token_is_refused_and_confirmed_after_its_plan() -> None:
    broker, planner = pair()
    conn = broker.connect("planner:1")
    hello = conn.updates.get_nowait()
    assert hello is not None
    planner.on_update(hello)
    token = broker.issue("e1")
    await planner.check("e1", token)
    planner.begin(token)  # its plan is queued

    revocation = asyncio.create_task(broker.revoke(token))
    update = await asyncio.wait_for(conn.updates.get(), 1)
    assert update is not None and list(update.revoked) == [token]
    planner.on_update(update)
    with pytest.raises(FailedPrecondition, match="no longer outstanding"):
        await planner.check("e1", token)
    await asyncio.sleep(0.05)
    assert not revocation.done()  # the plan is still in flight
    planner.end(token)
    confirmed = planner._confirms.get_nowait()
    broker.confirm(conn, [confirmed])
    assert await asyncio.wait_for(revocation, 1) is True


async def test_no_planner_with_the_key_means_nothing_to_wait_for() -> None:
    broker, _ = pair()
    assert await asyncio.wait_for(broker.revoke(broker.issue("e1")), 1) is True


async def test_a_token_of_another_term_reopens_a_stale_stream() -> None:
    """A new broker leader's token while the planner still holds the old
    leader's key (a stream to a leader cut off, not closed): the planner
    opens the stream again and checks with the key it then gets."""
    old, new = PlanFence(5.0), PlanFence(5.0)
    planner = TokenFence("broker:1", lambda: "planner:1", key_wait=1.0)
    hello = old.connect("planner:1").updates.get_nowait()
    assert hello is not None
    planner.on_update(hello)

    async def reach_the_new_leader() -> None:
        update = new.connect("planner:1").updates.get_nowait()
        assert update is not None
        planner.on_update(update)
        await asyncio.Event().wait()

    async def stale_stream() -> None:
        await asyncio.Event().wait()

    planner._run = reach_the_new_leader  # type: ignore[method-assign]
    planner._task = asyncio.create_task(stale_stream())
    await planner.check("e1", new.issue("e1"))
    with pytest.raises(FailedPrecondition, match="token does not match"):
        await planner.check("e1", old.issue("e1"))  # the old term's: refused, no new reopen
    await planner.stop()
