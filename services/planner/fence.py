"""The planner's eval token check, without a call to the broker per plan.

Nomad's `Plan.Submit` pauses the eval's nack timer at the broker (the token
check) and resumes it after the plan. Here the planner leader keeps one
stream open to the broker leader, `Eval.PlanFence`
(services/broker/plan_fence.py): the broker sends the key its tokens are
signed with, so a token is checked here (corral/security/eval_token.py),
and the tokens it revokes before it redelivers an eval on its own (the
worker's lease lapsed, the nack timer fired). A revoked token is refused
from then on and confirmed to the broker once no plan of it is queued or
being applied; only then does the broker redeliver the eval.

Without the stream (not yet opened, broken, a new broker leader) there is
no key: plans wait for it up to `key_wait` seconds and are then refused as
UNAVAILABLE (the worker retries), so a planner cut off from the broker
takes no new plan the broker could not revoke. A token of a term the
planner has no key for may come from a new broker leader whose old one has
not closed the stream (cut off, not dead): the planner then opens the
stream again (at most once per `key_wait`) and checks with the key it gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

import grpc

from corral.domain.errors import FailedPrecondition, Unavailable, leader_from_error
from corral.security import eval_token, transport
from corral.v1 import eval_pb2, eval_pb2_grpc

log = logging.getLogger(__name__)

#: revoked tokens remembered (the oldest forgotten first): a revocation only
#: matters to a worker that lost its eval moments ago
MAX_REVOKED = 65_536


class TokenFence:
    def __init__(
        self,
        addresses: str,
        me: Callable[[], str],
        *,
        key_wait: float = 5.0,
        retry: float = 0.5,
    ) -> None:
        self._addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not self._addresses:
            raise ValueError("no broker address")
        self._me = me
        self.key_wait = key_wait
        self.retry = retry
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._term = ""
        self._key = b""
        self._keyed = asyncio.Event()
        self._revoked: OrderedDict[str, None] = OrderedDict()
        self._in_flight: dict[str, int] = {}
        self._confirms: asyncio.Queue[str] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._reopened = 0.0  # monotonic time of the last reopen for an unknown term

    # ------------------------------------------------------------ the check

    async def check(self, eval_id: str, token: str) -> None:
        """FailedPrecondition unless `token` is a live token of `eval_id`
        from the current broker leader; Unavailable without its key."""
        if self._keyed.is_set() and eval_token.term_of(token) not in ("", self._term):
            self._reopen()
        if not self._keyed.is_set():
            try:
                await asyncio.wait_for(self._keyed.wait(), self.key_wait)
            except TimeoutError:
                raise Unavailable(
                    "the eval broker leader's token key is not known yet (no plan fence)"
                ) from None
        if not eval_token.verify(self._key, self._term, eval_id, token):
            raise FailedPrecondition(f"token does not match for evaluation {eval_id}")
        if token in self._revoked:
            raise FailedPrecondition(
                f"evaluation {eval_id} is no longer outstanding with this token "
                "(its worker's lease lapsed or its nack timer expired)"
            )

    def begin(self, token: str) -> None:
        """A plan of `token` is queued (until `end`)."""
        self._in_flight[token] = self._in_flight.get(token, 0) + 1

    def end(self, token: str) -> None:
        left = self._in_flight.get(token, 0) - 1
        if left > 0:
            self._in_flight[token] = left
            return
        self._in_flight.pop(token, None)
        if token in self._revoked:
            self._confirms.put_nowait(token)

    def on_update(self, update: eval_pb2.PlanFenceUpdate) -> None:
        if update.term:
            if update.term != self._term:
                self._revoked.clear()  # another term's tokens fail the check anyway
            self._term, self._key = update.term, update.key
            self._keyed.set()
        for token in update.revoked:
            self._revoked[token] = None
            self._revoked.move_to_end(token)
            if token not in self._in_flight:
                self._confirms.put_nowait(token)
        while len(self._revoked) > MAX_REVOKED:
            self._revoked.popitem(last=False)

    def _reopen(self) -> None:
        """A token of another term: our stream may be to a broker leader that
        is gone without closing it. Open it again (once per `key_wait`)."""
        now = time.monotonic()
        if self._task is None or now - self._reopened < self.key_wait:
            return
        self._reopened = now
        log.info("a plan's token names another broker term: opening the plan fence again")
        self._task.cancel()
        self._drop_key()
        self._task = asyncio.create_task(self._run(), name="plan-fence")

    def _drop_key(self) -> None:
        self._keyed.clear()
        self._key, self._term = b"", ""

    # ------------------------------------------------------------ the stream

    def start(self) -> None:
        """Keep the stream open to the broker leader (planner leader only)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="plan-fence")

    async def stop(self) -> None:
        self._drop_key()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _run(self) -> None:
        """Follow the broker leader: a standby names it; any other failure
        tries the next configured address after a short pause."""
        turn = 0
        current = self._addresses[0]
        while True:
            try:
                await self._follow(current)
                log.info("the broker at %s ended the plan fence", current)
            except grpc.aio.AioRpcError as exc:
                leader = leader_from_error(exc)
                if leader and leader != current:
                    self._drop_key()
                    current = leader
                    continue
                log.info("plan fence to %s: %s: %s", current, exc.code().name, exc.details())
                turn += 1
                current = self._addresses[turn % len(self._addresses)]
            finally:
                if asyncio.current_task() is self._task:  # not a stream replaced
                    self._drop_key()
            await asyncio.sleep(self.retry)

    async def _follow(self, address: str) -> None:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = transport.dial(address)
        stub = eval_pb2_grpc.EvalStub(channel)
        # confirmations not sent on a broken stream are owed again: the
        # broker's first message re-sends every revocation still waiting
        self._confirms = asyncio.Queue()

        async def requests() -> AsyncIterator[eval_pb2.PlanFenceConfirm]:
            yield eval_pb2.PlanFenceConfirm(planner=self._me())
            while True:
                tokens = [await self._confirms.get()]
                while not self._confirms.empty():
                    tokens.append(self._confirms.get_nowait())
                yield eval_pb2.PlanFenceConfirm(tokens=tokens)

        call = stub.PlanFence(requests())
        try:
            async for update in call:
                self.on_update(update)
        finally:
            call.cancel()

    async def close(self) -> None:
        await self.stop()
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
