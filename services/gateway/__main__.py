"""`python -m services.gateway` — run an HTTP gateway process.

    python -m services.gateway --state-addr HOST:PORT [--listen 127.0.0.1:4647]
        [--broker-addr HOST:PORT] [--planner-addr HOST:PORT] [--ready-file F]

Serves Nomad's `/v1` HTTP API (docs/http-api.md) by calling the public gRPC
API of the state service at `--state-addr`, as a user: the ACL token of each
HTTP request goes with the calls it causes; the gateway holds no server
token. Stateless: run as many as needed behind a load balancer. With the TLS
files set (`--ca-file`, `--cert-file`, `--key-file`) it dials the cluster
over mutual TLS and serves HTTPS with the same certificates (or
`--http-cert-file`/`--http-key-file`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

from corral.runtime import runner
from services.gateway.app import create_app
from services.gateway.backend import Backend
from services.gateway.config import GatewaySettings

log = logging.getLogger("services.gateway")

#: the largest WebSocket message the gateway takes (alloc exec input)
WS_MAX_BYTES = 1024 * 1024


class GatewayProcess(runner.HttpRole):
    def __init__(self, settings: GatewaySettings) -> None:
        super().__init__(settings)
        self.gateway = settings
        self.backend: Backend | None = None
        self.app: Any = None
        self._probe: asyncio.Task[None] | None = None

    def open(self) -> Any:
        s = self.gateway
        self.backend = Backend(
            s.state_addr,
            broker_addr=s.broker_addr,
            planner_addr=s.planner_addr,
            security_settings=s.security,
        )
        self.app = create_app(s, self.backend)
        return self.app

    def server_options(self) -> dict[str, Any]:
        # alloc exec's WebSocket: the sans-I/O implementation (a dependency),
        # messages bounded (an exec's stdin comes in small pieces)
        return {"ws": "wsproto", "ws_max_size": WS_MAX_BYTES}

    async def on_started(self) -> None:
        self._probe = asyncio.create_task(self._first_contact(), name="state-probe")

    async def _first_contact(self) -> None:
        """Not a precondition (the gateway answers 503 while the state is
        away), but said once in the log."""
        assert self.backend is not None
        problem = await self.backend.healthy(timeout=10)
        if problem:
            log.warning("the gateway's state service does not answer yet: %s", problem)

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self.app is not None:  # the job file parsers' worker processes
            await asyncio.to_thread(self.app.state.jobfiles.close)
        if self.backend is not None:
            await self.backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    return runner.main(GatewaySettings, GatewayProcess, doc=__doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
