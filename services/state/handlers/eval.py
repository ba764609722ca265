"""The public `Evals` service: list and get evaluations."""

from __future__ import annotations

from typing import Any

from corral.runtime.server import GrpcServer
from corral.security import access
from corral.v1 import eval_pb2, eval_pb2_grpc
from services.state import query
from services.state.app_context import StateContext

Context = Any
TABLES = ("evals",)


class EvalsServicer(eval_pb2_grpc.EvalsServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def List(
        self, request: eval_pb2.EvalListRequest, context: Context
    ) -> eval_pb2.EvalListResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        evals = query.listing(
            request.query,
            request.job_id,
            snap.evals_by_job,
            lambda: list(snap.evals.values()),
            status=request.status,
            triggered_by=request.triggered_by,
        )
        page, token = query.paginate_by_creation(evals, request.query)
        return eval_pb2.EvalListResponse(evals=page, meta=query.meta(snap, TABLES, token))

    async def Get(
        self, request: eval_pb2.EvalGetRequest, context: Context
    ) -> eval_pb2.EvalGetResponse:
        tables = ("evals", "allocs")
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        eval_id = query.resolve_prefix(list(snap.evals.keys()), request.eval_id, "eval")
        ev = snap.evals[eval_id]
        access.require_namespace(ev.namespace, access.READ_JOB)
        resp = eval_pb2.EvalGetResponse(eval=ev, meta=query.meta(snap, tables))
        if request.include_related:
            for rid in (ev.previous_eval, ev.next_eval, ev.blocked_eval, *ev.related_evals):
                other = snap.eval_by_id(rid) if rid else None
                if other is not None:
                    resp.related.append(other)
            resp.allocs.extend(sorted(snap.allocs_by_eval(ev.id), key=lambda a: a.name))
        return resp


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        eval_pb2_grpc.add_EvalsServicer_to_server,
        EvalsServicer(ctx),
        eval_pb2.DESCRIPTOR.services_by_name["Evals"].full_name,
    )
