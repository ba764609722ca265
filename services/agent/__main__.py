"""`python -m services.agent` — a client node: runs allocations with the
drivers `--drivers` enables (mock by default; raw_exec only when named, as
Nomad ships it off) and serves their logs.

    python -m services.agent --state-addr HOST:PORT [--data-dir DIR]
        [--datacenter dc1] [--node-class C] [--meta k=v ...] [--drivers raw_exec,mock]
"""

from __future__ import annotations

import logging
import sys

from corral.runtime import runner
from corral.runtime.server import GrpcServer
from corral.security import transport
from corral.security.acl_resolve import RemoteResolver
from corral.security.private_files import private_dir
from corral.v1 import alloc_pb2, alloc_pb2_grpc
from services.agent.client import Agent
from services.agent.config import AgentSettings
from services.agent.handlers import ClientAllocServicer

log = logging.getLogger("services.agent")


class AgentProcess:
    """The agent and the ClientAlloc (logs) server beside it."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        # the agent receives log requests only, and resolves their tokens
        # through the state
        self.acl_channel = transport.dial(settings.state_addr)
        self.server = GrpcServer(
            settings.listen,
            name="agent",
            settings=settings.security,
            resolver=RemoteResolver(self.acl_channel),
            max_receive_bytes=4 * 1024 * 1024,
        )
        self.agent: Agent | None = None

    async def start(self) -> runner.Ready:
        # the node's secret and the allocs' files: the agent's alone
        data_dir = private_dir(self.settings.data_dir)
        self.server.add(
            alloc_pb2_grpc.add_ClientAllocServicer_to_server,
            ClientAllocServicer(data_dir, self.server.shutting_down, self._alloc_namespace),
            alloc_pb2.DESCRIPTOR.services_by_name["ClientAlloc"].full_name,
        )
        await self.server.start()
        address = self.settings.advertise or self.server.bound_address
        self.agent = Agent(self.settings, http_addr=address)
        await self.agent.start()
        log.info("client agent ready: node %s", self.agent.node.id)
        # not a cluster member: members are the servers (Nomad's `server
        # members`); the node list is the agents' registry
        return runner.Ready(address, info={"node_id": self.agent.node.id})

    def _alloc_namespace(self, alloc_id: str) -> str | None:
        runner_ = self.agent.runners.get(alloc_id) if self.agent is not None else None
        return runner_.alloc.namespace if runner_ is not None else None

    async def stop(self) -> None:
        if self.agent is not None:
            await self.agent.stop()
        await self.server.stop(grace=2.0)
        await self.acl_channel.close()


def main(argv: list[str] | None = None) -> int:
    return runner.main(AgentSettings, AgentProcess, doc=__doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
