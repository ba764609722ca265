"""The public `Keyring` service (Nomad's Keyring endpoint): list and rotate
root keys, delete an inactive one, and publish the public keys and the
issuer that verify workload identities.

List needs `operator:read`, Rotate and Delete `operator:write` (Nomad's
keyring-read / keyring-rotate / keyring-delete, which its operator
shorthands grant the same way); ListPublic and GetConfig answer anyone,
as Nomad's JWKS and OIDC discovery do. No answer carries key material.
"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.domain.errors import InvalidArgument
from corral.runtime.server import GrpcServer
from corral.security import keyring as kr
from corral.v1 import keyring_pb2, keyring_pb2_grpc
from services.state import query
from services.state.app_context import StateContext
from services.state.keyring import TABLE
from services.state.writes import keyring as writes

Context = Any
TABLES = (TABLE,)
NS_PER_S = 1_000_000_000


class KeyringServicer(keyring_pb2_grpc.KeyringServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def List(
        self, request: keyring_pb2.KeyringListRequest, context: Context
    ) -> keyring_pb2.KeyringListResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        return keyring_pb2.KeyringListResponse(
            keys=await self.ctx.keyring.list_meta(), meta=query.meta(snap, TABLES)
        )

    async def Rotate(
        self, request: keyring_pb2.KeyringRotateRequest, context: Context
    ) -> keyring_pb2.KeyringRotateResponse:
        algorithm = request.algorithm or kr.ALGORITHM_AES256_GCM
        if algorithm not in kr.ALGORITHMS:
            raise InvalidArgument(
                "algorithm",
                f"unknown algorithm {algorithm!r} (expected {', '.join(kr.ALGORITHMS)})",
            )
        if request.publish_time < 0:
            raise InvalidArgument("publish_time", "must not be negative")
        kek = self.ctx.keyring.kek
        # the RSA key is made before the write: not under the index lock
        material = await asyncio.to_thread(writes.new_material)
        async with self.ctx.write() as tx:
            meta = await writes.rotate(
                tx, material, kek, full=request.full, publish_time=request.publish_time
            )
        self.ctx.keyring.remember(material)
        self.ctx.keyring.written(tx)
        return keyring_pb2.KeyringRotateResponse(key=meta, index=tx.index)

    async def Delete(
        self, request: keyring_pb2.KeyringDeleteRequest, context: Context
    ) -> keyring_pb2.KeyringWriteResponse:
        self.ctx.keyring.require()
        if len(request.key_id) > 64:
            raise InvalidArgument("key_id", "is longer than 64 characters")
        async with self.ctx.write() as tx:
            await writes.delete(tx, request.key_id, force=request.force)
        self.ctx.keyring.written(tx)
        return keyring_pb2.KeyringWriteResponse(index=tx.index)

    async def ListPublic(
        self, request: keyring_pb2.KeyringListPublicRequest, context: Context
    ) -> keyring_pb2.KeyringListPublicResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        return keyring_pb2.KeyringListPublicResponse(
            keys=await self.ctx.keyring.list_public(),
            rotation_threshold=int(self.ctx.keyring.settings.rotation_threshold * NS_PER_S),
            meta=query.meta(snap, TABLES),
        )

    async def GetConfig(
        self, request: keyring_pb2.KeyringGetConfigRequest, context: Context
    ) -> keyring_pb2.KeyringGetConfigResponse:
        return keyring_pb2.KeyringGetConfigResponse(issuer=self.ctx.keyring.issuer)


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        keyring_pb2_grpc.add_KeyringServicer_to_server,
        KeyringServicer(ctx),
        keyring_pb2.DESCRIPTOR.services_by_name["Keyring"].full_name,
    )
