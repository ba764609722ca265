"""The `Federation` service (proto/corral/v1/federation.proto): the known
regions, the links' health and the state servers of every region, joining
and forgetting regions, and the calls between the state servers of two
regions (the link probe and ACL replication). The work is in
services/state/federation/."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from corral.domain.errors import FailedPrecondition
from corral.runtime.server import GrpcServer
from corral.v1 import federation_pb2, federation_pb2_grpc, state_pb2
from services.state import acl as acl_reads
from services.state.app_context import StateContext
from services.state.federation import replication
from services.state.federation.links import Federation
from services.state.handlers.acl import table_index_after

Context = Any


class FederationServicer(federation_pb2_grpc.FederationServicer):
    def __init__(self, ctx: StateContext, federation: Federation, is_leader: Callable[[], bool]):
        self.ctx = ctx
        self.federation = federation
        self.is_leader = is_leader

    async def Regions(
        self, request: federation_pb2.RegionsRequest, context: Context
    ) -> federation_pb2.RegionsResponse:
        return federation_pb2.RegionsResponse(regions=self.federation.regions())

    async def _replication(self) -> federation_pb2.ReplicationStatus:
        """The ACL replication status of this region's state leader (this
        process's own when it leads, else from the leader's member record)."""
        if self.is_leader():
            return self.federation.replication
        for payload, _ in await self.ctx.db.members(role="state"):
            m = state_pb2.Member.FromString(payload)
            if m.leader and replication.TAG in m.tags:
                found = replication.status_from_tag(m.tags[replication.TAG])
                if found is not None:
                    return found
        out = federation_pb2.ReplicationStatus()
        out.CopyFrom(self.federation.replication)
        return out

    async def Status(
        self, request: federation_pb2.FederationStatusRequest, context: Context
    ) -> federation_pb2.FederationStatus:
        return await self.federation.status(await self._replication())

    async def Join(
        self, request: federation_pb2.FederationJoinRequest, context: Context
    ) -> federation_pb2.FederationJoinResponse:
        return await self.federation.join(list(request.addresses))

    async def ForceLeave(
        self, request: federation_pb2.FederationForceLeaveRequest, context: Context
    ) -> federation_pb2.FederationForceLeaveResponse:
        await self.federation.force_leave(request.region)
        return federation_pb2.FederationForceLeaveResponse()

    async def Hello(
        self, request: federation_pb2.FederationHello, context: Context
    ) -> federation_pb2.FederationHello:
        return await self.federation.greet(request, context)

    def _authoritative(self) -> None:
        fed = self.federation
        if not fed.authoritative:
            raise FailedPrecondition(
                f"region {fed.region!r} is not the authoritative region (it follows "
                f"{fed.authoritative_region!r}): replicate from that one"
            )

    def _replication_index(self, table: str) -> Callable[[], Awaitable[int]]:
        """The index replication blocks on: one more than the table's own,
        0 meaning never written (a table first written at index 1 must move
        the index past the answer its empty state gave)."""

        async def read() -> int:
            return await acl_reads.table_index(self.ctx.db, (table,), floor=0) + 1

        return read

    async def ReplicatePolicies(
        self, request: federation_pb2.ReplicationRequest, context: Context
    ) -> federation_pb2.ReplicatedPolicies:
        self._authoritative()
        table = acl_reads.POLICIES_TABLE
        index = await table_index_after(
            self.ctx, request.query, table, self._replication_index(table)
        )
        policies = await acl_reads.list_policies(self.ctx.db, with_rules=True)
        return federation_pb2.ReplicatedPolicies(policies=policies, index=index)

    async def ReplicateTokens(
        self, request: federation_pb2.ReplicationRequest, context: Context
    ) -> federation_pb2.ReplicatedTokens:
        self._authoritative()
        table = acl_reads.TOKENS_TABLE
        index = await table_index_after(
            self.ctx, request.query, table, self._replication_index(table)
        )
        tokens = await replication.global_tokens(self.ctx.db)
        return federation_pb2.ReplicatedTokens(tokens=tokens, index=index)

    async def ReplicateRoles(
        self, request: federation_pb2.ReplicationRequest, context: Context
    ) -> federation_pb2.ReplicatedRoles:
        self._authoritative()
        table = acl_reads.ROLES_TABLE
        index = await table_index_after(
            self.ctx, request.query, table, self._replication_index(table)
        )
        roles = await acl_reads.list_roles(self.ctx.db)
        return federation_pb2.ReplicatedRoles(roles=roles, index=index)


def register(
    server: GrpcServer, ctx: StateContext, federation: Federation, is_leader: Callable[[], bool]
) -> None:
    server.add(
        federation_pb2_grpc.add_FederationServicer_to_server,
        FederationServicer(ctx, federation, is_leader),
        federation_pb2.DESCRIPTOR.services_by_name["Federation"].full_name,
    )
