"""The `Worker` gRPC service: Nomad 1.2's scheduler worker API (list, pause,
resume, stop, read/change the pool config) plus the dry run behind
`Job.Plan`."""

from __future__ import annotations

from typing import Any

from corral.v1 import job_pb2, worker_pb2, worker_pb2_grpc
from services.worker.dry_run import plan_job
from services.worker.pool import WorkerPool

Context = Any


class WorkerAdminServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, pool: WorkerPool, process_id: str, address: str = "") -> None:
        self.pool = pool
        self.process_id = process_id
        self.address = address

    def _list(self) -> worker_pb2.WorkerListResponse:
        return worker_pb2.WorkerListResponse(
            process_id=self.process_id,
            address=self.address,
            workers=self.pool.info(),
            replica_index=self.pool.replica.index,
        )

    async def List(
        self, request: worker_pb2.WorkerListRequest, context: Context
    ) -> worker_pb2.WorkerListResponse:
        return self._list()

    async def Pause(
        self, request: worker_pb2.WorkerControlRequest, context: Context
    ) -> worker_pb2.WorkerListResponse:
        for w in self.pool.select(list(request.worker_ids)):
            w.pause()
        return self._list()

    async def Resume(
        self, request: worker_pb2.WorkerControlRequest, context: Context
    ) -> worker_pb2.WorkerListResponse:
        for w in self.pool.select(list(request.worker_ids)):
            w.resume()
        return self._list()

    async def Stop(
        self, request: worker_pb2.WorkerControlRequest, context: Context
    ) -> worker_pb2.WorkerListResponse:
        for w in self.pool.select(list(request.worker_ids)):
            w.stop()
        return self._list()

    async def GetConfig(
        self, request: worker_pb2.WorkerConfigRequest, context: Context
    ) -> worker_pb2.WorkerPoolConfig:
        return self.pool.config()

    async def SetConfig(
        self, request: worker_pb2.WorkerPoolConfig, context: Context
    ) -> worker_pb2.WorkerPoolConfig:
        return await self.pool.set_config(request.num_schedulers, list(request.enabled_schedulers))

    async def PlanJob(
        self, request: job_pb2.JobPlanRequest, context: Context
    ) -> job_pb2.JobPlanResponse:
        return await plan_job(self.pool.replica.snapshot(), request, self.pool.executor)
