"""Assembles a state service process: database, change feed, gRPC servicers,
change-log retention and member registration."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from corral.domain import structs
from corral.runtime.leader import LeaderElection
from corral.runtime.process import new_member_id
from corral.runtime.server import GrpcServer
from corral.v1 import state_pb2
from services.state import handlers, metrics
from services.state.app_context import StateContext
from services.state.call_limits import CallLimits
from services.state.config import StateSettings as StateSettings  # tests build it from here
from services.state.db.database import Database, translate_error
from services.state.federation import replication
from services.state.federation.links import Federation
from services.state.federation.replication import Replicator
from services.state.feed import ChangeFeed
from services.state.handlers import acl, federation, node
from services.state.handlers.state import StateServicer, add_state_servicer
from services.state.heartbeat import Drainer, Heartbeats
from services.state.keyring_leader import KeyringLeader
from services.state.token_gc import TokenGC

log = logging.getLogger(__name__)


class StateApp:
    def __init__(self, settings: StateSettings) -> None:
        self.settings = settings
        self.node_service: node.NodeServicer | None = None
        self.db = Database(settings.dsn, pool_size=settings.pool_size)
        self.feed = ChangeFeed(self.db, ring_bytes=settings.feed_ring_bytes)
        self.server = GrpcServer(
            settings.listen, name="state", translate=translate_error, settings=settings.security
        )
        self.ctx = StateContext(
            db=self.db,
            feed=self.feed,
            job_max_source_size=settings.job_max_source_size,
            snapshot_max_bytes=settings.snapshot_max_bytes,
            shutting_down=self.server.shutting_down,
            limits=CallLimits(settings.max_waiting_per_connection),
            stream_stall_timeout=settings.stream_stall_timeout,
            keyring_settings=settings.keyring,
            region=settings.security.region,
        )
        # the state resolves ACL tokens from its own database
        self.server.guard.resolver = self.ctx.acl
        # the other regions: calls for them are forwarded over these links
        self.federation = Federation(
            self.db,
            settings.security.region,
            settings.federation,
            settings.security,
            self.ctx.limits,
        )
        self.ctx.federation = self.federation
        self.server.forwarder = self.federation
        self.replicator = Replicator(
            self.federation,
            self.db,
            self.ctx.write,
            self.ctx.acl.invalidate,
            settings.federation.replication_backoff,
        )
        self.heartbeats = Heartbeats(self.ctx, settings.heartbeat)
        self.drainer = Drainer(self.ctx, settings.heartbeat.drain_interval)
        self.token_gc = TokenGC(self.ctx, settings.acl)
        self.keyring_leader = KeyringLeader(self.ctx)
        # a snapshot restore replaced the state: what is kept beside the
        # feed's store starts over
        self.feed.on_reload += [
            self.ctx.acl.invalidate,
            self.ctx.keyring.forget,
            self.ctx.node_secrets.forget,
            self.heartbeats.reloaded,
        ]
        self.election: LeaderElection | None = None
        self._term: list[asyncio.Task[None]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> str:
        await self.feed.start()
        self.server.add(
            add_state_servicer,
            StateServicer(self.ctx),
            state_pb2.DESCRIPTOR.services_by_name["State"].full_name,
        )
        self._add_public_services()
        await self.server.start()
        self.ctx.address = self.settings.advertise or self.server.bound_address
        self.ctx.member_id = new_member_id("state")
        self.federation.address = self.ctx.address
        await self._register_self()
        self.election = LeaderElection(self.settings.dsn, "state", self.ctx.address)
        self._tasks.append(asyncio.create_task(self._retention_loop(), name="log-retention"))
        self._tasks.append(asyncio.create_task(self._member_loop(), name="member"))
        self._tasks.append(
            asyncio.create_task(self.federation.run(self.server.shutting_down), name="federation")
        )
        self._tasks.append(
            asyncio.create_task(
                self.ctx.acl.follow(self.feed, self.server.shutting_down), name="acl-cache"
            )
        )
        self._tasks.append(
            asyncio.create_task(
                self.ctx.keyring.follow(self.feed, self.server.shutting_down), name="keyring"
            )
        )
        self._tasks.append(
            asyncio.create_task(self.election.run(self._on_elected, self._on_lost), name="election")
        )
        metrics.CLUSTER.add_source(self._leader_view)
        return self.server.bound_address

    def _leader_view(self) -> metrics.LeaderView | None:
        """The cluster gauges' source (services/state/metrics.py): the
        leader's copy of the state, None on a follower."""
        if self.election is None or not self.election.is_leader:
            return None
        return metrics.LeaderView(self.feed.snapshot(), self.heartbeats.active)

    async def _on_elected(self) -> None:
        """Heartbeat timers, the drainer, the expired token GC, the keyring's
        maintenance and variable lock expiry run on the leader only."""
        await self.feed.wait_for_index(await self.db.latest_index(), 30)
        self.heartbeats.start_term()
        self._term = [
            asyncio.create_task(self.heartbeats.run(), name="heartbeats"),
            asyncio.create_task(self.drainer.run(), name="drainer"),
            asyncio.create_task(self.token_gc.run(), name="token-gc"),
            asyncio.create_task(self.keyring_leader.run_keyring(), name="keyring-leader"),
            asyncio.create_task(self.keyring_leader.run_locks(), name="variable-locks"),
        ]
        if self.settings.security.acl_enabled and not self.federation.authoritative:
            # Nomad's leader replicates ACLs from the authoritative region
            self._term.append(
                asyncio.create_task(self.replicator.run(self.ctx.member_id), name="acl-replication")
            )
        log.info("state leader: tracking %d node heartbeats", len(self.feed.snapshot().nodes))
        # `operator members` shows the new leader now, not at the next refresh
        await self._refresh_member()

    async def _on_lost(self) -> None:
        self.heartbeats.end_term()
        for t in self._term:
            t.cancel()
        for t in self._term:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._term = []
        await self._refresh_member()

    async def leader_address(self) -> str:
        return await self.election.leader_address() if self.election is not None else ""

    def _add_public_services(self) -> None:
        """Public API servicers (Job, Node, Alloc, Evals, Event, Operator,
        Variables, Keyring, ACL)."""
        handlers.register(self.server, self.ctx)
        self.node_service = node.register(
            self.server, self.ctx, self.heartbeats, self.leader_address
        )
        acl.register(self.server, self.ctx, self.settings.acl)
        federation.register(self.server, self.ctx, self.federation, self._is_leader)

    def _is_leader(self) -> bool:
        return self.election is not None and self.election.is_leader

    async def stop(self) -> None:
        metrics.CLUSTER.remove_source(self._leader_view)
        await self.server.stop(grace=5.0)
        if self.election is not None:
            await self.election.stop()
        await self._on_lost()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.federation.close()
        if self.node_service is not None:
            await self.node_service.close()
        await self.feed.stop()
        await self.db.close()

    async def wait_stopped(self) -> None:
        await self.server.wait_stopped()

    async def _register_self(self) -> None:
        member = state_pb2.Member(
            id=self.ctx.member_id,
            role="state",
            address=self.ctx.address,
            started_at=structs.now_ns(),
            last_seen=structs.now_ns(),
            version="1",
            leader=self.election is not None and self.election.is_leader,
        )
        if member.leader and self.federation.replication.enabled:
            # any state process answers with the leader's replication status
            member.tags[replication.TAG] = replication.status_tag(self.federation.replication)
        await self.db.touch_member(
            member.id, member.role, member.address, member.SerializeToString()
        )

    async def _refresh_member(self) -> None:
        """Best effort and bounded: a leadership change must not wait on a
        database that may be the reason for it."""
        try:
            await asyncio.wait_for(self._register_self(), 2.0)
        except Exception as exc:
            log.warning("member refresh failed: %s", exc)

    async def _member_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            await self._refresh_member()

    async def truncate_change_log(self, keep: int) -> int:
        """Keep the newest `keep` change-log entries (in the table and in
        the feed's ring); returns how many rows were dropped."""
        dropped = await self.db.truncate_log(keep)
        self.feed.forget_before(await self.db.oldest_retained_index())
        return dropped

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.retention_interval)
            try:
                dropped = await self.truncate_change_log(self.settings.log_retention)
                if dropped:
                    log.info("truncated %d change-log entries", dropped)
            except Exception as exc:
                log.warning("change-log truncation failed: %s", exc)
