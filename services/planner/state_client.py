"""The planner's two calls to the state service: the group-commit write
(`State.ApplyPlans`) and the latest index (`State.GetIndex`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from corral.security import transport
from corral.v1 import state_pb2, state_pb2_grpc


class PlanWriter(Protocol):
    async def apply_plans(
        self, plans: Sequence[state_pb2.AppliedPlan], *, timeout: float
    ) -> list[int]: ...

    async def latest_index(self, *, timeout: float) -> int: ...


class StateClient:
    """PlanWriter over a gRPC channel to the state service.

    `leader_id` is the planner leader's advertised address, sent for
    fencing: the state refuses a plan write unless that address holds the
    planner's leader lock (an empty one is always refused), so it is set
    when this process is elected."""

    def __init__(self, state_addr: str, *, leader_id: str = "") -> None:
        self.leader_id = leader_id
        self._channel = transport.dial(
            state_addr,
            options=[
                ("grpc.max_send_message_length", transport.MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = state_pb2_grpc.StateStub(self._channel)

    async def apply_plans(
        self, plans: Sequence[state_pb2.AppliedPlan], *, timeout: float
    ) -> list[int]:
        resp: state_pb2.ApplyPlansResponse = await self._stub.ApplyPlans(
            state_pb2.ApplyPlansRequest(plans=plans, leader_id=self.leader_id), timeout=timeout
        )
        if len(resp.indexes) != len(plans):
            raise RuntimeError(
                f"ApplyPlans returned {len(resp.indexes)} indexes for {len(plans)} plans"
            )
        return list(resp.indexes)

    async def latest_index(self, *, timeout: float) -> int:
        resp: state_pb2.GetIndexResponse = await self._stub.GetIndex(
            state_pb2.GetIndexRequest(), timeout=timeout
        )
        return resp.index

    async def close(self) -> None:
        await self._channel.close()
