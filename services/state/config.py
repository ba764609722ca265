"""The state service's settings (`python -m services.state`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, model_validator

from corral.runtime.settings import (
    ADDRESS,
    OPTIONAL_REGION_PATTERN,
    REGION_NAME,
    Dsn,
    Option,
    ServerSettings,
    SettingsGroup,
)


class HeartbeatSettings(SettingsGroup):
    """Node heartbeat TTLs (Nomad's heartbeat.go; docs/nodes.md) and the
    drainer's pace, used by the state leader."""

    ENV_PREFIX: ClassVar[str | None] = "CORRAL_HEARTBEAT_"
    FLAG_PREFIX: ClassVar[str | None] = "--heartbeat-"

    min_ttl: float = Field(10.0, gt=0, description="shortest node heartbeat TTL (s)")
    max_per_second: Annotated[
        float, Option(flag="--heartbeats-per-second", env="CORRAL_HEARTBEATS_PER_SECOND")
    ] = Field(
        50.0,
        gt=0,
        description="cluster heartbeat rate the TTL is sized for (it grows with the node count)",
    )
    grace: float = Field(
        10.0, ge=0, description="grace (s) after a missed TTL before a node is marked down"
    )
    failover_ttl: float = Field(
        300.0, gt=0, description="TTL (s) every live node gets after a leader change"
    )
    drain_interval: float = Field(
        1.0, gt=0, description="seconds between the drainer's passes over draining nodes"
    )


class ACLSettings(SettingsGroup):
    """Bounds on the lifetime of ACL tokens created with a TTL (Nomad's
    `acl.token_min_expiration_ttl` / `token_max_expiration_ttl`), and when
    expired ones are deleted."""

    ENV_PREFIX: ClassVar[str | None] = "CORRAL_ACL_"
    FLAG_PREFIX: ClassVar[str | None] = "--acl-"

    token_min_expiration_ttl: float = Field(
        60.0, gt=0, description="shortest TTL (s) a token may be created with"
    )
    token_max_expiration_ttl: float = Field(
        86_400.0, gt=0, description="longest TTL (s) a token may be created with"
    )
    token_gc_threshold: float = Field(
        3600.0,
        ge=0,
        description=(
            "an expired token is deleted this long (s) after it expired (Nomad's "
            "acl_token_gc_threshold); `corral system gc` deletes every expired one"
        ),
    )
    token_gc_interval: float = Field(
        300.0, gt=0, description="how often (s) the state leader deletes expired tokens"
    )

    @model_validator(mode="after")
    def _ordered(self) -> ACLSettings:
        if self.token_min_expiration_ttl > self.token_max_expiration_ttl:
            raise ValueError("acl token_min_expiration_ttl exceeds token_max_expiration_ttl")
        return self


DAY_S = 86_400.0


class KeyringSettings(SettingsGroup):
    """The keyring that encrypts Variables and signs workload identities
    (docs/variables.md, docs/security.md): where its key-encryption key is,
    and when the state leader rotates root keys (Nomad's
    root_key_rotation_threshold)."""

    ENV_PREFIX: ClassVar[str | None] = "CORRAL_KEYRING_"
    FLAG_PREFIX: ClassVar[str | None] = "--keyring-"

    kek_file: Path | None = Field(
        None,
        description=(
            "file holding the key-encryption key that wraps the root keys at rest (32 random "
            "bytes, base64; mode 0600; the same file on every state process). Without one, "
            "Variables, the keyring and workload identities answer FAILED_PRECONDITION"
        ),
    )
    rotation_threshold: float = Field(
        30 * DAY_S,
        gt=0,
        description=(
            "age (s) at which the active root key is replaced; its successor is prepublished "
            "at half that age so verifiers see it first (Nomad's root_key_rotation_threshold)"
        ),
    )
    check_interval: float = Field(
        60.0,
        gt=0,
        description="how often (s) the state leader checks for rotation and prepublished keys",
    )
    oidc_issuer: Annotated[str, Option(flag="--oidc-issuer", env="CORRAL_OIDC_ISSUER")] = Field(
        "",
        description=(
            "the `iss` of workload identities and the issuer /.well-known/openid-configuration "
            "names (Nomad's oidc_issuer); empty = no issuer, no discovery document"
        ),
    )


def _peers(value: Any) -> Any:
    """`REGION=ADDR` or `ADDR` items, from repeated flags or one
    comma-separated variable (a region may be named several times)."""
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            return value
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            region, sep, address = part.rpartition("=")
            if sep and not REGION_NAME.match(region):
                raise ValueError(f"{part!r}: {region!r} is not a region name")
            if not ADDRESS.match(address):
                raise ValueError(f"{part!r}: expects REGION=HOST:PORT or HOST:PORT")
            out.append(part)
    return out


class FederationSettings(SettingsGroup):
    """This region's place in a federation of regions (docs/operations.md
    "Federation"): the other regions' state servers, where they reach this
    region, and the region whose ACL policies and global tokens every
    region follows."""

    ENV_PREFIX: ClassVar[str | None] = "CORRAL_FEDERATION_"
    FLAG_PREFIX: ClassVar[str | None] = "--federation-"

    peers: Annotated[
        list[str],
        BeforeValidator(_peers),
        Option(flag="--federation-peer", env="CORRAL_FEDERATION_PEERS", repeatable=True),
    ] = Field(
        default_factory=list,
        description=(
            "another region's state servers: REGION=HOST:PORT, or HOST:PORT to learn the region "
            "from its answer (repeatable; comma-separated in the variable). Regions joined with "
            "`corral server join` are kept in the database instead"
        ),
    )
    advertise: str = Field(
        "",
        description=(
            "the host:port other regions reach this region's state servers at, e.g. a load "
            "balancer (default: the addresses of this region's state processes)"
        ),
    )
    probe_interval: float = Field(
        5.0, gt=0, description="seconds between health probes of each link to another region"
    )
    authoritative_region: Annotated[
        str, Option(flag="--authoritative-region", env="CORRAL_AUTHORITATIVE_REGION")
    ] = Field(
        "",
        pattern=OPTIONAL_REGION_PATTERN,
        description=(
            "the region that owns ACL policies, roles and global tokens "
            "(Nomad's authoritative_region): other regions forward their writes to it "
            "and replicate them from it (default: this region)"
        ),
    )
    replication_backoff: Annotated[
        float,
        Option(flag="--acl-replication-backoff", env="CORRAL_ACL_REPLICATION_BACKOFF"),
    ] = Field(
        2.0,
        gt=0,
        description="seconds ACL replication waits after a failure before it tries again",
    )


class StateSettings(ServerSettings):
    """A state process (migrations, change feed, every write, the public API);
    several may share one database."""

    ROLE: ClassVar[str] = "state"

    dsn: Dsn
    log_retention: int = Field(
        50_000, ge=1, description="change-log entries kept for subscribers that fall behind"
    )
    retention_interval: float = Field(
        30.0, gt=0, description="seconds between change-log truncations"
    )
    pool_size: int = Field(8, ge=1, description="database connections in the pool")
    feed_ring_bytes: int = Field(
        4 * 2**20,
        ge=0,
        description="serialized bytes of recent change batches kept in memory for subscribers "
        "a little behind (about 4x that in memory); older ones are read from the change log",
    )
    stream_stall_timeout: float = Field(
        30.0,
        gt=0,
        description="an Event.Stream or State.Subscribe reader that takes nothing this long "
        "(s) while messages wait for it is dropped: RESOURCE_EXHAUSTED naming the index to "
        "resubscribe from",
    )
    max_waiting_per_connection: int = Field(
        1024,
        ge=1,
        description="blocking queries and streams one client connection may hold open at "
        "once (the HTTP gateway is one connection for all its users)",
    )
    job_max_source_size: int = Field(
        1_000_000,
        ge=0,
        description="largest job submission (source plus variables, bytes) kept with a job "
        "version (Nomad's job_max_source_size); a larger one is discarded with a warning",
    )
    snapshot_max_bytes: int = Field(
        2 * 2**30,
        ge=1,
        description="largest operator snapshot a restore accepts: its archive, and the state "
        "it unpacks to (bytes); a larger one is refused and nothing changes",
    )
    heartbeat: HeartbeatSettings = Field(default_factory=HeartbeatSettings)
    acl: ACLSettings = Field(default_factory=ACLSettings)
    keyring: KeyringSettings = Field(default_factory=KeyringSettings)
    federation: FederationSettings = Field(default_factory=FederationSettings)
