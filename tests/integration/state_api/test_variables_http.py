"""Variables and the keyring over Nomad's HTTP API (issue 28): the gateway
app served in this process over a real state that enforces ACLs, driven by
python-nomad (a Nomad client nobody here wrote) and, for what it hides
(409 bodies, lock operations, headers), plain HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import jwt
import nomad
import nomad.api.exceptions
import pytest

from corral.testing import mock
from corral.v1 import acl_pb2, acl_pb2_grpc, job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from services.state.app import StateApp
from tests.callers import user_channel
from tests.integration.state_api import gateway

ACL_ENABLED = True
NODE_SECRET = "node-secret-http-vars-0123"


class Http(gateway.Http):
    def nomad(self, who: str = "management") -> nomad.Nomad:
        host, port = self.url.removeprefix("http://").split(":")
        token = self.tokens.get(who, who if "." in who else None)
        return nomad.Nomad(host=host, port=int(port), token=token, timeout=10)


@pytest.fixture(scope="module")
async def http(state_app: StateApp) -> AsyncIterator[Http]:
    address = state_app.server.bound_address
    anon = user_channel(address)
    boot = await acl_pb2_grpc.ACLStub(anon).Bootstrap(acl_pb2.ACLBootstrapRequest())
    tokens = {"management": boot.token.secret_id}
    mgmt = user_channel(address, boot.token.secret_id)
    acls = acl_pb2_grpc.ACLStub(mgmt)
    rules = {
        "app-rw": 'namespace "default" { variables { path "app/*" { capabilities = '
        '["read", "write", "list", "destroy"] } } }',
        "nothing": 'node { policy = "read" }',
    }
    await acls.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name=n, rules=r) for n, r in rules.items()]
        )
    )
    for name in rules:
        made = await acls.CreateToken(acl_pb2.ACLCreateTokenRequest(name=name, policies=[name]))
        tokens[name] = made.token.secret_id
    try:
        async with gateway.served_gateway(address) as url:
            yield Http(url, tokens)
    finally:
        await anon.close()
        await mgmt.close()


async def test_python_nomad_round_trip(http: Http) -> None:
    def work() -> None:
        n = http.nomad()
        made = n.variable.create_variable("app/db", {"Items": {"user": "u", "pass": "p"}})
        assert made["Path"] == "app/db" and made["Items"] == {"pass": "p", "user": "u"}
        assert made["Namespace"] == "default" and made["ModifyIndex"] > 0
        got = n.variable.get_variable("app/db")
        assert got["Items"] == {"pass": "p", "user": "u"} and "Lock" not in got
        listed = n.variables.get_variables(prefix="app/")
        assert [v["Path"] for v in listed] == ["app/db"] and "Items" not in listed[0]
        with pytest.raises(nomad.api.exceptions.VariableConflict):
            n.variable.create_variable("app/db", {"Items": {"x": "y"}}, cas=0)
        updated = n.variable.create_variable(
            "app/db", {"Items": {"x": "y"}}, cas=got["ModifyIndex"]
        )
        assert updated["Items"] == {"x": "y"}
        n.variable.delete_variable("app/db")
        with pytest.raises(nomad.api.exceptions.URLNotFoundNomadException):
            n.variable.get_variable("app/db")

    await asyncio.to_thread(work)


async def test_conflicts_answer_409_with_the_current_variable(http: Http) -> None:
    def work() -> None:
        status, made, headers = http.call("PUT", "/v1/var/app/cas", {"Items": {"a": "1"}})
        assert status == 200 and headers["x-nomad-index"] == str(made["ModifyIndex"])
        status, body, headers = http.call("PUT", "/v1/var/app/cas?cas=1", {"Items": {"a": "2"}})
        assert status == 409 and body["Items"] == {"a": "1"}
        assert body["ModifyIndex"] == made["ModifyIndex"]
        assert headers["x-nomad-index"] == str(made["ModifyIndex"])
        status, body, _ = http.call("DELETE", "/v1/var/app/cas?cas=1")
        assert status == 409 and body["Path"] == "app/cas"
        status, body, _ = http.call("DELETE", f"/v1/var/app/cas?cas={made['ModifyIndex']}")
        assert status == 204 and body is None
        assert http.call("GET", "/v1/var/app/cas")[0] == 404
        assert http.call("PUT", "/v1/var/app/empty", {"Items": {}})[:2] == (
            400,
            "variable missing required Items object",
        )
        assert http.call("PUT", "/v1/var/nomad", {"Items": {"a": "b"}})[0] == 400

    await asyncio.to_thread(work)


async def test_locks_over_http(http: Http) -> None:
    def work() -> None:
        status, held, _ = http.call(
            "PUT", "/v1/var/app/leader?lock-acquire", {"Lock": {"TTL": "20s"}}
        )
        assert status == 200 and held["Lock"]["TTL"] == "20s" and held["Lock"]["LockDelay"] == "15s"
        lock_id = held["Lock"]["ID"]
        status, _, _ = http.call("PUT", "/v1/var/app/leader?lock-acquire", {})
        assert status == 409
        status, meta, _ = http.call(
            "PUT", "/v1/var/app/leader?lock-renew", {"Lock": {"ID": lock_id}}
        )
        assert status == 200 and meta["Lock"]["ID"] == lock_id and "Items" not in meta
        status, body, _ = http.call(
            "PUT", "/v1/var/app/leader?lock-renew", {"Lock": {"ID": "not-the-holder"}}
        )
        assert status == 409 and "locked variable" in body
        assert http.call("PUT", "/v1/var/app/leader?lock-acquire&lock-release", {})[:2] == (
            400,
            "multiple lock operations",
        )
        assert http.call("PUT", "/v1/var/app/leader?lock-acquire&cas=3", {})[0] == 400
        status, released, _ = http.call(
            "PUT", "/v1/var/app/leader?lock-release", {"Lock": {"ID": lock_id}}
        )
        assert status == 200 and "Lock" not in released
        status, body, _ = http.call(
            "PUT", "/v1/var/app/leader?lock-release", {"Lock": {"ID": lock_id}}
        )
        assert status == 409 and "doesn't hold a lock" in body

    await asyncio.to_thread(work)


async def test_tokens_decide(http: Http) -> None:
    def work() -> None:
        assert http.call("PUT", "/v1/var/app/t", {"Items": {"a": "b"}}, who="app-rw")[0] == 200
        assert http.call("GET", "/v1/var/app/t", who="app-rw")[0] == 200
        assert http.call("GET", "/v1/var/app/t", who="nothing")[:2] == (403, "Permission denied")
        assert http.call("PUT", "/v1/var/app/t", {"Items": {"a": "c"}}, who="nothing")[0] == 403
        assert http.call("DELETE", "/v1/var/app/t", who="nothing")[0] == 403
        assert http.call("GET", "/v1/var/app/t", who="")[0] == 403
        assert http.call("PUT", "/v1/var/other/t", {"Items": {"a": "b"}}, who="app-rw")[0] == 403
        status, listed, _ = http.call("GET", "/v1/vars?namespace=*", who="nothing")
        assert status == 200 and listed == []
        assert http.call("GET", "/v1/operator/keyring/keys", who="app-rw")[0] == 403
        assert http.call("PUT", "/v1/operator/keyring/rotate", who="app-rw")[0] == 403

    await asyncio.to_thread(work)


async def test_filter_and_pages(http: Http) -> None:
    def work() -> None:
        for i in range(4):
            http.call("PUT", f"/v1/var/app/page/{i}", {"Items": {"i": str(i)}})
        status, page, headers = http.call("GET", "/v1/vars?prefix=app/page/&per_page=3")
        assert status == 200 and len(page) == 3
        assert headers["x-nomad-nexttoken"] == "default.app/page/3"
        status, rest, headers = http.call(
            "GET", "/v1/vars?prefix=app/page/&per_page=3&next_token=default.app/page/3"
        )
        assert [v["Path"] for v in rest] == ["app/page/3"] and "x-nomad-nexttoken" not in headers
        status, filtered, _ = http.call(
            "GET", "/v1/vars?filter=Path%20matches%20%22%5B02%5D%24%22&prefix=app/page/"
        )
        assert status == 200 and [v["Path"] for v in filtered] == ["app/page/0", "app/page/2"]

    await asyncio.to_thread(work)


async def test_keyring_and_jwks(http: Http, state_app: StateApp) -> None:
    # a task's identity, as the client gets it
    mgmt = user_channel(state_app.server.bound_address, http.tokens["management"])
    node = mock.node()
    node.secret_id = NODE_SECRET
    await node_pb2_grpc.NodeStub(mgmt).Register(node_pb2.NodeRegisterRequest(node=node))
    job = mock.job(job_id="jwks", count=1)
    await job_pb2_grpc.JobStub(mgmt).Register(job_pb2.JobRegisterRequest(job=job))
    async with state_app.db.write() as tx:
        stored = await tx.get_job("default", "jwks")
        assert stored is not None
        alloc = mock.alloc(stored, node)
        tx.put_alloc(alloc, "AllocationUpdated")
    await state_app.feed.wait_for_index(await state_app.db.latest_index(), 30)
    node_channel = user_channel(state_app.server.bound_address)
    task = job.task_groups[0].tasks[0].name
    signed = await node_pb2_grpc.NodeStub(node_channel).SignIdentities(
        node_pb2.NodeSignIdentitiesRequest(
            node_id=node.id,
            secret_id=NODE_SECRET,
            identities=[node_pb2.WorkloadIdentityRequest(alloc_id=alloc.id, task=task)],
        )
    )
    await node_channel.close()
    token = signed.signed[0].jwt
    await mgmt.close()

    def work() -> None:
        status, keys, _ = http.call("GET", "/v1/operator/keyring/keys")
        assert status == 200 and any(k["State"] == "active" for k in keys)
        assert set(keys[0]) == {
            "KeyID", "Algorithm", "CreateTime", "CreateIndex", "ModifyIndex", "State",
            "PublishTime",
        }  # fmt: skip
        status, jwks, headers = http.call("GET", "/.well-known/jwks.json", who="")
        assert status == 200 and int(headers["cache-control"].split("=")[1]) >= 900
        key = jwt.PyJWKSet.from_dict(jwks)[jwt.get_unverified_header(token)["kid"]]
        claims = jwt.decode(token, key.key, algorithms=["RS256"], audience="nomadproject.io")
        assert claims["nomad_job_id"] == "jwks" and claims["nomad_allocation_id"] == alloc.id
        # the task's JWT is a token of the HTTP API too
        status, got, _ = http.call("GET", "/v1/var/nomad/jobs/jwks", who=token)
        assert status == 404 and got == "variable not found"  # allowed, not there
        assert http.call("GET", "/v1/var/app/db", who=token)[0] == 403
        status, rotated, _ = http.call("PUT", "/v1/operator/keyring/rotate?full")
        assert status == 200 and rotated["Key"]["State"] == "active" and rotated["Index"] > 0
        status, keys, _ = http.call("GET", "/v1/operator/keyring/keys")
        states = [k["State"] for k in keys]
        assert states.count("active") == 1 and len(states) >= 2
        assert set(states) <= {"active", "rekeying", "inactive"}
        # the old key still verifies identities it signed
        assert http.call("GET", "/v1/var/nomad/jobs/jwks", who=token)[0] == 404
        status, body, _ = http.call("GET", "/.well-known/openid-configuration", who="")
        assert (status, body) == (404, "OIDC Discovery endpoint disabled")
        assert http.call("GET", "/v1/operator/keyring/key/x")[0] == 405
        status, body, _ = http.call("DELETE", "/v1/operator/keyring/key/no-such-key")
        assert status == 404

    await asyncio.to_thread(work)
