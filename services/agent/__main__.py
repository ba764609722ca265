"""`python -m services.agent` — a client node: runs allocations with the
exec and mock drivers by default (raw_exec only when `--drivers` names it,
as Nomad ships it off), registers and checks their services, and serves
their logs, files, resource usage, check results and commands run in them
(alloc exec).

    python -m services.agent --state-addr HOST:PORT [--data-dir DIR]
        [--datacenter dc1] [--node-class C] [--meta k=v ...] [--drivers exec,raw_exec,mock]
"""

from __future__ import annotations

import logging
import sys

from corral.domain.errors import Unavailable
from corral.runtime import runner
from corral.runtime.server import GrpcServer
from corral.security import transport
from corral.security.acl_resolve import RemoteResolver
from corral.security.private_files import private_dir
from corral.v1 import alloc_pb2, alloc_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.agent.client import Agent
from services.agent.config import AgentSettings
from services.agent.handlers import (
    ClientAllocServicer,
    ClientFSServicer,
    ClientNodeServicer,
    ClientStatsServicer,
)
from services.agent.runner import AllocRunner

log = logging.getLogger("services.agent")


class AgentProcess:
    """The agent and the ClientAlloc (logs, stats, exec), ClientFS and
    ClientStats server beside it."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        # the agent receives log and stats requests only, and resolves their
        # tokens through the state
        self.acl_channel = transport.dial(settings.state_addr)
        # one token cache for the agent's RPCs and its tasks' Task API
        self.resolver = RemoteResolver(self.acl_channel)
        self.server = GrpcServer(
            settings.listen,
            name="agent",
            settings=settings.security,
            resolver=self.resolver,
            max_receive_bytes=4 * 1024 * 1024,
        )
        self.agent: Agent | None = None

    async def start(self) -> runner.Ready:
        # the node's secret and the allocs' files: the agent's alone
        data_dir = private_dir(self.settings.data_dir)
        self.server.add(
            alloc_pb2_grpc.add_ClientAllocServicer_to_server,
            ClientAllocServicer(
                data_dir,
                self.server.shutting_down,
                self._alloc,
                exec_disabled=self.settings.disable_remote_exec,
                collect=self._collect,
            ),
            alloc_pb2.DESCRIPTOR.services_by_name["ClientAlloc"].full_name,
        )
        self.server.add(
            alloc_pb2_grpc.add_ClientFSServicer_to_server,
            ClientFSServicer(data_dir, self.server.shutting_down, self._alloc),
            alloc_pb2.DESCRIPTOR.services_by_name["ClientFS"].full_name,
        )
        self.server.add(
            node_pb2_grpc.add_ClientStatsServicer_to_server,
            ClientStatsServicer(self._host_stats),
            node_pb2.DESCRIPTOR.services_by_name["ClientStats"].full_name,
        )
        self.server.add(
            node_pb2_grpc.add_ClientNodeServicer_to_server,
            ClientNodeServicer(lambda: self.agent),
            node_pb2.DESCRIPTOR.services_by_name["ClientNode"].full_name,
        )
        await self.server.start()
        address = self.settings.advertise or self.server.bound_address
        self.agent = Agent(self.settings, http_addr=address, resolver=self.resolver)
        await self.agent.start()
        log.info("client agent ready: node %s", self.agent.node.id)
        # not a cluster member: members are the servers (Nomad's `server
        # members`); the node list is the agents' registry
        return runner.Ready(address, info={"node_id": self.agent.node.id})

    def _alloc(self, alloc_id: str) -> AllocRunner | None:
        return self.agent.runners.get(alloc_id) if self.agent is not None else None

    async def _collect(self, alloc_id: str) -> None:
        if self.agent is None:
            raise Unavailable("the agent is still starting")
        await self.agent.collect(alloc_id)

    def _host_stats(self) -> tuple[str, pb.HostStats]:
        if self.agent is None:
            raise Unavailable("the agent is still starting")
        host = self.agent.host_stats
        return self.agent.node.id, host.latest or host.sample()

    async def stop(self) -> None:
        if self.agent is not None:
            await self.agent.stop()
        await self.server.stop(grace=2.0)
        await self.acl_channel.close()


def main(argv: list[str] | None = None) -> int:
    return runner.main(AgentSettings, AgentProcess, doc=__doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
