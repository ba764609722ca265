"""The PostgreSQL schema, as SQLAlchemy 2 models.

Every object is stored as its serialized protobuf (`payload`) beside the
columns we filter on, so reads never reassemble objects from columns and the
wire format stays the single definition of an object. The schema itself is
created only by the Alembic migrations in `migrations/`; these models are
what the code and `alembic revision --autogenerate` see.

`index_counter` is the heart of correctness: one row whose `value` every
write transaction increments first. The row lock serializes writers, so
commit order equals index order across any number of state processes (a
sequence would not: it orders by allocation, not by commit).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s__%(column_0_N_name)s",
    "uq": "uq_%(table_name)s__%(column_0_N_name)s",
    "ck": "ck_%(table_name)s__%(constraint_name)s",
    "fk": "fk_%(table_name)s__%(column_0_N_name)s__%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class IndexCounter(Base):
    """The single-row state index counter."""

    __tablename__ = "index_counter"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ChangeLog(Base):
    """One row per write transaction: the ChangeBatch of its events.

    Gap-free (every index has exactly one row until it is truncated) and the
    source of both State.Subscribe and Event.Stream."""

    __tablename__ = "change_log"
    index: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.clock_timestamp()
    )
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class TableIndex(Base):
    """The last index that wrote each table (Nomad's `index` table)."""

    __tablename__ = "table_indexes"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Job(Base):
    __tablename__ = "jobs"
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    type: Mapped[str] = mapped_column(String(16), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    stop: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    job_modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    node_pool: Mapped[str] = mapped_column(String(128), nullable=False, default="default")


class JobVersion(Base):
    """Every registered version of a job (allocs reference job_version)."""

    __tablename__ = "job_versions"
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class JobSummary(Base):
    __tablename__ = "job_summaries"
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), nullable=False)
    datacenter: Mapped[str] = mapped_column(String(128), nullable=False)
    node_pool: Mapped[str] = mapped_column(String(128), nullable=False)
    node_class: Mapped[str] = mapped_column(String(128), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    eligibility: Mapped[str] = mapped_column(String(16), nullable=False)
    drain: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Alloc(Base):
    __tablename__ = "allocs"
    __table_args__ = (
        Index(None, "namespace", "job_id"),
        Index(None, "node_id"),
        Index(None, "eval_id"),
    )
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128), nullable=False)
    job_id: Mapped[str] = mapped_column(String(256), nullable=False)
    node_id: Mapped[str] = mapped_column(String(64), nullable=False)
    eval_id: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str] = mapped_column(String(512), nullable=False)
    task_group: Mapped[str] = mapped_column(String(256), nullable=False)
    desired_status: Mapped[str] = mapped_column(String(16), nullable=False)
    client_status: Mapped[str] = mapped_column(String(16), nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Eval(Base):
    __tablename__ = "evals"
    __table_args__ = (Index(None, "namespace", "job_id"), Index(None, "status"))
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128), nullable=False)
    job_id: Mapped[str] = mapped_column(String(256), nullable=False)
    type: Mapped[str] = mapped_column(String(16), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    triggered_by: Mapped[str] = mapped_column(String(64), nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Deployment(Base):
    __tablename__ = "deployments"
    __table_args__ = (Index(None, "namespace", "job_id"),)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128), nullable=False)
    job_id: Mapped[str] = mapped_column(String(256), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ServiceRegistration(Base):
    """One instance of a service (Nomad's service_registrations table),
    keyed as Nomad keys it: by namespace and id. Written by the client
    running it; removed by the state when its alloc becomes client-terminal
    or its node goes down (services/state/writes/services.py)."""

    __tablename__ = "service_registrations"
    __table_args__ = (
        Index(None, "namespace", "service_name"),
        Index(None, "alloc_id"),
        Index(None, "node_id"),
        Index(None, "namespace", "job_id"),
    )
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[str] = mapped_column(String(1024), primary_key=True)
    service_name: Mapped[str] = mapped_column(String(256), nullable=False)
    node_id: Mapped[str] = mapped_column(String(64), nullable=False)
    datacenter: Mapped[str] = mapped_column(String(128), nullable=False)
    job_id: Mapped[str] = mapped_column(String(256), nullable=False)
    alloc_id: Mapped[str] = mapped_column(String(64), nullable=False)
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    address: Mapped[str] = mapped_column(String(256), nullable=False)
    port: Mapped[int] = mapped_column(Integer, nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class SchedulerConfig(Base):
    __tablename__ = "scheduler_config"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class PeriodicLaunch(Base):
    """The last launch of each periodic job (Nomad's periodic_launch table):
    written in the transaction that registers a child, or the parent itself
    when it is new, so a dispatcher taking over knows what was launched."""

    __tablename__ = "periodic_launches"
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    launch: Mapped[int] = mapped_column(BigInteger, nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class JobSubmission(Base):
    """The file each job version was submitted with (Nomad's job_submission
    table): bookkeeping beside the version, no event; kept for the newest
    `SUBMISSIONS_KEPT` versions of a job and purged with it."""

    __tablename__ = "job_submissions"
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class Member(Base):
    """Processes of every role and where they listen (not indexed state:
    refreshed often, never part of the change feed)."""

    __tablename__ = "members"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(32), nullable=False)
    address: Mapped[str] = mapped_column(String(256), nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    last_seen: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class ACLPolicy(Base):
    """A named ACL policy: its rules as written (HCL), parsed on use."""

    __tablename__ = "acl_policies"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    description: Mapped[str] = mapped_column(String(256), nullable=False)
    rules: Mapped[str] = mapped_column(Text, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ACLToken(Base):
    """An ACL token. Only the SHA-256 of its secret id is stored
    (`corral.security.acl.secret_hash`), so a dump of this table holds no usable
    token; the secret itself is shown once, when the token is created."""

    __tablename__ = "acl_tokens"
    __table_args__ = (
        UniqueConstraint("secret_hash"),
        CheckConstraint("type IN ('client', 'management')", name="type"),
    )
    accessor_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str] = mapped_column(String(256), nullable=False)
    type: Mapped[str] = mapped_column(String(16), nullable=False)
    policies: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    global_: Mapped[bool] = mapped_column("global", Boolean, nullable=False)
    create_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    expiration_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    #: ids of the roles the token links (a link to a deleted role is
    #: skipped when read, as Nomad's fixTokenRoleLinks does)
    roles: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default="{}")


class ACLRole(Base):
    """A named set of policies tokens link (Nomad's ACLRole): its policy
    names as written; a policy deleted since grants nothing."""

    __tablename__ = "acl_roles"
    __table_args__ = (UniqueConstraint("name"),)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    description: Mapped[str] = mapped_column(String(256), nullable=False)
    policies: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ACLOneTimeToken(Base):
    """A one-time token (Nomad's OneTimeToken), at most one per ACL token
    (a new one replaces it, as Nomad's table is unique on the accessor).
    Neither secret is stored in the clear: the one-time secret as its
    SHA-256 (the lookup), the ACL token's secret sealed under a key derived
    from the one-time secret (services/state/writes/one_time_tokens.py), so
    a dump holds nothing that exchanges or authenticates."""

    __tablename__ = "acl_one_time_tokens"
    __table_args__ = (UniqueConstraint("secret_hash"), Index(None, "expires_at"))
    accessor_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("acl_tokens.accessor_id", ondelete="CASCADE"), primary_key=True
    )
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    sealed_secret: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ACLBootstrap(Base):
    """One row once the ACL system is bootstrapped: `ACL.Bootstrap` works
    only while this table is empty."""

    __tablename__ = "acl_bootstrap"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    bootstrap_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    accessor_id: Mapped[str] = mapped_column(String(64), nullable=False)
    create_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class Namespace(Base):
    """A namespace (Nomad's namespaces table); `default` always exists."""

    __tablename__ = "namespaces"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class NodePool(Base):
    """A node pool; the built-in `all` and `default` always exist."""

    __tablename__ = "node_pools"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ScalingPolicy(Base):
    """A scaling policy derived from a job's `scaling` blocks."""

    __tablename__ = "scaling_policies"
    __table_args__ = (Index(None, "namespace", "job_id"),)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128), nullable=False)
    job_id: Mapped[str] = mapped_column(String(256), nullable=False)
    type: Mapped[str] = mapped_column(String(32), nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ScalingEvents(Base):
    """The scaling events of one job (the newest few per task group)."""

    __tablename__ = "scaling_events"
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Variable(Base):
    """A Nomad Variable: its items only as AES-256-GCM ciphertext (`data`,
    the nonce first) under the root key `key_id`; nothing in clear but the
    namespace, the path and the indexes (services/state/variables.py).

    A lock's expiry is the database's clock (`lock_expires`), moved by
    acquire and renew, so every state process and a new leader agree on
    it; a renewal is not an indexed write (Nomad's renewals are not Raft
    writes either)."""

    __tablename__ = "variables"
    __table_args__ = (Index(None, "key_id"),)
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    path: Mapped[str] = mapped_column(String(128), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(64), nullable=False)
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    create_time: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_time: Mapped[int] = mapped_column(BigInteger, nullable=False)
    lock_id: Mapped[str | None] = mapped_column(String(64))
    lock_ttl: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    lock_delay: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    lock_expires: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RootKey(Base):
    """A root key of the keyring: a 256-bit data key for Variables and an
    RSA key for workload identities, both wrapped (AES-256-GCM) by the
    state role's key-encryption key, whose fingerprint is `kek_id`
    (services/state/keyring.py, docs/security.md). The public key is kept
    in clear: it is what the JWKS publishes."""

    __tablename__ = "root_keys"
    __table_args__ = (
        CheckConstraint(
            "state IN ('active', 'inactive', 'rekeying', 'prepublished', 'deprecated')",
            name="state",
        ),
    )
    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    algorithm: Mapped[str] = mapped_column(String(32), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    create_time: Mapped[int] = mapped_column(BigInteger, nullable=False)
    publish_time: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    create_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    modify_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    kek_id: Mapped[str] = mapped_column(String(64), nullable=False)
    wrapped_key: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    wrapped_rsa_key: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    public_key: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class FederationRegion(Base):
    """A region this one joined at run time (`corral server join`), or
    that joined this one: where its state servers are reached. Like
    `members`, membership and not indexed state (Nomad keeps its WAN
    members in gossip, not in Raft): written when a link learns something
    new, never part of the change feed. Regions configured with
    `--federation-peer` are not stored."""

    __tablename__ = "federation_regions"
    region: Mapped[str] = mapped_column(String(64), primary_key=True)
    addresses: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    joined_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
