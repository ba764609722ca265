"""Two regions, real state services and databases (tests/integration/
federation/conftest.py): the regions learn each other; a call naming the
other region is forwarded with the caller's token and answered unchanged
(blocking queries and the event stream included); a job carries its
region; ACL policies, roles and global tokens replicate from the
authoritative region and writes of them are forwarded there; a region that goes away is
"No path to region" without retries, and forwarding resumes when it is
back."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest

from corral.devtools.pgserver import with_database
from corral.security import acl, transport
from corral.security.transport import FORWARDED_METADATA_KEY
from corral.testing import mock
from corral.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    event_pb2,
    event_pb2_grpc,
    federation_pb2,
    federation_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    query_pb2,
    state_pb2,
    state_pb2_grpc,
)
from services.state.app import StateApp
from services.state.call_limits import CallLimits
from tests.conftest import drop_database, new_database
from tests.integration.federation.conftest import (
    EAST,
    WEST,
    Regions,
    dial,
    free_port,
    metadata,
    region_settings,
)
from tests.wait import until

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
async def root(regions: Regions) -> str:
    """The bootstrap token: made in west (authoritative), global."""
    async with dial(regions.west_addr) as ch:
        resp = await acl_pb2_grpc.ACLStub(ch).Bootstrap(acl_pb2.ACLBootstrapRequest())
    return resp.token.secret_id


async def _regions(address: str) -> list[str]:
    async with dial(address) as ch:
        resp = await federation_pb2_grpc.FederationStub(ch).Regions(federation_pb2.RegionsRequest())
    return list(resp.regions)


async def test_each_region_learns_the_other(regions: Regions) -> None:
    # east was configured with west; west learns east from east's Hello
    async def west_knows_east() -> bool:
        return await _regions(regions.west_addr) == [EAST, WEST]

    await until(west_knows_east, what="west knows east")
    assert await _regions(regions.east_addr) == [EAST, WEST]


async def test_the_bootstrap_token_is_replicated_to_east(regions: Regions, root: str) -> None:
    async def works_in_east() -> bool:
        async with dial(regions.east_addr) as ch:
            try:
                await acl_pb2_grpc.ACLStub(ch).TokenSelf(
                    acl_pb2.ACLTokenSelfRequest(), metadata=metadata(root)
                )
            except grpc.aio.AioRpcError:
                return False
        return True

    await until(works_in_east, timeout=10, what="the bootstrap token working in east")


async def test_a_job_registered_through_west_for_east_runs_in_east_and_reads_back(
    regions: Regions, root: str
) -> None:
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)
    job = mock.job(count=1, job_id="fed-web")
    async with dial(regions.west_addr) as west:
        jobs = job_pb2_grpc.JobStub(west)
        resp = await jobs.Register(
            job_pb2.JobRegisterRequest(job=job), metadata=metadata(root, EAST)
        )
        assert resp.eval_id
        got = await jobs.Get(job_pb2.JobGetRequest(job_id="fed-web"), metadata=metadata(root, EAST))
        assert got.job.region == EAST
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await jobs.Get(job_pb2.JobGetRequest(job_id="fed-web"), metadata=metadata(root))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    async with dial(regions.east_addr) as east:
        direct = await job_pb2_grpc.JobStub(east).Get(
            job_pb2.JobGetRequest(job_id="fed-web"), metadata=metadata(root)
        )
    assert direct.job.region == EAST and direct.job.version == got.job.version


async def test_a_job_naming_another_region_is_refused_there(regions: Regions, root: str) -> None:
    job = mock.job(count=1, job_id="wrong-region")
    job.region = EAST
    async with dial(regions.west_addr) as west:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await job_pb2_grpc.JobStub(west).Register(
                job_pb2.JobRegisterRequest(job=job), metadata=metadata(root)
            )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "job region 'east' is not this region ('west')" in (err.value.details() or "")


async def test_a_blocking_query_of_east_through_west(regions: Regions, root: str) -> None:
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)
    async with dial(regions.west_addr) as west:
        jobs = job_pb2_grpc.JobStub(west)
        first = await jobs.List(
            job_pb2.JobListRequest(query=query_pb2.QueryOptions(namespace="*")),
            metadata=metadata(root, EAST),
        )
        blocked = asyncio.ensure_future(
            jobs.List(
                job_pb2.JobListRequest(
                    query=query_pb2.QueryOptions(
                        namespace="*", min_index=first.meta.index, wait_ms=20_000
                    )
                ),
                metadata=metadata(root, EAST),
                timeout=30,
            )
        )
        await asyncio.sleep(0.3)
        assert not blocked.done()  # it waits on east's index
        async with dial(regions.east_addr) as east:
            await job_pb2_grpc.JobStub(east).Register(
                job_pb2.JobRegisterRequest(job=mock.job(count=1, job_id="blocking-wakes")),
                metadata=metadata(root),
            )
        answer = await asyncio.wait_for(blocked, 15)
    assert answer.meta.index > first.meta.index
    assert "blocking-wakes" in {j.id for j in answer.jobs}


async def test_forwarded_waiting_calls_count_against_the_callers_connection(
    regions: Regions, root: str
) -> None:
    """A forwarded blocking query holds a coroutine on west as a local one
    does: the caller's connection's bound applies (here 1), so no one
    caller can use up west's single connection to east for every caller."""
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)
    fed = regions.west.federation
    saved, fed.limits = fed.limits, CallLimits(per_connection=1)
    waiting = query_pb2.QueryOptions(namespace="*", min_index=1 << 40, wait_ms=20_000)
    try:
        async with dial(regions.west_addr) as west:
            jobs = job_pb2_grpc.JobStub(west)
            held = asyncio.ensure_future(
                jobs.List(
                    job_pb2.JobListRequest(query=waiting),
                    metadata=metadata(root, EAST),
                    timeout=30,
                )
            )

            limits = fed.limits
            await until(lambda: limits.held() == 1, what="the first call waiting on west")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await jobs.List(
                    job_pb2.JobListRequest(query=waiting),
                    metadata=metadata(root, EAST),
                    timeout=30,
                )
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "forwarded blocking query" in (err.value.details() or "")
            # a call that does not wait goes on
            await jobs.List(job_pb2.JobListRequest(), metadata=metadata(root, EAST))
            assert not held.done()
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await held
    finally:
        fed.limits = saved


async def test_the_event_stream_of_east_through_west(regions: Regions, root: str) -> None:
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)
    async with dial(regions.west_addr) as west:
        now = await job_pb2_grpc.JobStub(west).List(
            job_pb2.JobListRequest(), metadata=metadata(root, EAST)
        )
        stream = event_pb2_grpc.EventStub(west).Stream(
            event_pb2.EventStreamRequest(
                topics=[event_pb2.EventTopic(topic="Job", key="streamed")],
                from_index=now.meta.index,
            ),
            metadata=metadata(root, EAST),
        )
        async with dial(regions.east_addr) as east:
            await job_pb2_grpc.JobStub(east).Register(
                job_pb2.JobRegisterRequest(job=mock.job(count=1, job_id="streamed")),
                metadata=metadata(root),
            )
        seen = None
        async for batch in stream:
            if any(e.key == "streamed" for e in batch.events):
                seen = batch
                break
        stream.cancel()
    assert seen is not None


async def test_an_unknown_region_is_no_path(regions: Regions, root: str) -> None:
    async with dial(regions.west_addr) as west:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await job_pb2_grpc.JobStub(west).List(
                job_pb2.JobListRequest(), metadata=metadata(root, "mars")
            )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (err.value.details() or "").startswith("No path to region 'mars'")


async def test_forwarded_calls_are_not_forwarded_again_nor_internal_ones_at_all(
    regions: Regions, root: str
) -> None:
    async with dial(regions.west_addr) as west:
        jobs = job_pb2_grpc.JobStub(west)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await jobs.List(
                job_pb2.JobListRequest(),
                metadata=[*metadata(root, EAST), (FORWARDED_METADATA_KEY, "north")],
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "forwarded requests are not forwarded again" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await state_pb2_grpc.StateStub(west).GetIndex(
                state_pb2.GetIndexRequest(), metadata=metadata(root, EAST)
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "is not forwarded to region 'east'" in (err.value.details() or "")


async def test_token_replication_carries_the_secrets_hash_never_the_secret(
    regions: Regions, root: str
) -> None:
    # between regions' servers (the session's server token: a plaintext federation)
    async with transport.dial(regions.west_addr) as west:
        answer = await federation_pb2_grpc.FederationStub(west).ReplicateTokens(
            federation_pb2.ReplicationRequest(query=query_pb2.QueryOptions())
        )
    assert answer.tokens
    assert all(t.token.secret_id == "" for t in answer.tokens)
    assert acl.secret_hash(root) in {t.secret_hash for t in answer.tokens}
    assert root not in str(answer)


async def _policy(address: str, token: str, name: str) -> bool:
    async with dial(address) as ch:
        try:
            await acl_pb2_grpc.ACLStub(ch).GetPolicy(
                acl_pb2.ACLGetPolicyRequest(name=name), metadata=metadata(token)
            )
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            return False
    return True


async def _can_list_jobs(address: str, token: str) -> grpc.StatusCode:
    async with dial(address) as ch:
        try:
            await job_pb2_grpc.JobStub(ch).List(job_pb2.JobListRequest(), metadata=metadata(token))
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def test_global_tokens_and_policies_replicate_local_ones_do_not(
    regions: Regions, root: str
) -> None:
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)
    rules = 'namespace "default" { policy = "read" }'
    async with dial(regions.west_addr) as west:
        acl = acl_pb2_grpc.ACLStub(west)
        await acl.UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[acl_pb2.ACLPolicy(name="readers", rules=rules)]
            ),
            metadata=metadata(root),
        )
        started = time.monotonic()
        glob = await acl.CreateToken(
            acl_pb2.ACLCreateTokenRequest(name="g", policies=["readers"], is_global=True),
            metadata=metadata(root),
        )
        local = await acl.CreateToken(
            acl_pb2.ACLCreateTokenRequest(name="l", policies=["readers"]),
            metadata=metadata(root),
        )
    g, loc = glob.token.secret_id, local.token.secret_id
    assert await _can_list_jobs(regions.west_addr, loc) == grpc.StatusCode.OK

    async def global_works() -> bool:
        return await _can_list_jobs(regions.east_addr, g) == grpc.StatusCode.OK

    await until(global_works, timeout=10, what="the global token working in east")
    assert time.monotonic() - started < 10
    assert await _policy(regions.east_addr, root, "readers")
    assert await _can_list_jobs(regions.east_addr, loc) == grpc.StatusCode.PERMISSION_DENIED
    # the local token is not even known in east when forwarded there from west
    async with dial(regions.west_addr) as west:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await job_pb2_grpc.JobStub(west).List(
                job_pb2.JobListRequest(), metadata=metadata(loc, EAST)
            )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_policy_writes_in_east_go_to_the_authority(regions: Regions, root: str) -> None:
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)
    rules = 'node { policy = "read" }'
    async with dial(regions.east_addr) as east:
        await acl_pb2_grpc.ACLStub(east).UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[acl_pb2.ACLPolicy(name="from-east", rules=rules)]
            ),
            metadata=metadata(root),
        )
    # written in west, and replicated back to east
    assert await _policy(regions.west_addr, root, "from-east")
    await until(
        lambda: _policy(regions.east_addr, root, "from-east"),
        timeout=10,
        what="the policy replicated back to east",
    )
    async with dial(regions.east_addr) as east:
        await acl_pb2_grpc.ACLStub(east).DeletePolicies(
            acl_pb2.ACLDeletePoliciesRequest(names=["from-east"]), metadata=metadata(root)
        )
    assert not await _policy(regions.west_addr, root, "from-east")

    async def gone_in_east() -> bool:
        return not await _policy(regions.east_addr, root, "from-east")

    await until(gone_in_east, timeout=10, what="the deletion replicated to east")


async def _role(address: str, token: str, name: str) -> acl_pb2.ACLRole | None:
    async with dial(address) as ch:
        try:
            resp = await acl_pb2_grpc.ACLStub(ch).GetRoleByName(
                acl_pb2.ACLGetRoleByNameRequest(name=name), metadata=metadata(token)
            )
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            return None
    return resp.role


async def test_roles_are_the_authoritys_and_replicate_with_their_tokens(
    regions: Regions, root: str
) -> None:
    """A role written in east is written in west (forwarded) and copied
    back; a global token linking it works in east through the role; a
    change of the role in the authority reaches east's tokens."""
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)
    async with dial(regions.west_addr) as west:
        await acl_pb2_grpc.ACLStub(west).UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(
                policies=[
                    acl_pb2.ACLPolicy(
                        name="role-jobs", rules='namespace "default" { policy = "read" }'
                    ),
                    acl_pb2.ACLPolicy(name="role-nodes", rules='node { policy = "read" }'),
                ]
            ),
            metadata=metadata(root),
        )
    async with dial(regions.east_addr) as east:
        made = await acl_pb2_grpc.ACLStub(east).UpsertRoles(
            acl_pb2.ACLUpsertRolesRequest(
                roles=[acl_pb2.ACLRole(name="fed-role", policies=["role-jobs"])]
            ),
            metadata=metadata(root),
        )
    role = made.roles[0]
    west_role = await _role(regions.west_addr, root, "fed-role")
    assert west_role is not None and west_role.id == role.id
    async with dial(regions.west_addr) as west:
        token = await acl_pb2_grpc.ACLStub(west).CreateToken(
            acl_pb2.ACLCreateTokenRequest(
                name="by-role", is_global=True, roles=[acl_pb2.ACLTokenRoleLink(name="fed-role")]
            ),
            metadata=metadata(root),
        )
    secret = token.token.secret_id

    async def works_in_east() -> bool:
        return await _can_list_jobs(regions.east_addr, secret) == grpc.StatusCode.OK

    await until(works_in_east, timeout=10, what="the role's token working in east")
    east_role = await _role(regions.east_addr, root, "fed-role")
    assert east_role is not None and east_role.id == role.id

    async with dial(regions.west_addr) as west:
        await acl_pb2_grpc.ACLStub(west).UpsertRoles(
            acl_pb2.ACLUpsertRolesRequest(
                roles=[acl_pb2.ACLRole(id=role.id, name="fed-role", policies=["role-nodes"])]
            ),
            metadata=metadata(root),
        )

    async def denied_in_east() -> bool:
        return await _can_list_jobs(regions.east_addr, secret) == grpc.StatusCode.PERMISSION_DENIED

    await until(denied_in_east, timeout=40, what="the role's change reaching east")
    async with dial(regions.east_addr) as east:
        await acl_pb2_grpc.ACLStub(east).DeleteRoles(
            acl_pb2.ACLDeleteRolesRequest(ids=[role.id]), metadata=metadata(root)
        )
    assert await _role(regions.west_addr, root, "fed-role") is None

    async def gone_in_east() -> bool:
        return await _role(regions.east_addr, root, "fed-role") is None

    await until(gone_in_east, timeout=10, what="the role's deletion replicated to east")


async def test_status_shows_links_servers_and_replication(regions: Regions, root: str) -> None:
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)

    async def status() -> federation_pb2.FederationStatus:
        async with dial(regions.east_addr) as ch:
            return await federation_pb2_grpc.FederationStub(ch).Status(
                federation_pb2.FederationStatusRequest(), metadata=metadata(root)
            )

    async def replicating() -> federation_pb2.FederationStatus | None:
        s = await status()
        ok = s.acl_replication.status == "replicating" and s.acl_replication.last_success
        return s if ok else None

    s = await until(replicating, timeout=20, what="east's leader reporting replication")
    assert s.region == EAST and s.authoritative_region == WEST
    assert s.acl_replication.source_region == WEST and s.acl_replication.enabled
    [link] = s.links
    assert (link.region, link.status, link.source) == (WEST, "alive", "config")
    assert link.addresses == [regions.west_addr] and link.last_contact
    assert {(x.region, x.status) for x in s.servers} == {(EAST, "alive"), (WEST, "alive")}


async def test_a_region_joined_at_run_time_is_kept_and_forgotten_by_force_leave(
    regions: Regions, root: str, pg_dsn: str, pg_admin_dsn: str, pg_template: str
) -> None:
    """`server join` through one west state process: both regions learn
    each other, the link is kept in west's database (a second west state
    process over it knows north at once), and `force-leave` forgets it."""
    name = new_database(pg_admin_dsn, pg_template, "federation_north")
    north = StateApp(region_settings(with_database(pg_admin_dsn, name), "north", free_port()))
    west2 = StateApp(region_settings(pg_dsn, WEST, free_port()))
    await north.start()
    try:
        north_addr = north.server.bound_address
        async with dial(regions.west_addr) as ch:
            fed = federation_pb2_grpc.FederationStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:  # agent:write is needed
                await fed.Join(federation_pb2.FederationJoinRequest(addresses=[north_addr]))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            joined = await fed.Join(
                federation_pb2.FederationJoinRequest(addresses=[north_addr]),
                metadata=metadata(root),
            )
        assert (joined.joined, list(joined.regions), joined.error) == (1, ["north"], "")
        assert "north" in await _regions(regions.west_addr)

        async def north_knows_west() -> bool:
            return WEST in await _regions(north_addr)

        await until(north_knows_west, what="north learning west from west's probe")

        # kept in west's database: another west state process has it
        await west2.start()
        west2_addr = west2.server.bound_address

        async def west2_link() -> federation_pb2.RegionLink | None:
            async with dial(west2_addr) as ch:
                s = await federation_pb2_grpc.FederationStub(ch).Status(
                    federation_pb2.FederationStatusRequest(), metadata=metadata(root)
                )
            return next((link for link in s.links if link.region == "north"), None)

        link = await until(west2_link, what="the second west process knowing north")
        assert (link.source, link.addresses) == ("join", [north_addr])

        # forgotten (north stopped first: a running region probes its way back)
        await north.stop()
        async with dial(regions.west_addr) as ch:
            await federation_pb2_grpc.FederationStub(ch).ForceLeave(
                federation_pb2.FederationForceLeaveRequest(region="north"),
                metadata=metadata(root),
            )
        assert "north" not in await _regions(regions.west_addr)

        async def west2_forgot() -> bool:
            return "north" not in await _regions(west2_addr)

        await until(west2_forgot, what="the second west process forgetting north")
    finally:
        await west2.stop()
        await north.stop()
        drop_database(pg_admin_dsn, name)


async def test_hello_is_for_servers_only(regions: Regions) -> None:
    async with dial(regions.west_addr) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await federation_pb2_grpc.FederationStub(ch).Hello(
                federation_pb2.FederationHello(region="evil", addresses=["127.0.0.1:1"])
            )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "evil" not in await _regions(regions.west_addr)


async def test_east_going_away_is_no_path_and_forwarding_resumes(
    regions: Regions, root: str
) -> None:
    await test_the_bootstrap_token_is_replicated_to_east(regions, root)
    await regions.east.stop()
    async with dial(regions.west_addr) as west:
        jobs = job_pb2_grpc.JobStub(west)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await jobs.List(job_pb2.JobListRequest(), metadata=metadata(root, EAST))
        # the retry policy of the caller's channel does not try again
        assert time.monotonic() - started < 5
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (err.value.details() or "").startswith("No path to region 'east'")
        # west serves its own region all the while
        await jobs.List(job_pb2.JobListRequest(), metadata=metadata(root))
        await regions.restart_east()

        async def forwarded() -> bool:
            try:
                await jobs.List(job_pb2.JobListRequest(), metadata=metadata(root, EAST))
            except grpc.aio.AioRpcError:
                return False
            return True

        await until(forwarded, timeout=15, what="forwarding to east again")
