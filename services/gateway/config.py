"""Gateway settings and their defaults (docs/http-api.md)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, SecretStr, model_validator

from corral.runtime.settings import HttpSettings, Option, StateAddr


class GatewaySettings(HttpSettings):
    """An HTTP gateway process: stateless, any number of them behind a load
    balancer; each one is only a client of the public gRPC API."""

    ROLE: ClassVar[str] = "gateway"

    listen: str = Field(
        "127.0.0.1:4647",
        description="HTTP listen host:port of Nomad's /v1 API and the UI (port 0: any free "
        "port); with the TLS files set it serves HTTPS with the same certificates",
    )
    state_addr: StateAddr
    broker_addr: Annotated[str, Option(env="CORRAL_BROKER_ADDR")] = Field(
        "",
        description="broker host:port[,host:port] for eval broker stats (empty: the "
        "registered members, from Operator.Members)",
    )
    planner_addr: Annotated[str, Option(env="CORRAL_PLANNER_ADDR")] = Field(
        "",
        description="planner host:port[,host:port] for plan queue stats (empty: the "
        "registered members, from Operator.Members)",
    )
    ui_trace_url: str = Field(
        "",
        description="the web UI links an eval's trace id here: a URL with {trace_id} in it, "
        "e.g. http://localhost:16686/trace/{trace_id} for Jaeger (empty: the id is shown only)",
    )

    @model_validator(mode="after")
    def _a_user_never_a_server(self) -> GatewaySettings:
        """The gateway calls the cluster as a user: no server token on any
        of its channels, even when the environment holds one."""
        if self.security.server_token.get_secret_value():
            self.security = self.security.model_copy(update={"server_token": SecretStr("")})
        return self
