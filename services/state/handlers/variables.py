"""The public `Variables` service (Nomad's Variables endpoint): list, read,
apply (set, check-and-set, delete, lock acquire/release) and lock renewal.

Every RPC's rule is "per object" (corral.security.access.RULES): the
caller's `variables` rules, or a workload identity's implicit policy, are
checked here on the path asked for (read, write, destroy) or on each path
listed (list), as Nomad's AllowVariableOperation. A lock's id is shown
only to management tokens and to the lock's holder (on its own writes).
"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.domain.errors import InvalidArgument, PermissionDenied
from corral.runtime.server import GrpcServer
from corral.security import access, acl
from corral.v1 import query_pb2, variables_pb2, variables_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state import query, validate
from services.state import variables as stored
from services.state.app_context import StateContext
from services.state.writes import variables as writes

Context = Any
TABLES = (stored.TABLE,)


def _namespace(q: query_pb2.QueryOptions, *, wildcard: bool) -> str:
    ns = q.namespace or "default"
    if ns == "*":
        if not wildcard:
            raise InvalidArgument("query.namespace", 'can not target wildcard ("*") namespace')
        return ns
    validate.namespace(ns, "query.namespace")
    return ns


def _denied(capability: str, namespace: str, path: str) -> PermissionDenied:
    return PermissionDenied(
        f"Permission denied: variables {capability} on {path!r} in namespace {namespace!r}"
    )


def _token(next_token: str) -> tuple[str, str] | None:
    """Nomad's NamespaceIDTokenizer: "<namespace>.<path>" (a namespace
    holds no dot)."""
    if not next_token:
        return None
    ns, dot, path = next_token.partition(".")
    if not dot:
        raise InvalidArgument("query.next_token", "is not a token this listing gave")
    return ns, path


class VariablesServicer(variables_pb2_grpc.VariablesServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def List(
        self, request: variables_pb2.VariablesListRequest, context: Context
    ) -> variables_pb2.VariablesListResponse:
        q = request.query
        namespace = _namespace(q, wildcard=True)
        if q.per_page < 0:
            raise InvalidArgument("query.per_page", "must not be negative")
        self.ctx.keyring.require()
        caller = access.current_acl()
        snap = await query.snapshot_for(self.ctx, q, TABLES)
        after = _token(q.next_token)
        inclusive = True
        page: list[pb.VariableMetadata] = []
        next_token = ""
        while True:
            rows = await stored.scan(
                self.ctx.db, namespace, q.prefix, after, stored.LIST_CHUNK, inclusive=inclusive
            )
            for var in rows:
                if not caller.allows_variable(var.namespace, var.path, acl.VARIABLE_LIST):
                    continue
                if q.per_page and len(page) == q.per_page:
                    next_token = f"{var.namespace}.{var.path}"
                    break
                page.append(var.metadata(with_lock=caller.is_management))
            if next_token or len(rows) < stored.LIST_CHUNK:
                break
            after, inclusive = (rows[-1].namespace, rows[-1].path), False
        return variables_pb2.VariablesListResponse(
            variables=page, meta=query.meta(snap, TABLES, next_token)
        )

    async def Read(
        self, request: variables_pb2.VariablesReadRequest, context: Context
    ) -> variables_pb2.VariablesReadResponse:
        q = request.query
        namespace = _namespace(q, wildcard=False)
        writes.check_path(request.path)
        self.ctx.keyring.require()
        caller = access.current_acl()
        if not caller.allows_variable(namespace, request.path, acl.VARIABLE_READ):
            raise _denied("read", namespace, request.path)
        loop = asyncio.get_running_loop()
        wait = q.wait_ms / 1000 if q.wait_ms > 0 else query.DEFAULT_WAIT_S
        deadline = loop.time() + min(wait, query.MAX_WAIT_S)
        seen = -1  # the variables table's index at the last read of the row
        while True:
            table = query.table_index(self.ctx.feed.snapshot(), TABLES)
            if table != seen:  # read the row again only once a variable changed
                seen = table
                var = await stored.get(self.ctx.db, namespace, request.path)
                index = var.modify_index if var is not None else table
            if not q.min_index or index > q.min_index:
                break
            remaining = deadline - loop.time()
            if remaining <= 0 or self.ctx.shutting_down.is_set():
                break
            await self.ctx.feed.wait_advance(remaining)
        meta = query_pb2.QueryMeta(index=max(index, 1), known_leader=True)
        if var is None:
            return variables_pb2.VariablesReadResponse(found=False, meta=meta)
        out = await stored.decrypted(self.ctx.keyring, var, with_lock=caller.is_management)
        return variables_pb2.VariablesReadResponse(found=True, variable=out, meta=meta)

    async def Apply(
        self, request: variables_pb2.VariablesApplyRequest, context: Context
    ) -> variables_pb2.VariablesApplyResponse:
        r = writes.validate_apply(request)
        caller = access.current_acl()
        need = (
            acl.VARIABLE_DESTROY
            if r.op in (writes.OP_DELETE, writes.OP_DELETE_CAS)
            else acl.VARIABLE_WRITE
        )
        if not caller.allows_variable(r.namespace, r.path, need):
            raise _denied(need, r.namespace, r.path)
        self.ctx.keyring.require()
        async with self.ctx.write() as tx:
            outcome = await writes.apply(tx, self.ctx.keyring, r)
        self.ctx.keyring.written(tx)
        resp = variables_pb2.VariablesApplyResponse(op=r.op, result=outcome.result, index=tx.index)
        if outcome.written is not None:
            holder = bool(r.lock_id) or r.op == writes.OP_LOCK_ACQUIRE
            resp.output.metadata.CopyFrom(
                outcome.written.metadata(with_lock=holder or caller.is_management)
            )
            resp.output.items.update(r.items)
        if outcome.conflict is not None:
            resp.conflict.metadata.CopyFrom(outcome.conflict)
            if not caller.allows_variable(r.namespace, r.path, acl.VARIABLE_READ):
                resp.result = writes.RESULT_REDACTED
            elif outcome.current is not None:
                resp.conflict.items.update(
                    await stored.decrypt_items(self.ctx.keyring, outcome.current)
                )
        return resp

    async def RenewLock(
        self, request: variables_pb2.VariablesRenewLockRequest, context: Context
    ) -> variables_pb2.VariablesRenewLockResponse:
        namespace = request.namespace or "default"
        validate.namespace(namespace, "namespace")
        writes.check_path(request.path)
        caller = access.current_acl()
        if not caller.allows_variable(namespace, request.path, acl.VARIABLE_WRITE):
            raise _denied("write", namespace, request.path)
        self.ctx.keyring.require()
        var = await writes.renew_lock(self.ctx.db, namespace, request.path, request.lock_id)
        return variables_pb2.VariablesRenewLockResponse(
            variable=var.metadata(with_lock=True), index=var.modify_index
        )


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        variables_pb2_grpc.add_VariablesServicer_to_server,
        VariablesServicer(ctx),
        variables_pb2.DESCRIPTOR.services_by_name["Variables"].full_name,
    )
