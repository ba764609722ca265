"""The public `Operator` service: scheduler configuration, members and
operator snapshots (services/state/backup.py)."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from corral.domain import snapshot_archive
from corral.domain.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from corral.domain.structs import SchedulerAlgorithm
from corral.runtime.server import GrpcServer
from corral.security.access import requested_region
from corral.v1 import operator_pb2, operator_pb2_grpc, state_pb2
from corral.v1 import structs_pb2 as pb
from services.state import backup, query, validate
from services.state.app_context import StateContext

Context = Any
TABLES = ("scheduler_config",)
#: bytes of the archive per SnapshotSave message
SNAPSHOT_CHUNK = 1 << 20
log = logging.getLogger(__name__)


def default_config() -> pb.SchedulerConfiguration:
    """Nomad's defaults: binpack, preemption on for system jobs only."""
    return pb.SchedulerConfiguration(
        scheduler_algorithm=SchedulerAlgorithm.BINPACK,
        preemption_config=pb.PreemptionConfig(system_scheduler_enabled=True),
    )


class OperatorServicer(operator_pb2_grpc.OperatorServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def SchedulerGetConfiguration(
        self, request: operator_pb2.SchedulerGetConfigurationRequest, context: Context
    ) -> operator_pb2.SchedulerConfigurationResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        cfg = snap.scheduler_config
        return operator_pb2.SchedulerConfigurationResponse(
            config=cfg if cfg.modify_index else default_config(),
            index=query.table_index(snap, TABLES),
        )

    async def SchedulerSetConfiguration(
        self, request: operator_pb2.SchedulerSetConfigurationRequest, context: Context
    ) -> operator_pb2.SchedulerConfigurationResponse:
        cfg = pb.SchedulerConfiguration()
        cfg.CopyFrom(request.config)
        cfg.scheduler_algorithm = cfg.scheduler_algorithm or SchedulerAlgorithm.BINPACK
        validate.one_of(
            cfg.scheduler_algorithm,
            (SchedulerAlgorithm.BINPACK, SchedulerAlgorithm.SPREAD),
            "config.scheduler_algorithm",
        )
        async with self.ctx.write() as tx:
            current = await tx.get_scheduler_config()
            if request.cas and current.modify_index != request.config.modify_index:
                return operator_pb2.SchedulerConfigurationResponse(
                    config=current if current.modify_index else default_config(), updated=False
                )
            cfg.create_index = current.create_index
            tx.put_scheduler_config(cfg)
        return operator_pb2.SchedulerConfigurationResponse(config=cfg, updated=True, index=tx.index)

    async def Members(
        self, request: operator_pb2.MembersRequest, context: Context
    ) -> operator_pb2.MembersResponse:
        rows = await self.ctx.db.members(role=request.role)
        return operator_pb2.MembersResponse(
            members=[state_pb2.Member.FromString(p) for p, _ in rows]
        )

    async def SnapshotSave(
        self, request: operator_pb2.SnapshotSaveRequest, context: Context
    ) -> AsyncIterator[operator_pb2.SnapshotSaveResponse]:
        """The archive is built in a private temporary directory first (its
        size and checksum lead the stream, as Nomad's Digest header does),
        then streamed in chunks; the directory goes when the call ends."""
        with tempfile.TemporaryDirectory(prefix="corral-snapshot-") as tmp:
            work = Path(tmp)
            meta = await backup.save(self.ctx.db, self.ctx.keyring, self.ctx.region, work)
            path = work / "snapshot.tar.gz"
            yield operator_pb2.SnapshotSaveResponse(
                index=meta.index,
                size=path.stat().st_size,
                sha256=await asyncio.to_thread(snapshot_archive.sha256_file, path),
            )
            for chunk in snapshot_archive.chunks(path, SNAPSHOT_CHUNK):
                yield operator_pb2.SnapshotSaveResponse(data=chunk)
        log.info("operator snapshot saved at index %d", meta.index, extra={"index": meta.index})

    async def SnapshotRestore(
        self, requests: AsyncIterator[operator_pb2.SnapshotRestoreRequest], context: Context
    ) -> AsyncIterator[operator_pb2.SnapshotRestoreResponse]:
        region = requested_region(context)
        if region and region != self.ctx.region:
            # a bidirectional stream is not forwarded: refuse, never restore here
            raise FailedPrecondition(
                f"a snapshot restore is not forwarded to other regions: send it to a "
                f"state server of region {region!r}"
            )
        limit = self.ctx.snapshot_max_bytes
        with tempfile.TemporaryDirectory(prefix="corral-restore-") as tmp:
            work = Path(tmp)
            path = work / "upload.tar.gz"
            total = 0
            with path.open("wb") as f:
                async for req in requests:
                    total += len(req.data)
                    if total > limit:
                        raise ResourceExhausted(
                            f"the snapshot is larger than {limit} bytes, the most this state "
                            "accepts (--snapshot-max-bytes); nothing was changed"
                        )
                    f.write(req.data)
            if total == 0:
                raise InvalidArgument("snapshot", "is empty")
            index, meta = await backup.restore(self.ctx.db, self.ctx.keyring, path, work, limit)
        log.warning(
            "state replaced by an operator snapshot taken at index %d in region %s; "
            "now at index %d",
            meta.index,
            meta.region,
            index,
            extra={"index": index},
        )
        await self.ctx.feed.wait_visible(index)
        yield operator_pb2.SnapshotRestoreResponse(index=index, snapshot_index=meta.index)


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        operator_pb2_grpc.add_OperatorServicer_to_server,
        OperatorServicer(ctx),
        operator_pb2.DESCRIPTOR.services_by_name["Operator"].full_name,
    )
