"""ACL roles against a real state service and PostgreSQL (Nomad's ACL
roles): create, update, list and delete; tokens linking roles by id or
name; a token's rights are its policies and its roles' policies as they
are at each call; bad input refused with the state unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from corral.v1 import acl_pb2, acl_pb2_grpc, node_pb2, node_pb2_grpc, query_pb2
from services.state.app import StateApp
from tests.callers import user_channel

NODE_READ = 'node { policy = "read" }'
READ_DEFAULT = 'namespace "default" { policy = "read" }'

#: the package's `state_app` enforces ACLs for this module (conftest.py)
ACL_ENABLED = True


@pytest.fixture(scope="module")
async def stub(state_app: StateApp) -> AsyncIterator[acl_pb2_grpc.ACLAsyncStub]:
    """The ACL API with the bootstrap (management) token; two policies."""
    address = state_app.server.bound_address
    async with user_channel(address) as anon:
        boot = await acl_pb2_grpc.ACLStub(anon).Bootstrap(acl_pb2.ACLBootstrapRequest())
    async with user_channel(address, boot.token.secret_id) as ch:
        s = acl_pb2_grpc.ACLStub(ch)
        await s.UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[
                    acl_pb2.ACLPolicy(name="nodes", rules=NODE_READ),
                    acl_pb2.ACLPolicy(name="readers", rules=READ_DEFAULT),
                ]
            )
        )
        yield s


async def _role(stub: acl_pb2_grpc.ACLAsyncStub, **kw: object) -> acl_pb2.ACLRole:
    resp = await stub.UpsertRoles(acl_pb2.ACLUpsertRolesRequest(roles=[acl_pb2.ACLRole(**kw)]))  # type: ignore[arg-type]
    role: acl_pb2.ACLRole = resp.roles[0]
    return role


async def _code(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code(), err.value.details() or ""


async def _rows(state_app: StateApp) -> tuple[int, int]:
    """The index and the number of roles: what a refused write must leave."""
    async with state_app.db.read() as conn:
        cur = await conn.execute("SELECT count(*) FROM acl_roles")
        row = await cur.fetchone()
    assert row is not None
    return await state_app.db.latest_index(), int(row[0])


async def test_roles_create_update_list_get_delete(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp
) -> None:
    created = await _role(
        stub, name="ops", description="operators", policies=["nodes", "nodes", "readers"]
    )
    assert created.id and created.name == "ops" and created.description == "operators"
    assert list(created.policies) == ["nodes", "readers"]  # repeats dropped, as Nomad
    assert created.create_index == created.modify_index > 0

    by_id = await stub.GetRole(acl_pb2.ACLGetRoleRequest(id=created.id))
    by_name = await stub.GetRoleByName(acl_pb2.ACLGetRoleByNameRequest(name="ops"))
    assert by_id.role == by_name.role == created
    assert by_id.meta.index == created.modify_index

    renamed = await _role(stub, id=created.id, name="operators", policies=["nodes"])
    assert renamed.id == created.id and renamed.name == "operators"
    assert renamed.create_index == created.create_index < renamed.modify_index
    assert list(renamed.policies) == ["nodes"] and renamed.description == ""

    # an update that changes nothing writes nothing
    before = await state_app.db.latest_index()
    same = await _role(stub, id=created.id, name="operators", policies=["nodes"])
    assert same == renamed and await state_app.db.latest_index() == before

    other = await _role(stub, name="readers-role", policies=["readers"])
    listed = await stub.ListRoles(acl_pb2.ACLListRolesRequest())
    assert {r.id for r in listed.roles} >= {created.id, other.id}
    assert listed.meta.index >= other.modify_index
    prefixed = await stub.ListRoles(
        acl_pb2.ACLListRolesRequest(query=query_pb2.QueryOptions(prefix=other.id[:8]))
    )
    assert [r.id for r in prefixed.roles] == [other.id]

    done = await stub.DeleteRoles(acl_pb2.ACLDeleteRolesRequest(ids=[created.id, other.id]))
    assert done.index > other.modify_index
    code, details = await _code(stub.GetRole(acl_pb2.ACLGetRoleRequest(id=created.id)))
    assert code == grpc.StatusCode.NOT_FOUND and "not found" in details


async def test_bad_roles_are_refused_and_nothing_is_written(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp
) -> None:
    taken = await _role(stub, name="taken", policies=["nodes"])
    before = await _rows(state_app)
    bad = [
        (acl_pb2.ACLRole(name="no policies"), "roles[0].name"),
        (acl_pb2.ACLRole(name="empty"), "at least one policy"),
        (acl_pb2.ACLRole(name="ghost", policies=["missing"]), "cannot find policy missing"),
        (acl_pb2.ACLRole(name="taken", policies=["nodes"]), "role with name taken already exists"),
        (
            acl_pb2.ACLRole(
                id="6a0a6e3c-0000-4000-8000-000000000000", name="x", policies=["nodes"]
            ),
            "cannot find role 6a0a6e3c",
        ),
        (acl_pb2.ACLRole(name="long", description="d" * 257, policies=["nodes"]), "256"),
    ]
    for role, words in bad:
        code, details = await _code(stub.UpsertRoles(acl_pb2.ACLUpsertRolesRequest(roles=[role])))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (role, details)
        assert words in details, (role, details)
    # renaming a role onto another's name
    other = await _role(stub, name="other", policies=["nodes"])
    before = await _rows(state_app)
    code, details = await _code(
        stub.UpsertRoles(
            acl_pb2.ACLUpsertRolesRequest(
                roles=[acl_pb2.ACLRole(id=other.id, name="taken", policies=["nodes"])]
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "already exists" in details
    # one bad role of two: neither is written
    code, _ = await _code(
        stub.UpsertRoles(
            acl_pb2.ACLUpsertRolesRequest(
                roles=[
                    acl_pb2.ACLRole(name="fine", policies=["nodes"]),
                    acl_pb2.ACLRole(name="bad", policies=["missing"]),
                ]
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, details = await _code(
        stub.DeleteRoles(acl_pb2.ACLDeleteRolesRequest(ids=[taken.id, "no-such-role"]))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "no-such-role" in details
    assert await _rows(state_app) == before
    await stub.DeleteRoles(acl_pb2.ACLDeleteRolesRequest(ids=[taken.id, other.id]))


async def test_a_token_holds_its_roles_policies_at_each_call(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp
) -> None:
    role = await _role(stub, name="node-readers", policies=["nodes"])
    created = await stub.CreateToken(
        acl_pb2.ACLCreateTokenRequest(
            name="by role", roles=[acl_pb2.ACLTokenRoleLink(name="node-readers")]
        )
    )
    token = created.token
    assert [(r.id, r.name) for r in token.roles] == [(role.id, "node-readers")]
    assert not token.policies
    got = await stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))
    assert [(r.id, r.name) for r in got.token.roles] == [(role.id, "node-readers")]

    address = state_app.server.bound_address
    async with user_channel(address, token.secret_id) as ch:
        nodes = node_pb2_grpc.NodeStub(ch)
        await nodes.List(node_pb2.NodeListRequest())  # the role's policy allows it
        resolved = await stub.ResolveToken(
            acl_pb2.ACLResolveTokenRequest(secret_id=token.secret_id)
        )
        assert [p.name for p in resolved.policies] == ["nodes"]
        # the token reads the policies and the role it holds through the role
        mine = acl_pb2_grpc.ACLStub(ch)
        assert (await mine.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="nodes"))).policy.rules
        listed = await mine.ListRoles(acl_pb2.ACLListRolesRequest())
        assert [r.id for r in listed.roles] == [role.id]
        assert (await mine.GetRole(acl_pb2.ACLGetRoleRequest(id=role.id))).role.name == role.name
        code, _ = await _code(mine.GetPolicy(acl_pb2.ACLGetPolicyRequest(name="readers")))
        assert code == grpc.StatusCode.PERMISSION_DENIED

        # the role changed: the next call sees it
        await _role(stub, id=role.id, name="node-readers", policies=["readers"])
        code, _ = await _code(nodes.List(node_pb2.NodeListRequest()))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        await _role(stub, id=role.id, name="renamed", policies=["nodes"])
        await nodes.List(node_pb2.NodeListRequest())
        got = await stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))
        assert [(r.id, r.name) for r in got.token.roles] == [(role.id, "renamed")]

        # the policy deleted: the role keeps naming it, and it grants nothing
        await stub.DeletePolicies(acl_pb2.ACLDeletePoliciesRequest(names=["nodes"]))
        kept = await stub.GetRole(acl_pb2.ACLGetRoleRequest(id=role.id))
        assert list(kept.role.policies) == ["nodes"]
        code, _ = await _code(nodes.List(node_pb2.NodeListRequest()))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        await stub.UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[acl_pb2.ACLPolicy(name="nodes", rules=NODE_READ)]
            )
        )
        await nodes.List(node_pb2.NodeListRequest())

        # the role deleted: it drops out of the token and its rights go
        await stub.DeleteRoles(acl_pb2.ACLDeleteRolesRequest(ids=[role.id]))
        code, _ = await _code(nodes.List(node_pb2.NodeListRequest()))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        got = await stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))
        assert not got.token.roles


async def test_token_role_links_by_id_name_and_refusals(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp
) -> None:
    a = await _role(stub, name="role-a", policies=["readers"])
    b = await _role(stub, name="role-b", policies=["nodes"])
    token = (
        await stub.CreateToken(
            acl_pb2.ACLCreateTokenRequest(
                policies=["readers"],
                roles=[
                    acl_pb2.ACLTokenRoleLink(id=a.id),
                    acl_pb2.ACLTokenRoleLink(name="role-a"),
                    acl_pb2.ACLTokenRoleLink(name="role-b"),
                ],
            )
        )
    ).token
    assert [(r.id, r.name) for r in token.roles] == [(a.id, "role-a"), (b.id, "role-b")]
    resolved = await stub.ResolveToken(acl_pb2.ACLResolveTokenRequest(secret_id=token.secret_id))
    assert sorted(p.name for p in resolved.policies) == ["nodes", "readers"]

    # update in place: links by name, replaced
    updated = await stub.UpdateToken(
        acl_pb2.ACLUpdateTokenRequest(
            accessor_id=token.accessor_id, roles=[acl_pb2.ACLTokenRoleLink(name="role-b")]
        )
    )
    assert [(r.id, r.name) for r in updated.token.roles] == [(b.id, "role-b")]
    assert not updated.token.policies

    before = await state_app.db.latest_index()
    refusals = [
        (
            acl_pb2.ACLCreateTokenRequest(roles=[acl_pb2.ACLTokenRoleLink(name="nope")]),
            "cannot find role nope",
        ),
        (
            acl_pb2.ACLCreateTokenRequest(roles=[acl_pb2.ACLTokenRoleLink(id="no-such-id")]),
            "cannot find role no-such-id",
        ),
        (acl_pb2.ACLCreateTokenRequest(roles=[acl_pb2.ACLTokenRoleLink()]), "roles[0]"),
        (
            acl_pb2.ACLCreateTokenRequest(
                type="management", roles=[acl_pb2.ACLTokenRoleLink(name="role-a")]
            ),
            "management token takes no roles",
        ),
        (acl_pb2.ACLCreateTokenRequest(), "at least one policy or role"),
    ]
    for req, words in refusals:
        code, details = await _code(stub.CreateToken(req))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (req, details)
        assert words in details, (req, details)
    code, details = await _code(
        stub.UpdateToken(
            acl_pb2.ACLUpdateTokenRequest(
                accessor_id=token.accessor_id, roles=[acl_pb2.ACLTokenRoleLink(name="nope")]
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "cannot find role nope" in details
    assert await state_app.db.latest_index() == before
    got = await stub.GetToken(acl_pb2.ACLGetTokenRequest(accessor_id=token.accessor_id))
    assert [r.id for r in got.token.roles] == [b.id]


async def test_a_client_token_cannot_write_roles_nor_read_others(
    stub: acl_pb2_grpc.ACLAsyncStub, state_app: StateApp
) -> None:
    held = await _role(stub, name="held", policies=["readers"])
    other = await _role(stub, name="not-held", policies=["nodes"])
    token = (
        await stub.CreateToken(
            acl_pb2.ACLCreateTokenRequest(roles=[acl_pb2.ACLTokenRoleLink(id=held.id)])
        )
    ).token
    before = await state_app.db.latest_index()
    async with user_channel(state_app.server.bound_address, token.secret_id) as ch:
        mine = acl_pb2_grpc.ACLStub(ch)
        for call in (
            mine.UpsertRoles(
                acl_pb2.ACLUpsertRolesRequest(
                    roles=[acl_pb2.ACLRole(id=held.id, name="held", policies=["nodes"])]
                )
            ),
            mine.DeleteRoles(acl_pb2.ACLDeleteRolesRequest(ids=[held.id])),
            mine.GetRole(acl_pb2.ACLGetRoleRequest(id=other.id)),
            mine.GetRoleByName(acl_pb2.ACLGetRoleByNameRequest(name="not-held")),
            mine.GetRole(acl_pb2.ACLGetRoleRequest(id="no-such-role")),
        ):
            code, details = await _code(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
        got = await mine.GetRoleByName(acl_pb2.ACLGetRoleByNameRequest(name="held"))
        assert got.role.id == held.id
        assert [r.id for r in (await mine.ListRoles(acl_pb2.ACLListRolesRequest())).roles] == [
            held.id
        ]
    async with user_channel(state_app.server.bound_address) as anon:
        # the anonymous token links no role: it lists none (as Nomad)
        listed = await acl_pb2_grpc.ACLStub(anon).ListRoles(acl_pb2.ACLListRolesRequest())
        assert not listed.roles
    assert await state_app.db.latest_index() == before
