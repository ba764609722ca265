"""`python -m services.worker` — a worker process: a pool of scheduler loops
sharing one replica, plus the `Worker` admin API.

    python -m services.worker --state-addr ADDR --broker-addr ADDR[,ADDR]
        --planner-addr ADDR[,ADDR] [--num-schedulers N] [--schedulers service,batch,...]
"""

from __future__ import annotations

import logging
import sys

from corral.runtime import runner
from corral.runtime.replica import Replica
from corral.runtime.server import GrpcServer
from corral.security import transport
from corral.security.acl_resolve import RemoteResolver
from corral.v1 import eval_pb2_grpc, plan_pb2_grpc, state_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.worker.clients import LeaderClient
from services.worker.config import WorkerSettings
from services.worker.handlers import WorkerAdminServicer
from services.worker.pool import WorkerPool
from services.worker.scheduler import limits

log = logging.getLogger("services.worker")


class WorkerProcess:
    """The pool, its replica and clients, and the admin API."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        limits.configure(settings.max_placements_per_eval)
        self.replica = Replica(settings.state_addr, name="worker")
        self.broker = LeaderClient(settings.broker_addrs, eval_pb2_grpc.EvalStub)
        self.planner = LeaderClient(settings.planner_addrs, plan_pb2_grpc.PlanStub)
        self.state_channel = transport.dial(settings.state_addr)
        self.pool = WorkerPool(
            settings,
            self.replica,
            self.broker,
            self.planner,
            state_pb2_grpc.StateStub(self.state_channel),
        )
        # the worker receives admin calls and dry runs of one job
        self.server = GrpcServer(
            settings.listen,
            name="worker",
            settings=settings.security,
            resolver=RemoteResolver(self.state_channel),
            max_receive_bytes=32 * 1024 * 1024,
        )

    async def start(self) -> runner.Ready:
        await self.replica.start()
        member = runner.member("worker", "")
        admin = WorkerAdminServicer(self.pool, member.id)
        self.server.add(
            worker_pb2_grpc.add_WorkerServicer_to_server,
            admin,
            worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name,
        )
        await self.server.start()
        member.address = admin.address = self.settings.advertise or self.server.bound_address
        await self.pool.start()
        log.info("worker ready with %d scheduler loops", self.settings.num_schedulers)
        return runner.Ready(member.address, member, self.settings.state_addr)

    async def stop(self) -> None:
        await self.pool.stop()
        await self.server.stop(grace=5.0)
        await self.replica.stop()
        await self.broker.close()
        await self.planner.close()
        await self.state_channel.close()


def main(argv: list[str] | None = None) -> int:
    return runner.main(WorkerSettings, WorkerProcess, doc=__doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
