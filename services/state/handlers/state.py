"""The `State` gRPC service: the index, snapshots, the change feed and the
writes the other roles make (proto/corral/v1/state.proto).

Every leader's write names its leader and is fenced on it
(`writes/fence.py`); `GarbageCollect`, which no leader makes, decides on the
stored rows that what it deletes is garbage (`writes/gc.py`). Snapshots and
the feed carry no node secret (`node_identity.py`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from corral.domain import structs, topics
from corral.domain.errors import InvalidArgument
from corral.domain.topics import EventType
from corral.runtime import telemetry
from corral.runtime.feed_view import FeedView, check_topics
from corral.runtime.slow_readers import send_stream
from corral.v1 import state_pb2, state_pb2_grpc
from services.state import metrics, validate
from services.state.app_context import StateContext
from services.state.db.database import WriteTx
from services.state.db.snapshot import Dump, stream_dump
from services.state.writes import deployments, gc
from services.state.writes.evals import (
    decide_eval,
    upsert_evals,
    validate_decision,
    validate_evals,
)
from services.state.writes.fence import require_leader, require_leader_id
from services.state.writes.plans import apply_plans, validate_plans

Context = Any
log = logging.getLogger(__name__)
tracer = telemetry.tracer("corral.state")

MEMBER_TTL_MS = 10_000


def _view(topics: Any, alloc_view: int) -> FeedView:
    unknown = check_topics(topics)
    if unknown:
        raise InvalidArgument("topics", f"unknown topic(s): {', '.join(unknown)}")
    if alloc_view not in state_pb2.AllocView.values():
        raise InvalidArgument("alloc_view", f"unknown alloc view {alloc_view}")
    return FeedView.of(topics, alloc_view)


def _passthrough(data: bytes) -> bytes:
    return data


def add_state_servicer(servicer: StateServicer, server: grpc.aio.Server) -> None:
    """`add_StateServicer_to_server`, but `Subscribe` sends the bytes its
    handler yields as they are: they are a `ChangeBatch` the feed
    serialized once for every subscriber of its view."""

    class Capture:
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

        def add_generic_rpc_handlers(self, _: object) -> None:
            pass

        def add_registered_method_handlers(
            self, _: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
        ) -> None:
            self.handlers = handlers

    capture = Capture()
    state_pb2_grpc.add_StateServicer_to_server(servicer, capture)  # type: ignore[arg-type]
    handlers = dict(capture.handlers)
    sub = handlers["Subscribe"]
    handlers["Subscribe"] = grpc.unary_stream_rpc_method_handler(
        servicer.Subscribe,
        request_deserializer=sub.request_deserializer,
        response_serializer=_passthrough,
    )
    name = state_pb2.DESCRIPTOR.services_by_name["State"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


class StateServicer(state_pb2_grpc.StateServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def GetIndex(
        self, request: state_pb2.GetIndexRequest, context: Context
    ) -> state_pb2.GetIndexResponse:
        db = self.ctx.db
        return state_pb2.GetIndexResponse(
            index=await db.latest_index(), oldest_retained_index=await db.oldest_retained_index()
        )

    async def Snapshot(
        self, request: state_pb2.SnapshotRequest, context: Context
    ) -> AsyncIterator[state_pb2.SnapshotChunk]:
        size = request.chunk_size or 1000
        if size > 100_000:
            raise InvalidArgument("chunk_size", "must be at most 100000")
        view = _view(request.topics, request.alloc_view)
        tables = view.snapshot_tables()
        async for name, part in stream_dump(self.ctx.db, chunk_size=size, tables=tables):
            if isinstance(part, Dump):
                head = state_pb2.SnapshotChunk(
                    index=part.index,
                    table_indexes=[
                        state_pb2.TableIndex(table=t, index=i)
                        for t, i in view.table_indexes(part.table_indexes).items()
                    ],
                )
                if view.wants(topics.OPERATOR.name):
                    head.scheduler_config.CopyFrom(part.scheduler_config)
                yield head
            else:
                chunk = state_pb2.SnapshotChunk()
                if name == "allocs":
                    part = list(view.allocs(part))  # type: ignore[arg-type]
                getattr(chunk, name).extend(part)
                yield chunk
        yield state_pb2.SnapshotChunk(done=True)

    async def Subscribe(  # type: ignore[override]  # serialized batches, see above
        self, request: state_pb2.SubscribeRequest, context: Context
    ) -> None:
        """Writes each batch already serialized (`add_state_servicer`): the
        feed encodes a batch once for every subscriber of the same view. At
        the subscriber's pace, bounded: one that stops reading is dropped
        (`corral.runtime.slow_readers`) and resubscribes from its index."""
        view = _view(request.topics, request.alloc_view)
        feed = self.ctx.feed

        async def batches() -> AsyncIterator[tuple[int, bytes]]:
            async for batch in feed.subscribe(request.from_index, self.ctx.shutting_down):
                yield batch.index, feed.encoded(batch, view)

        with (
            self.ctx.limits.waiting("a change-feed subscription"),
            metrics.dropped_counted("State.Subscribe"),
        ):
            await send_stream(
                context,
                batches(),
                stall_timeout=self.ctx.stream_stall_timeout,
                what="State.Subscribe",
            )

    async def UpsertEvals(
        self, request: state_pb2.UpsertEvalsRequest, context: Context
    ) -> state_pb2.WriteResponse:
        require_leader_id("broker", request.leader_id)
        validate_evals(request.evals)

        async def write(tx: WriteTx) -> None:
            await require_leader(tx, "broker", request.leader_id)
            await upsert_evals(tx, request.evals)

        done = await self.ctx.batcher.submit(
            write,
            evals=[e.id for e in request.evals],
            jobs={(e.namespace, e.job_id) for e in request.evals},
        )
        return state_pb2.WriteResponse(index=done.index)

    async def DecideEval(
        self, request: state_pb2.DecideEvalRequest, context: Context
    ) -> state_pb2.WriteResponse:
        """A scheduler worker's eval writes and ack in one call; the broker
        learns them from the feed (writes/evals.py `decide_eval`)."""
        validate_decision(request)
        evals = [e.id for e in request.created] + [request.eval_id]
        jobs = {(e.namespace, e.job_id) for e in request.created}
        if request.HasField("outcome"):
            jobs.add((request.outcome.namespace, request.outcome.job_id))

        async def write(tx: WriteTx) -> None:
            await decide_eval(tx, request)

        done = await self.ctx.batcher.submit(write, evals=evals, jobs=jobs)
        return state_pb2.WriteResponse(index=done.index)

    async def ApplyPlans(
        self, request: state_pb2.ApplyPlansRequest, context: Context
    ) -> state_pb2.ApplyPlansResponse:
        require_leader_id("planner", request.leader_id)
        validate_plans(request.plans)
        with tracer.start_as_current_span("state.commit") as span:
            async with self.ctx.write(count=len(request.plans)) as tx:
                await require_leader(tx, "planner", request.leader_id)
                indexes = await apply_plans(tx, request.plans)
            span.set_attribute("index", indexes[-1] if indexes else 0)
            span.set_attribute("plans", len(request.plans))
        return state_pb2.ApplyPlansResponse(indexes=indexes)

    async def UpdateAllocDesiredTransitions(
        self, request: state_pb2.UpdateAllocDesiredTransitionsRequest, context: Context
    ) -> state_pb2.WriteResponse:
        require_leader_id("broker", request.leader_id)
        validate.batch_size(len(request.transitions), "transitions")
        for i, t in enumerate(request.transitions):
            validate.require_id(t.alloc_id, f"transitions[{i}].alloc_id")
        if request.evals:
            validate_evals(request.evals)
        async with self.ctx.write() as tx:
            await require_leader(tx, "broker", request.leader_id)
            allocs = await tx.get_allocs([t.alloc_id for t in request.transitions])
            for t in request.transitions:
                cur = allocs.get(t.alloc_id)
                if cur is None:
                    continue
                alloc = structs.copy_msg(cur)
                alloc.desired_transition.MergeFrom(t.transition)
                tx.put_alloc(alloc, EventType.ALLOCATION_UPDATE_DESIRED_STATUS)
            if request.evals:
                await upsert_evals(tx, request.evals)
        return state_pb2.WriteResponse(index=tx.index)

    async def UpsertDeployments(
        self, request: state_pb2.UpsertDeploymentsRequest, context: Context
    ) -> state_pb2.WriteResponse:
        require_leader_id("broker", request.leader_id)
        validate.batch_size(len(request.deployments), "deployments")
        for i, d in enumerate(request.deployments):
            validate.deployment(d, f"deployments[{i}]")
        if request.evals:
            validate_evals(request.evals)
        async with self.ctx.write() as tx:
            await require_leader(tx, "broker", request.leader_id)
            for d in request.deployments:
                d = structs.copy_msg(d)
                old = await tx.get_deployment(d.id)
                d.create_index = old.create_index if old is not None else 0
                tx.put_deployment(d)
            if request.evals:
                await upsert_evals(tx, request.evals)
        return state_pb2.WriteResponse(index=tx.index)

    async def SetDeploymentStatus(
        self, request: state_pb2.SetDeploymentStatusRequest, context: Context
    ) -> state_pb2.SetDeploymentStatusResponse:
        require_leader_id("broker", request.leader_id)
        validate.require_id(request.deployment_id, "deployment_id")
        async with self.ctx.write() as tx:
            await require_leader(tx, "broker", request.leader_id)
            d, ev, reverted = await deployments.set_status(
                tx, request.deployment_id, request.status, request.status_description
            )
        log.info(
            "deployment %s %s: %s",
            d.id,
            d.status,
            d.status_description,
            extra={"job_id": d.job_id, "index": tx.index, "leader_id": request.leader_id},
        )
        return state_pb2.SetDeploymentStatusResponse(
            index=tx.index,
            eval_id=ev.id if ev is not None else "",
            reverted=reverted is not None,
            reverted_job_version=reverted.version if reverted is not None else 0,
        )

    async def GarbageCollect(
        self, request: state_pb2.GarbageCollectRequest, context: Context
    ) -> state_pb2.WriteResponse:
        total = (
            len(request.eval_ids)
            + len(request.alloc_ids)
            + len(request.jobs)
            + len(request.node_ids)
            + len(request.deployment_ids)
        )
        validate.batch_size(total, "garbage")
        for i, ref in enumerate(request.jobs):
            validate.require_id(ref.job_id, f"jobs[{i}].job_id")
        async with self.ctx.write() as tx:
            await gc.collect(tx, request)
        return state_pb2.WriteResponse(index=tx.index)

    async def PeriodicLaunches(
        self, request: state_pb2.PeriodicLaunchesRequest, context: Context
    ) -> state_pb2.PeriodicLaunchesResponse:
        launches, index = await self.ctx.db.periodic_launches(request.namespace, request.job_id)
        return state_pb2.PeriodicLaunchesResponse(launches=launches, index=index)

    async def RegisterMember(
        self, request: state_pb2.RegisterMemberRequest, context: Context
    ) -> state_pb2.RegisterMemberResponse:
        member = structs.copy_msg(request.member)
        validate.require_id(member.id, "member.id")
        validate.one_of(member.role, MEMBER_ROLES, "member.role")
        if not member.address:
            raise InvalidArgument("member.address", "is required")
        member.last_seen = structs.now_ns()
        if not member.started_at:
            member.started_at = member.last_seen
        await self.ctx.db.touch_member(
            member.id, member.role, member.address, member.SerializeToString()
        )
        return state_pb2.RegisterMemberResponse(ttl_ms=MEMBER_TTL_MS)


MEMBER_ROLES = ("state", "broker", "planner", "worker", "agent")
