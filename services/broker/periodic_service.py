"""The broker's `Periodic` servicer: Force on the leader, where the
dispatcher runs (the state service relays users' calls here)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from corral.errors import InvalidArgument, NotLeader
from corral.server import GrpcServer
from corral.v1 import periodic_pb2, periodic_pb2_grpc
from services.broker.periodic import PeriodicDispatcher
from services.broker.service import ROLE

Context = Any


class PeriodicServicer(periodic_pb2_grpc.PeriodicServicer):
    def __init__(
        self,
        dispatcher: PeriodicDispatcher,
        is_leader: Callable[[], bool],
        leader_address: Callable[[], Awaitable[str]],
    ) -> None:
        self.dispatcher = dispatcher
        self.is_leader = is_leader
        self.leader_address = leader_address

    async def Force(
        self, request: periodic_pb2.PeriodicForceRequest, context: Context
    ) -> periodic_pb2.PeriodicForceResponse:
        if not request.job_id:
            raise InvalidArgument("job_id", "is required")
        if not self.is_leader() or not self.dispatcher.enabled:
            raise NotLeader(ROLE, await self.leader_address())
        launched = await self.dispatcher.force(request.namespace, request.job_id)
        return periodic_pb2.PeriodicForceResponse(
            eval_id=launched.response.eval_id,
            eval_create_index=launched.response.eval_create_index,
            child_job_id=launched.child_id,
            index=launched.response.index,
        )


def register(
    server: GrpcServer,
    dispatcher: PeriodicDispatcher,
    is_leader: Callable[[], bool],
    leader_address: Callable[[], Awaitable[str]],
) -> None:
    server.add(
        periodic_pb2_grpc.add_PeriodicServicer_to_server,
        PeriodicServicer(dispatcher, is_leader, leader_address),
        periodic_pb2.DESCRIPTOR.services_by_name["Periodic"].full_name,
    )
