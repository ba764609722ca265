"""The public `ACL` service: bootstrap, policies, roles and tokens (Nomad's
ACL API), and `ResolveToken` for the roles that are not the state.

Who may call what is in `corral.security.access.RULES`, checked before a handler
runs: `Bootstrap` anyone, once; `ResolveToken` anyone holding the secret
(the secret in the request is the authorization); `TokenSelf` anyone, about
the token in their own call metadata; everything else a management token,
except `ListPolicies` and `GetPolicy`, which a token holding a policy
(itself or through a role) may use for that policy, and `ListRoles`,
`GetRole` and `GetRoleByName`, which a token may use for the roles it links
(decided here, from the caller's ACL in `corral.security.acl.CURRENT` and
its token).

Roles, as policies, are the authoritative region's in a federation: role
writes elsewhere are forwarded there, and ACL replication copies them back
(services/state/federation/replication.py).

`UpsertOneTimeToken` any non-anonymous token, for itself;
`ExchangeOneTimeToken` anyone holding the one-time secret.

With ACLs off the whole service answers FAILED_PRECONDITION. Only
`Bootstrap`, `CreateToken` and `ExchangeOneTimeToken` answer with a secret
id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from corral.domain.errors import InvalidArgument, NotFound, PermissionDenied
from corral.runtime.server import GrpcServer
from corral.security import acl
from corral.security.access import ACL_SERVICE
from corral.v1 import acl_pb2, acl_pb2_grpc, query_pb2
from services.state import acl as acl_reads
from services.state import query
from services.state.app_context import StateContext
from services.state.config import ACLSettings
from services.state.writes import acl as acl_writes
from services.state.writes import one_time_tokens

Context = Any
NS_PER_S = 1_000_000_000


def _may_read_policy(name: str) -> bool:
    """A management token reads every policy; any other the ones it holds,
    itself or through its roles (its compiled ACL names them all)."""
    caller = acl.CURRENT.get()
    return caller.is_management or name in caller.policies


async def _caller_role_ids(ctx: StateContext, context: Context) -> set[str] | None:
    """The roles the caller may read: None for a management token (every
    role), else the ids of the roles its token links (Nomad's ListRoles and
    GetRole*: a token reads the roles it holds)."""
    if acl.CURRENT.get().is_management:
        return None
    secret = acl.token_from_metadata(context.invocation_metadata())
    token = await acl_reads.token_by_secret(ctx.db, secret) if secret else None
    return {link.id for link in token.roles} if token is not None else set()


async def table_index_after(
    ctx: StateContext,
    q: query_pb2.QueryOptions,
    table: str,
    index_of: Callable[[], Awaitable[int]] | None = None,
) -> int:
    """An ACL table's index (`index_of()`, default the table's index as
    reads report it); with `min_index`, first wait (as a blocking query
    does) until a write moved it past that, or the wait ran out."""
    read = index_of or (lambda: acl_reads.table_index(ctx.db, (table,)))
    index = await read()
    if not q.min_index:
        return index
    loop = asyncio.get_running_loop()
    wait = q.wait_ms / 1000 if q.wait_ms > 0 else query.DEFAULT_WAIT_S
    deadline = loop.time() + min(wait, query.MAX_WAIT_S)
    while index <= q.min_index and not ctx.shutting_down.is_set():
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        await ctx.feed.wait_advance(remaining)
        index = await read()
    return index


class ACLServicer(acl_pb2_grpc.ACLServicer):
    def __init__(self, ctx: StateContext, settings: ACLSettings) -> None:
        self.ctx = ctx
        self.min_ttl_ns = int(settings.token_min_expiration_ttl * NS_PER_S)
        self.max_ttl_ns = int(settings.token_max_expiration_ttl * NS_PER_S)

    async def _index(self, q: query_pb2.QueryOptions, table: str) -> int:
        return await table_index_after(self.ctx, q, table)

    def _written(self) -> None:
        self.ctx.acl.invalidate()

    async def _to_authority(self, method: str, request: Any, context: Context) -> bytes | None:
        """Outside the authoritative region of a federation, policies and
        global tokens are written there (as Nomad forwards them): the
        authority's answer, passed back unchanged; ACL replication brings
        the write here within moments. None in the authoritative region."""
        fed = self.ctx.federation
        if fed is None or fed.authoritative:
            return None
        return await fed.unary(fed.authoritative_region, ACL_SERVICE + method, request, context)

    # ---------------------------------------------------------- bootstrap

    async def Bootstrap(  # type: ignore[override]
        self, request: acl_pb2.ACLBootstrapRequest, context: Context
    ) -> acl_pb2.ACLTokenResponse | bytes:
        if (forwarded := await self._to_authority("Bootstrap", request, context)) is not None:
            return forwarded
        async with self.ctx.write() as tx:
            token, secret = await acl_writes.bootstrap(tx, request.secret_id)
        self._written()
        token.secret_id = secret
        return acl_pb2.ACLTokenResponse(token=token, index=tx.index)

    # ----------------------------------------------------------- policies

    async def UpsertPolicies(  # type: ignore[override]
        self, request: acl_pb2.ACLUpsertPoliciesRequest, context: Context
    ) -> acl_pb2.ACLWriteResponse | bytes:
        acl_writes.validate_policies(request.policies)
        if (forwarded := await self._to_authority("UpsertPolicies", request, context)) is not None:
            return forwarded
        async with self.ctx.write() as tx:
            await acl_writes.upsert_policies(tx, request.policies)
        self._written()
        return acl_pb2.ACLWriteResponse(index=tx.index)

    async def ListPolicies(
        self, request: acl_pb2.ACLListPoliciesRequest, context: Context
    ) -> acl_pb2.ACLListPoliciesResponse:
        index = await self._index(request.query, acl_reads.POLICIES_TABLE)
        policies = [
            p
            for p in await acl_reads.list_policies(self.ctx.db)
            if p.name.startswith(request.query.prefix) and _may_read_policy(p.name)
        ]
        page, token = query.paginate(policies, lambda p: p.name, request.query)
        return acl_pb2.ACLListPoliciesResponse(
            policies=page,
            meta=query_pb2.QueryMeta(index=index, next_token=token, known_leader=True),
        )

    async def GetPolicy(
        self, request: acl_pb2.ACLGetPolicyRequest, context: Context
    ) -> acl_pb2.ACLPolicyResponse:
        acl_writes.policy_name(request.name, "name")
        if not _may_read_policy(request.name):
            raise PermissionDenied("Permission denied: the token does not hold this policy")
        index = await self._index(request.query, acl_reads.POLICIES_TABLE)
        found = await acl_reads.get_policies(self.ctx.db, [request.name])
        if not found:
            raise NotFound(f"ACL policy {request.name!r} not found")
        return acl_pb2.ACLPolicyResponse(
            policy=found[0], meta=query_pb2.QueryMeta(index=index, known_leader=True)
        )

    async def DeletePolicies(  # type: ignore[override]
        self, request: acl_pb2.ACLDeletePoliciesRequest, context: Context
    ) -> acl_pb2.ACLWriteResponse | bytes:
        if (forwarded := await self._to_authority("DeletePolicies", request, context)) is not None:
            return forwarded
        async with self.ctx.write() as tx:
            await acl_writes.delete_policies(tx, request.names)
        self._written()
        return acl_pb2.ACLWriteResponse(index=tx.index)

    # -------------------------------------------------------------- roles

    async def UpsertRoles(  # type: ignore[override]
        self, request: acl_pb2.ACLUpsertRolesRequest, context: Context
    ) -> acl_pb2.ACLRolesResponse | bytes:
        acl_writes.validate_roles(request.roles)
        if (forwarded := await self._to_authority("UpsertRoles", request, context)) is not None:
            return forwarded
        async with self.ctx.write() as tx:
            roles = await acl_writes.upsert_roles(tx, request.roles)
        self._written()
        return acl_pb2.ACLRolesResponse(roles=roles, index=tx.index)

    async def DeleteRoles(  # type: ignore[override]
        self, request: acl_pb2.ACLDeleteRolesRequest, context: Context
    ) -> acl_pb2.ACLWriteResponse | bytes:
        if (forwarded := await self._to_authority("DeleteRoles", request, context)) is not None:
            return forwarded
        async with self.ctx.write() as tx:
            await acl_writes.delete_roles(tx, request.ids)
        self._written()
        return acl_pb2.ACLWriteResponse(index=tx.index)

    async def ListRoles(
        self, request: acl_pb2.ACLListRolesRequest, context: Context
    ) -> acl_pb2.ACLListRolesResponse:
        index = await self._index(request.query, acl_reads.ROLES_TABLE)
        visible = await _caller_role_ids(self.ctx, context)
        roles = [
            r
            for r in await acl_reads.list_roles(self.ctx.db)
            if r.id.startswith(request.query.prefix) and (visible is None or r.id in visible)
        ]
        page, token = query.paginate(roles, lambda r: r.id, request.query)
        return acl_pb2.ACLListRolesResponse(
            roles=page, meta=query_pb2.QueryMeta(index=index, next_token=token, known_leader=True)
        )

    async def _role_answer(
        self,
        found: acl_pb2.ACLRole | None,
        what: str,
        context: Context,
    ) -> acl_pb2.ACLRoleResponse:
        visible = await _caller_role_ids(self.ctx, context)
        if visible is not None and (found is None or found.id not in visible):
            raise PermissionDenied("Permission denied: the token does not hold this role")
        if found is None:
            raise NotFound(f"ACL role {what} not found")
        return acl_pb2.ACLRoleResponse(
            role=found, meta=query_pb2.QueryMeta(index=found.modify_index, known_leader=True)
        )

    async def GetRole(
        self, request: acl_pb2.ACLGetRoleRequest, context: Context
    ) -> acl_pb2.ACLRoleResponse:
        acl_writes.accessor_id(request.id, "id")
        await self._index(request.query, acl_reads.ROLES_TABLE)
        found = await acl_reads.get_roles(self.ctx.db, [request.id])
        return await self._role_answer(found[0] if found else None, repr(request.id), context)

    async def GetRoleByName(
        self, request: acl_pb2.ACLGetRoleByNameRequest, context: Context
    ) -> acl_pb2.ACLRoleResponse:
        acl_writes.policy_name(request.name, "name")
        await self._index(request.query, acl_reads.ROLES_TABLE)
        found = await acl_reads.get_role_by_name(self.ctx.db, request.name)
        return await self._role_answer(found, repr(request.name), context)

    # ------------------------------------------------------------- tokens

    async def CreateToken(  # type: ignore[override]
        self, request: acl_pb2.ACLCreateTokenRequest, context: Context
    ) -> acl_pb2.ACLTokenResponse | bytes:
        acl_writes.validate_token(request, self.min_ttl_ns, self.max_ttl_ns)
        if (
            request.is_global
            and (forwarded := await self._to_authority("CreateToken", request, context)) is not None
        ):
            return forwarded
        async with self.ctx.write() as tx:
            token, secret = await acl_writes.create_token(tx, request)
        self._written()
        token.secret_id = secret
        return acl_pb2.ACLTokenResponse(token=token, index=tx.index)

    async def ListTokens(
        self, request: acl_pb2.ACLListTokensRequest, context: Context
    ) -> acl_pb2.ACLListTokensResponse:
        index = await self._index(request.query, acl_reads.TOKENS_TABLE)
        tokens = [
            t
            for t in await acl_reads.list_tokens(self.ctx.db)
            if t.accessor_id.startswith(request.query.prefix)
        ]
        page, token = query.paginate(tokens, lambda t: t.accessor_id, request.query)
        return acl_pb2.ACLListTokensResponse(
            tokens=page, meta=query_pb2.QueryMeta(index=index, next_token=token, known_leader=True)
        )

    async def GetToken(
        self, request: acl_pb2.ACLGetTokenRequest, context: Context
    ) -> acl_pb2.ACLTokenResponse:
        acl_writes.accessor_id(request.accessor_id, "accessor_id")
        index = await self._index(request.query, acl_reads.TOKENS_TABLE)
        token = await acl_reads.get_token(self.ctx.db, request.accessor_id)
        if token is None:
            raise NotFound(f"ACL token {request.accessor_id!r} not found")
        return acl_pb2.ACLTokenResponse(token=token, index=index)

    async def UpdateToken(  # type: ignore[override]
        self, request: acl_pb2.ACLUpdateTokenRequest, context: Context
    ) -> acl_pb2.ACLTokenResponse | bytes:
        acl_writes.accessor_id(request.accessor_id, "accessor_id")
        if (
            # a global token is the authoritative region's to change
            await acl_reads.any_global(self.ctx.db, [request.accessor_id])
            and (forwarded := await self._to_authority("UpdateToken", request, context)) is not None
        ):
            return forwarded
        acl_writes.validate_token(
            acl_pb2.ACLCreateTokenRequest(
                name=request.name,
                type=request.type,
                policies=request.policies,
                roles=request.roles,
            ),
            self.min_ttl_ns,
            self.max_ttl_ns,
        )
        async with self.ctx.write() as tx:
            token = await acl_writes.update_token(tx, request)
        self._written()
        return acl_pb2.ACLTokenResponse(token=token, index=tx.index)

    async def DeleteTokens(  # type: ignore[override]
        self, request: acl_pb2.ACLDeleteTokensRequest, context: Context
    ) -> acl_pb2.ACLWriteResponse | bytes:
        if (
            await acl_reads.any_global(self.ctx.db, request.accessor_ids[: acl_writes.MAX_BATCH])
            and (forwarded := await self._to_authority("DeleteTokens", request, context))
            is not None
        ):
            return forwarded
        async with self.ctx.write() as tx:
            await acl_writes.delete_tokens(tx, request.accessor_ids)
        self._written()
        return acl_pb2.ACLWriteResponse(index=tx.index)

    async def TokenSelf(
        self, request: acl_pb2.ACLTokenSelfRequest, context: Context
    ) -> acl_pb2.ACLTokenResponse:
        secret = acl.token_from_metadata(context.invocation_metadata())
        index = await acl_reads.table_index(self.ctx.db, (acl_reads.TOKENS_TABLE,))
        if not secret:
            resolved = await self.ctx.acl.resolve_token("")
            names = [p.name for p in resolved.response.policies]
            return acl_pb2.ACLTokenResponse(token=acl_reads.anonymous_token(names), index=index)
        await self.ctx.acl.resolve_token(secret)  # not found / expired: PERMISSION_DENIED
        token = await acl_reads.token_by_secret(self.ctx.db, secret)
        if token is None:  # deleted since it was cached
            raise PermissionDenied("ACL token not found")
        return acl_pb2.ACLTokenResponse(token=token, index=index)

    # ---------------------------------------------------- one-time tokens

    async def UpsertOneTimeToken(
        self, request: acl_pb2.ACLUpsertOneTimeTokenRequest, context: Context
    ) -> acl_pb2.ACLOneTimeTokenResponse:
        secret = acl.token_from_metadata(context.invocation_metadata())
        if not secret:
            raise PermissionDenied(
                "Permission denied: a one-time token stands for the caller's own ACL token, "
                "and the request carries none"
            )
        async with self.ctx.write() as tx:
            ott = await one_time_tokens.upsert(tx, secret)
        return acl_pb2.ACLOneTimeTokenResponse(one_time_token=ott, index=tx.index)

    async def ExchangeOneTimeToken(
        self, request: acl_pb2.ACLExchangeOneTimeTokenRequest, context: Context
    ) -> acl_pb2.ACLTokenResponse:
        if not request.one_time_secret_id:
            raise InvalidArgument("one_time_secret_id", "is required")
        if len(request.one_time_secret_id) > acl_writes.MAX_ACCESSOR_ID:
            raise PermissionDenied(one_time_tokens.NOT_EXCHANGEABLE)
        async with self.ctx.write() as tx:
            token = await one_time_tokens.exchange(tx, request.one_time_secret_id)
        await acl_reads.link_roles(self.ctx.db, [token])
        return acl_pb2.ACLTokenResponse(token=token, index=tx.index)

    async def ResolveToken(
        self, request: acl_pb2.ACLResolveTokenRequest, context: Context
    ) -> acl_pb2.ACLResolveTokenResponse:
        resolved = await self.ctx.acl.resolve_token(request.secret_id)
        return resolved.response


def register(server: GrpcServer, ctx: StateContext, settings: ACLSettings) -> None:
    server.add(
        acl_pb2_grpc.add_ACLServicer_to_server,
        ACLServicer(ctx, settings),
        acl_pb2.DESCRIPTOR.services_by_name["ACL"].full_name,
    )
