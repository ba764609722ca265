"""The broker's half of the planner's eval token check (issue 30).

Nomad's `Plan.Submit` asks the broker, in the same process, whether the
plan's eval is outstanding with its token (`PauseNackTimeout`) and restarts
the nack timer after the plan (`ResumeNackTimeout`): a plan from a worker
that no longer holds its eval is refused, and an eval is not redelivered
while its plan may still commit. Here broker and planner are two processes,
and those were two calls per plan. Instead:

* every token is signed with this term's key (corral/security/eval_token.py),
  which the planner leader receives when it opens `Eval.PlanFence`, so it
  checks a token on its own;
* before the broker itself gives up on a delivery (the worker's lease
  lapsed, the nack timer fired) it revokes the token: every connected
  planner refuses it from then on and confirms once no plan of it is queued
  or being applied; only then is the eval nacked and redelivered.

A revocation waits for the planners connected when it is made (one that
disconnects is waited for when it comes back: it refuses every plan
meanwhile, having dropped the key), at most `wait_limit` seconds (the nack
timeout, the same backstop as a pause never resumed). When no planner has
received this term's key, no plan of its tokens can exist: the revocation
is immediate. A worker's own nack needs none: its plan call has returned.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from corral.security import eval_token
from corral.v1 import eval_pb2

log = logging.getLogger(__name__)


@dataclass(eq=False)
class FencedPlanner:
    """One connected planner: what is to be sent to it (None ends the stream)."""

    address: str
    updates: asyncio.Queue[eval_pb2.PlanFenceUpdate | None] = field(default_factory=asyncio.Queue)


@dataclass
class _Revocation:
    waiting: set[FencedPlanner]
    done: asyncio.Future[None]


class PlanFence:
    def __init__(self, wait_limit: float) -> None:
        self.wait_limit = wait_limit
        self.term, self.key = eval_token.new_key()
        self._planners: set[FencedPlanner] = set()
        self._revoking: dict[str, _Revocation] = {}
        #: a planner received this term's key (so may hold plans of its tokens)
        self._key_given = False

    def new_term(self) -> None:
        """A new key (leadership gained or lost): tokens of the old one are
        refused by the planner, every stream ends (the planners reconnect
        and get the new key) and pending revocations end."""
        self.term, self.key = eval_token.new_key()
        self._key_given = False
        for planner in self._planners:
            planner.updates.put_nowait(None)
        self._planners.clear()
        for rev in self._revoking.values():
            if not rev.done.done():
                rev.done.set_result(None)
        self._revoking.clear()

    def issue(self, eval_id: str) -> str:
        """The token of a new delivery of `eval_id`."""
        return eval_token.sign(self.key, self.term, eval_id)

    async def revoke(self, token: str) -> bool:
        """Return once no planner will commit a plan of `token`: True when
        confirmed (or no planner had the key), False after `wait_limit`."""
        if not self._key_given:
            return True
        rev = _Revocation(set(self._planners), asyncio.get_running_loop().create_future())
        self._revoking[token] = rev
        for planner in rev.waiting:
            planner.updates.put_nowait(eval_pb2.PlanFenceUpdate(revoked=[token]))
        try:
            await asyncio.wait_for(asyncio.shield(rev.done), self.wait_limit)
            return True
        except TimeoutError:
            log.warning(
                "no planner confirmed the revoked token of a delivery within %.0fs; "
                "redelivering anyway",
                self.wait_limit,
            )
            return False
        finally:
            if self._revoking.get(token) is rev:
                del self._revoking[token]

    def connect(self, address: str) -> FencedPlanner:
        """A planner opened the stream: it gets the key and every revocation
        still waiting, which now waits for it too."""
        planner = FencedPlanner(address)
        self._planners.add(planner)
        self._key_given = True
        planner.updates.put_nowait(
            eval_pb2.PlanFenceUpdate(term=self.term, key=self.key, revoked=list(self._revoking))
        )
        for rev in self._revoking.values():
            rev.waiting.add(planner)
        return planner

    def confirm(self, planner: FencedPlanner, tokens: list[str]) -> None:
        for token in tokens:
            rev = self._revoking.get(token)
            if rev is None:
                continue
            rev.waiting.discard(planner)
            if not rev.waiting and not rev.done.done():
                rev.done.set_result(None)

    def disconnect(self, planner: FencedPlanner) -> None:
        """The stream ended. Revocations it owed stay waiting for the next
        planner to connect (or their time limit): a planner holding plans
        while cut off from the broker still applies them."""
        self._planners.discard(planner)
        for rev in self._revoking.values():
            rev.waiting.discard(planner)

    @property
    def planners(self) -> int:
        return len(self._planners)
