"""Nomad's list order and the job routes of Nomad 1.9 over HTTP (issue 31):
the gateway app served in this process over a real state with ACLs.

* evaluations, allocations and deployments list in creation order, as
  Nomad's (`<CreateIndex>.<ID>` tokens, `reverse`, ID order with a prefix),
  every page reached by the previous page's token, filtered or not;
* job version tags: apply, a name unique per job, unset, shown in the
  versions, new versions untagged, `tag-job-version` enough to tag;
* `/v1/jobs/statuses`: Nomad's shapes, order, pages, the jobs a POST names,
  and its blocking query woken only by what its page shows;
* `/v1/job/:id/dispatch/payload` and `/v1/system/reconcile/summaries`."""

from __future__ import annotations

import asyncio
import base64
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from cli.main import main
from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.apitypes.check import check
from tests.callers import bootstrap_tokens, user_channel
from tests.integration.state_api import gateway

ACL_ENABLED = True

POLICIES = {
    "reader": 'namespace "*" { policy = "read" }',
    "tagger": 'namespace "default" { capabilities = ["read-job", "tag-job-version"] }',
}


class Http(gateway.Http):
    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, parsed, _ = self.call(method, path, body, **kw)
        assert status == 200, (status, parsed)
        return parsed

    def pages(self, path: str, **params: str) -> tuple[list[dict[str, Any]], list[str]]:
        """Every page of a list by the previous page's token: the items in
        order and the tokens given."""
        items: list[dict[str, Any]] = []
        tokens: list[str] = []
        token = ""
        while True:
            query: dict[str, Any] = {**params, **({"next_token": token} if token else {})}
            status, page, headers = self.call("GET", path, **query)
            assert status == 200, page
            items.extend(page)
            token = headers.get("x-nomad-nexttoken", "")
            if not token:
                return items, tokens
            tokens.append(token)


@pytest.fixture(scope="module")
async def mgmt(state_app: StateApp, http_tokens: dict[str, str]) -> AsyncIterator[grpc.aio.Channel]:
    ch = user_channel(state_app.server.bound_address, http_tokens["management"])
    yield ch
    await ch.close()


@pytest.fixture(scope="module")
async def http_tokens(state_app: StateApp) -> AsyncIterator[dict[str, str]]:
    address = state_app.server.bound_address
    channels: list[grpc.aio.Channel] = []

    def channel(token: str) -> grpc.aio.Channel:
        channels.append(user_channel(address, token))
        return channels[-1]

    tokens: dict[str, str] = {}
    await bootstrap_tokens(channel, POLICIES, tokens)
    yield tokens
    for ch in channels:
        await ch.close()


@pytest.fixture(scope="module")
async def http(state_app: StateApp, http_tokens: dict[str, str]) -> AsyncIterator[Http]:
    async with gateway.served_gateway(state_app.server.bound_address) as url:
        yield Http(url, http_tokens)


def _spec(job_id: str, *, env: str = "1", namespace: str = "default") -> pb.Job:
    j = mock.batch_job(job_id=job_id, count=2)
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        j.ClearField(name)  # type: ignore[arg-type]
    j.namespace = namespace
    j.task_groups[0].tasks[0].env["V"] = env
    return j


async def _register(channel: grpc.aio.Channel, job: pb.Job) -> job_pb2.JobRegisterResponse:
    resp: job_pb2.JobRegisterResponse = await job_pb2_grpc.JobStub(channel).Register(
        job_pb2.JobRegisterRequest(job=job)
    )
    return resp


# -- list order ------------------------------------------------------------

#: ids whose order is the reverse of their creation (the first written has
#: the largest id); the last two are written at one index
ORDER_IDS = [f"{9 - i}0000000-0000-4000-8000-00000000000{i}" for i in range(6)]
NS = "paging"


@pytest.fixture(scope="module")
async def seeded_lists(state_app: StateApp) -> list[str]:
    """One eval, alloc and deployment per id of ORDER_IDS in the namespace
    `paging` (nobody else writes there), each id's at its own index but the
    last two's at one."""
    job = _spec("ordered", namespace=NS)
    node = mock.node()
    batches = [ORDER_IDS[:1], ORDER_IDS[1:2], ORDER_IDS[2:3], ORDER_IDS[3:4], ORDER_IDS[4:]]
    for ids in batches:
        async with state_app.db.write() as tx:
            for i in ids:
                ev = mock.eval_for(job)
                ev.id = i
                tx.put_eval(ev)
                a = mock.alloc(job, node, eval_id=i)
                a.id = i
                tx.put_alloc(a)
                tx.put_deployment(
                    pb.Deployment(id=i, namespace=NS, job_id=job.id, status="successful")
                )
    return ORDER_IDS


def _created(items: list[dict[str, Any]]) -> list[str]:
    return [i["ID"] for i in sorted(items, key=lambda i: (i["CreateIndex"], i["ID"]))]


@pytest.mark.parametrize("path", ["/v1/evaluations", "/v1/allocations", "/v1/deployments"])
async def test_lists_page_in_creation_order_with_nomads_tokens(
    http: Http, seeded_lists: list[str], path: str
) -> None:
    def work() -> None:
        whole = http.ok("GET", path, namespace=NS)
        assert len(whole) == len(seeded_lists)
        order = _created(whole)
        assert [i["ID"] for i in whole] == order
        # the first written has the largest id: not ID order
        assert order[0] == max(seeded_lists) and order != sorted(order)
        index = {i["ID"]: i["CreateIndex"] for i in whole}
        # the last two share an index: ID order between them
        assert index[order[-1]] == index[order[-2]] and order[-2] < order[-1]

        items, tokens = http.pages(path, namespace=NS, per_page="2")
        assert [i["ID"] for i in items] == order
        assert tokens == [f"{index[order[2]]}.{order[2]}", f"{index[order[4]]}.{order[4]}"]

        items, tokens = http.pages(path, namespace=NS, per_page="4", reverse="true")
        assert [i["ID"] for i in items] == order[::-1]
        assert tokens == [f"{index[order[1]]}.{order[1]}"]

        # filtered by the gateway, paged in the same order with the same tokens
        expr = 'ID != "' + order[0] + '"'
        items, tokens = http.pages(path, namespace=NS, per_page="2", filter=expr)
        assert [i["ID"] for i in items] == order[1:]
        assert tokens == [f"{index[order[3]]}.{order[3]}", f"{index[order[5]]}.{order[5]}"]
        items, _ = http.pages(path, namespace=NS, per_page="2", filter=expr, reverse="true")
        assert [i["ID"] for i in items] == order[1:][::-1]

    await asyncio.to_thread(work)


async def test_a_prefix_lists_in_id_order(http: Http, seeded_lists: list[str]) -> None:
    def work() -> None:
        for path in ("/v1/evaluations", "/v1/allocations", "/v1/deployments"):
            # every seeded id starts with a digit: a prefix of each
            for prefix in {i[0] for i in seeded_lists}:
                got = http.ok("GET", path, namespace=NS, prefix=prefix)
                assert [i["ID"] for i in got] == sorted(
                    i for i in seeded_lists if i.startswith(prefix)
                )
            items, tokens = http.pages(path, namespace=NS, per_page="1", prefix="8")
            assert [i["ID"] for i in items] == [ORDER_IDS[1]] and tokens == []

    await asyncio.to_thread(work)


# -- version tags ----------------------------------------------------------


async def test_version_tags(http: Http, mgmt: grpc.aio.Channel) -> None:
    for env in ("1", "2", "3"):
        await _register(mgmt, _spec("tagged", env=env))

    def tags() -> dict[int, Any]:
        versions = http.ok("GET", "/v1/job/tagged/versions")["Versions"]
        return {v["Version"]: v["VersionTag"] for v in versions}

    def work() -> None:
        assert tags() == {0: None, 1: None, 2: None}
        body = {"Version": 1, "Description": "the one that worked"}
        made = http.ok("PUT", "/v1/job/tagged/versions/golden/tag", body)
        assert made["Name"] == "golden" and made["Description"] == "the one that worked"
        assert made["TaggedTime"] > 0 and made["Index"] > 0
        tag = tags()[1]
        assert tag == {
            "Name": "golden",
            "Description": "the one that worked",
            "TaggedTime": made["TaggedTime"],
        }
        assert not check(tag, "JobVersionTag")
        # the name is the job's: not on another version
        status, err, _ = http.call("PUT", "/v1/job/tagged/versions/golden/tag", {"Version": 2})
        assert status == 400 and "already exists on a different version (1)" in str(err)
        assert tags()[2] is None
        # the same name on the same version: a new description
        http.ok("POST", "/v1/job/tagged/versions/golden/tag", {"Version": 1, "Description": "d2"})
        assert tags()[1]["Description"] == "d2"
        # Latest: the current version, shown on the job too
        http.ok("PUT", "/v1/job/tagged/versions/newest/tag", {"Latest": True})
        assert tags()[2]["Name"] == "newest"
        assert http.ok("GET", "/v1/job/tagged")["VersionTag"]["Name"] == "newest"
        status, err, _ = http.call(
            "PUT", "/v1/job/tagged/versions/x/tag", {"Latest": True, "Version": 1}
        )
        assert status == 400 and "must be zero when tagging latest" in str(err)
        status, err, _ = http.call("PUT", "/v1/job/tagged/versions/x/tag", {"Version": 9})
        assert status == 404 and "version 9 not found" in str(err)
        status, _, _ = http.call("PUT", "/v1/job/nope/versions/x/tag", {"Version": 0})
        assert status == 404
        # unset
        gone = http.ok("DELETE", "/v1/job/tagged/versions/golden/tag")
        assert gone["Name"] == "" and gone["Index"] > made["Index"]
        assert tags()[1] is None
        status, err, _ = http.call("DELETE", "/v1/job/tagged/versions/golden/tag")
        assert status == 404 and "not found" in str(err)
        # the read-only token may not tag; one holding tag-job-version may
        status, _, _ = http.call(
            "PUT", "/v1/job/tagged/versions/r/tag", {"Version": 0}, who="reader"
        )
        assert status == 403
        http.ok("PUT", "/v1/job/tagged/versions/t/tag", {"Version": 0}, who="tagger")
        assert tags()[0]["Name"] == "t"
        http.ok("DELETE", "/v1/job/tagged/versions/t/tag", who="tagger")
        # a wrong method on the tag path
        status, _, _ = http.call("GET", "/v1/job/tagged/versions/t/tag")
        assert status == 405

    await asyncio.to_thread(work)
    # a new version is untagged; the tag stays with the version it names
    await _register(mgmt, _spec("tagged", env="4"))
    # a revert copies version 2's spec (tagged "newest") without its tag
    await job_pb2_grpc.JobStub(mgmt).Revert(job_pb2.JobRevertRequest(job_id="tagged", version=2))

    def after() -> None:
        now = tags()
        assert now[2]["Name"] == "newest" and now[3] is None and now[4] is None
        assert http.ok("GET", "/v1/job/tagged")["VersionTag"] is None
        # a re-registration of an unchanged spec is no new version
        assert max(now) == 4

    await asyncio.to_thread(after)


# -- dispatch/payload --------------------------------------------------------


async def test_dispatch_payload_takes_the_body_as_it_is(http: Http, mgmt: grpc.aio.Channel) -> None:
    parent = _spec("takes-payload")
    parent.parameterized.CopyFrom(pb.ParameterizedConfig(payload="optional"))
    await _register(mgmt, parent)
    raw = b"\x00binary\xffpayload\n"

    def work() -> None:
        out = http.ok("POST", "/v1/job/takes-payload/dispatch/payload", raw=raw)
        assert not check(out, "JobDispatchResponse")
        child = http.ok("GET", "/v1/job/" + urllib.parse.quote(out["DispatchedJobID"]))
        assert base64.b64decode(child["Payload"]) == raw
        assert child["Meta"] == {"owner": "armon"}  # the parent's, no dispatch meta
        status, _, _ = http.call("GET", "/v1/job/takes-payload/dispatch/payload")
        assert status == 405
        status, err, _ = http.call("PUT", "/v1/job/tagged/dispatch/payload", raw=b"x")
        assert status == 400 and "parameterized" in str(err)

    await asyncio.to_thread(work)


# -- /v1/jobs/statuses -----------------------------------------------------


@pytest.fixture(scope="module")
async def statuses_jobs(state_app: StateApp, mgmt: grpc.aio.Channel) -> list[str]:
    """Three jobs of the namespace `other`, registered one after another;
    the first has an alloc (a healthy canary) and a deployment."""
    ids = ["st-a", "st-b", "st-c"]
    for i in ids:
        await _register(mgmt, _spec(i, namespace="other"))
    async with state_app.db.write() as tx:
        job = await tx.get_job("other", "st-a")
        assert job is not None
        a = mock.alloc(job, mock.node())
        a.deployment_status.canary = True
        a.deployment_status.healthy = True
        tx.put_alloc(a)
        d = pb.Deployment(
            id="d0000000-0000-4000-8000-000000000000",
            namespace="other",
            job_id="st-a",
            job_version=0,
            status="running",
        )
        d.task_groups["web"].desired_canaries = 1
        tx.put_deployment(d)
    return ids


async def test_statuses_answer_nomads_shapes_newest_change_first(
    http: Http, statuses_jobs: list[str]
) -> None:
    def work() -> None:
        listed = http.ok("GET", "/v1/jobs/statuses", namespace="other")
        assert not check(listed, "[]JobStatusesJob")
        # st-a changed last (its status, once its alloc was written)
        modify = [j["ModifyIndex"] for j in listed]
        assert modify == sorted(modify, reverse=True)
        assert {j["ID"] for j in listed} == set(statuses_jobs)
        a = next(j for j in listed if j["ID"] == "st-a")
        assert a["GroupCountSum"] == 2 and a["Namespace"] == "other" and a["Type"] == "batch"
        assert a["ChildStatuses"] is None and a["ParentID"] == ""
        [alloc] = a["Allocs"]
        assert alloc["DeploymentStatus"] == {"Canary": True, "Healthy": True}
        assert alloc["Group"] == "web" and alloc["JobVersion"] == 0
        latest = a["LatestDeployment"]
        assert latest["IsActive"] and latest["RequiresPromotion"]
        assert not latest["AllAutoPromote"]
        b = next(j for j in listed if j["ID"] == "st-b")
        assert b["Allocs"] is None and b["LatestDeployment"] is None

        # pages of one by the modify index token; reverse: oldest first
        items, tokens = http.pages("/v1/jobs/statuses", namespace="other", per_page="1")
        assert [j["ID"] for j in items] == [j["ID"] for j in listed]
        assert tokens == [str(j["ModifyIndex"]) for j in listed[1:]]
        items, _ = http.pages("/v1/jobs/statuses", namespace="other", per_page="2", reverse="true")
        assert [j["ID"] for j in items] == [j["ID"] for j in listed][::-1]
        # filtered, then paged the same way
        items, tokens = http.pages(
            "/v1/jobs/statuses", namespace="other", per_page="1", filter='ID != "st-b"'
        )
        assert [j["ID"] for j in items] == [j["ID"] for j in listed if j["ID"] != "st-b"]

        # POST: only the jobs named (their namespace given in each)
        body = {"Jobs": [{"ID": i, "Namespace": "other"} for i in ("st-c", "st-a")]}
        named = http.ok("POST", "/v1/jobs/statuses", body)
        assert [j["ID"] for j in named] == [j["ID"] for j in listed if j["ID"] != "st-b"]
        status, err, _ = http.call("POST", "/v1/jobs/statuses", {"Jobs": []})
        assert status == 400 and "no jobs in request" in str(err)
        # the reader reads them; a token without read-job there reads nothing
        assert http.ok("GET", "/v1/jobs/statuses", namespace="*", who="reader")
        status, _, _ = http.call(
            "POST",
            "/v1/jobs/statuses",
            {"Jobs": [{"ID": "st-a", "Namespace": "other"}]},
            who="tagger",
        )
        assert status == 403

    await asyncio.to_thread(work)


async def test_statuses_blocking_query_wakes_on_its_page_only(
    http: Http, state_app: StateApp, statuses_jobs: list[str]
) -> None:
    def first_page() -> tuple[list[dict[str, Any]], int]:
        status, page, headers = http.call(
            "GET", "/v1/jobs/statuses", namespace="other", per_page="1"
        )
        assert status == 200
        return page, int(headers["x-nomad-index"])

    page, index = await asyncio.to_thread(first_page)
    on_page = page[0]["ID"]
    off_page = next(i for i in statuses_jobs if i != on_page)
    # the page's index is its own newest change: a change off the page does
    # not wake the query, which ends when its wait does
    async with state_app.db.write() as tx:
        job = await tx.get_job("other", off_page)
        assert job is not None
        tx.put_alloc(mock.alloc(job, mock.node()))

    def blocked(wait: str) -> tuple[list[dict[str, Any]], int]:
        status, page, headers = http.call(
            "GET", "/v1/jobs/statuses", namespace="other", per_page="1",
            index=str(index), wait=wait,
        )  # fmt: skip
        assert status == 200
        return page, int(headers["x-nomad-index"])

    page, same = await asyncio.to_thread(blocked, "1s")
    assert same == index and page[0]["ID"] == on_page
    # a change of the job on the page does
    waiting = asyncio.create_task(asyncio.to_thread(blocked, "60s"))
    async with state_app.db.write() as tx:
        job = await tx.get_job("other", on_page)
        assert job is not None
        tx.put_alloc(mock.alloc(job, mock.node(), client_status="failed"))
        written = tx.index
    page, woken = await asyncio.wait_for(waiting, 30)
    assert woken >= written > index


# -- reconcile summaries ---------------------------------------------------


async def test_reconcile_summaries_rewrites_what_differs(
    http: Http, state_app: StateApp, mgmt: grpc.aio.Channel
) -> None:
    await _register(mgmt, _spec("summed"))
    async with state_app.db.write() as tx:
        job = await tx.get_job("default", "summed")
        assert job is not None
        ev = mock.eval_for(job, status="blocked")
        ev.queued_allocations["web"] = 2
        tx.put_eval(ev)
    async with state_app.db.write() as tx:
        # gone wrong: a group the job does not have, a count it did not queue
        wrong = pb.JobSummary(job_id="summed", namespace="default")
        wrong.summary["web"].queued = 7
        wrong.summary["gone"].running = 3
        tx.put_job_summary(wrong)

    def work() -> None:
        status, _, _ = http.call("PUT", "/v1/system/reconcile/summaries", who="reader")
        assert status == 403
        status, body, headers = http.call("PUT", "/v1/system/reconcile/summaries")
        assert status == 200 and body is None and int(headers["x-nomad-index"]) > 0
        summary = http.ok(
            "GET", "/v1/job/summed/summary", index=str(int(headers["x-nomad-index"]) - 1)
        )
        assert set(summary["Summary"]) == {"web"} and summary["Summary"]["web"]["Queued"] == 2
        status, _, headers = http.call("PUT", "/v1/system/reconcile/summaries")
        assert status == 200 and "x-nomad-index" not in headers  # nothing differed

    await asyncio.to_thread(work)
    async with state_app.db.write() as tx:
        stored = await tx.get_job_summary("default", "summed")
    assert stored is not None and dict(stored.summary) == {"web": pb.TaskGroupSummary(queued=2)}


# -- the CLI ---------------------------------------------------------------


async def test_job_tag_cli_history_and_revert_by_name(
    state_app: StateApp,
    http_tokens: dict[str, str],
    mgmt: grpc.aio.Channel,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for env in ("1", "2"):
        await _register(mgmt, _spec("cli-tagged", env=env))
    where = ["-address", state_app.server.bound_address, "-token", http_tokens["management"]]

    async def cli(*argv: str, words: int = 3) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, [*argv[:words], *where, *argv[words:]])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = await cli(
        "job", "tag", "apply", "-name", "first", "-description", "it worked", "-version", "0",
        "cli-tagged",
    )  # fmt: skip
    assert code == 0, err
    assert out == 'Job version 0 tagged with name "first"\n'
    code, out, err = await cli("job", "tag", "apply", "-name", "now", "cli-tagged")
    assert (code, out) == (0, 'Job version 1 tagged with name "now"\n'), err
    code, _, err = await cli("job", "tag", "apply", "-name", "first", "cli-tagged")
    assert code == 1 and "already exists on a different version (0)" in err
    code, _, err = await cli("job", "tag", "apply", "cli-tagged")
    assert code == 1 and "A version tag name is required" in err

    code, out, err = await cli("job", "history", "cli-tagged", words=2)
    assert code == 0, err
    first = out.split("\n\n")[-1]  # newest first: version 0 last
    assert "Tag Name        = first" in first and "Tag Description = it worked" in first

    code, out, err = await cli("job", "revert", "-detach", "cli-tagged", "first", words=2)
    assert code == 0, err
    assert out.startswith('Job "cli-tagged" reverted to version 0 as version 2')
    code, _, err = await cli("job", "revert", "-detach", "cli-tagged", "nope", words=2)
    assert code == 1 and "version tag nope not found" in err

    code, out, err = await cli("job", "tag", "unset", "-name", "now", "cli-tagged")
    assert (code, out) == (0, 'Tag "now" removed from job "cli-tagged"\n'), err
    code, _, err = await cli("job", "tag", "unset", "-name", "now", "cli-tagged")
    assert code == 1 and "not found" in err


async def test_jobs_page_by_namespace_then_id(http: Http, statuses_jobs: list[str]) -> None:
    def work() -> None:
        items, tokens = http.pages("/v1/jobs", namespace="other", per_page="1", prefix="st-")
        assert [j["ID"] for j in items] == ["st-a", "st-b", "st-c"]
        assert tokens == ["other.st-b", "other.st-c"]
        # filtered by the gateway: the same order and tokens
        items, tokens = http.pages(
            "/v1/jobs", namespace="other", per_page="1", filter='ID != "st-a"'
        )
        assert [j["ID"] for j in items] == ["st-b", "st-c"] and tokens == ["other.st-c"]

    await asyncio.to_thread(work)
