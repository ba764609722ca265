"""`python -m services.planner` — run a plan applier process.

    python -m services.planner --dsn DSN --state-addr HOST:PORT --broker-addr HOST:PORT
        [--listen 127.0.0.1:0] [--ready-file F] [--metrics-listen HOST:PORT]
        [--pipeline-depth 1] [--max-batch 64]

Every planner process keeps a replica of the state warm and serves `Plan`;
one of them wins the advisory-lock election and runs the plan queue and the
applier, the others answer UNAVAILABLE with the leader's address. Losing
leadership flushes the queue ("plan queue flushed").

Test-only fault injection: `CORRAL_PLANNER_FAULT=exit-before-apply` makes the
process exit (status 75) after it has evaluated a batch and before it
writes it, to show that a crash there commits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from corral.runtime import runner
from corral.v1 import plan_pb2, plan_pb2_grpc
from services.planner.applier import PlanApplier
from services.planner.config import PlannerProcessSettings
from services.planner.fence import TokenFence
from services.planner.handlers import PlanServicer
from services.planner.plan_queue import PlanQueue
from services.planner.state_client import StateClient

log = logging.getLogger("services.planner")


class PlannerProcess(runner.LeaderRole):
    def __init__(self, settings: PlannerProcessSettings) -> None:
        super().__init__(settings)
        self.queue = PlanQueue()
        self.state = StateClient(settings.state_addr)
        self.tokens = TokenFence(settings.broker_addr, lambda: self.address)
        self.applier = PlanApplier(self.queue, self.replica, self.state, settings.planner)
        self._term: asyncio.Task[None] | None = None

    def add_services(self) -> None:
        servicer = PlanServicer(
            self.queue,
            self.tokens,
            is_leader=self.is_leader,
            leader_address=self.leader_address,
            stats=lambda: self.applier.stats,
        )
        self.server.add(
            plan_pb2_grpc.add_PlanServicer_to_server,
            servicer,
            plan_pb2.DESCRIPTOR.services_by_name["Plan"].full_name,
        )

    async def on_elected(self) -> None:
        # Fencing: the state refuses a plan write unless this address holds
        # the planner's leader lock at commit (a deposed leader cannot write).
        self.state.leader_id = self.address
        log.info("planner elected leader; plan queue enabled")
        self.tokens.start()
        self.queue.set_enabled(True)
        if self._term is None or self._term.done():
            self._term = asyncio.create_task(self.applier.run(), name="plan-applier")

    async def on_lost(self) -> None:
        log.warning("planner lost leadership; plan queue flushed")
        self.queue.set_enabled(False)
        await self.tokens.stop()
        if self._term is not None:
            self._term.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._term

    async def close(self) -> None:
        await self.state.close()
        await self.tokens.close()


def main(argv: list[str] | None = None) -> int:
    return runner.main(PlannerProcessSettings, PlannerProcess, doc=__doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
