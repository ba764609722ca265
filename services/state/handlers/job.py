"""The public `Job` service (proto/corral/v1/job.proto)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import grpc

from corral.domain import namespaces, periodic, structs, topics
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, DesiredStatus, copy_msg
from corral.runtime.server import GrpcServer
from corral.security import access, transport
from corral.v1 import job_pb2, job_pb2_grpc, query_pb2, state_pb2, worker_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state import job_statuses, query, stubs, validate
from services.state.app_context import StateContext
from services.state.writes.batch import Committed
from services.state.writes.deployments import revert_job
from services.state.writes.dispatch import dispatch_job
from services.state.writes.job_diff import job_diff
from services.state.writes.job_tags import tag_version, untag_version
from services.state.writes.jobs import (
    MAX_GROUP_COUNT,
    canonicalize,
    deregister_job,
    evaluate_job,
    register_job,
    scale_job,
    set_stability,
    validate_job,
)

Context = Any
JOB_TABLES = ("jobs",)


MAX_SCALE_MESSAGE = 4096
MAX_SCALE_META_BYTES = 64 * 1024


def scale_status(
    snap: StateSnapshot, job: pb.Job, meta: query_pb2.QueryMeta
) -> job_pb2.JobScaleStatusResponse:
    """Each group's desired count, its allocs that are not terminal (canaries
    left out, as Nomad does) by running and health, and its scaling events."""
    out = job_pb2.JobScaleStatusResponse(
        job_id=job.id,
        namespace=job.namespace,
        job_create_index=job.create_index,
        job_modify_index=job.modify_index,
        job_stopped=job.stop,
        meta=meta,
    )
    events = snap.scaling_events_by_job(job.namespace, job.id)
    for tg in job.task_groups:
        status = out.task_groups[tg.name]
        status.desired = tg.count
        if events is not None and tg.name in events.scaling_events:
            status.events.extend(events.scaling_events[tg.name].events)
    for a in snap.allocs_by_job(job.namespace, job.id):
        if a.deployment_status.canary or structs.alloc_terminal(a):
            continue
        if a.task_group not in out.task_groups:
            continue
        status = out.task_groups[a.task_group]
        status.placed += 1
        if a.client_status == ClientStatus.RUNNING:
            status.running += 1
        if a.deployment_status.HasField("healthy"):
            if a.deployment_status.healthy:
                status.healthy += 1
            else:
                status.unhealthy += 1
    return out


def _registered(
    done: Committed[tuple[pb.Job, pb.Evaluation | None]],
) -> job_pb2.JobRegisterResponse:
    """The answer to every write that registers a job version (Register,
    Scale, Revert): the version and, unless the job launches children
    itself, the eval created with it."""
    job, ev = done.value
    return job_pb2.JobRegisterResponse(
        eval_id=ev.id if ev else "",
        eval_create_index=done.index if ev else 0,
        job_modify_index=job.job_modify_index,
        index=done.index,
        version=job.version,
    )


SUBMISSION_FORMATS = ("hcl1", "hcl2", "json")


def _submission(
    request: job_pb2.JobRegisterRequest, limit: int
) -> tuple[pb.JobSubmission | None, str]:
    """The submission to keep with the version, and a warning when it is
    discarded for its size (the job is registered all the same, as Nomad's
    submissionController does)."""
    if not request.HasField("submission"):
        return None, ""
    sub = request.submission
    if sub.format not in SUBMISSION_FORMATS:
        raise InvalidArgument(
            "submission.format", f"must be one of {', '.join(SUBMISSION_FORMATS)}"
        )
    size = len(sub.source.encode()) + len(sub.variables.encode())
    size += sum(len(k.encode()) + len(v.encode()) for k, v in sub.variable_flags.items())
    if size > limit:
        return None, (
            f"job source size of {size} bytes exceeds maximum of {limit} bytes "
            "and will be discarded"
        )
    return sub, ""


def place_in_region(job: pb.Job, region: str) -> None:
    """A job runs in the region whose servers register it: empty or
    "global" becomes this region (as Nomad's agent does); another region's
    job is refused here, naming where to send it."""
    if job.region in ("", "global"):
        job.region = region
    elif job.region != region:
        raise FailedPrecondition(
            f"job region {job.region!r} is not this region ({region!r}): register the job "
            f"with region {job.region!r} (`corral job run` and the HTTP API forward it there; "
            f"a gRPC call carries x-corral-region: {job.region})"
        )


def _job_ref(job_id: str, namespace: str) -> None:
    """A job id and namespace a write will look up in the database."""
    validate.require_id(job_id, "job_id")
    validate.namespace(namespace, "namespace")


class JobServicer(job_pb2_grpc.JobServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    def _job(self, snap: StateSnapshot, job_id: str, namespace: str = "") -> pb.Job:
        if not job_id:
            raise InvalidArgument("job_id", "is required")
        job = snap.job_by_id(namespace or "default", job_id)
        if job is None:
            raise NotFound(f"job {job_id!r} not found")
        return job

    async def Register(
        self, request: job_pb2.JobRegisterRequest, context: Context
    ) -> job_pb2.JobRegisterResponse:
        if not request.HasField("job"):
            raise InvalidArgument("job", "is required")
        job = canonicalize(request.job)
        validate_job(job)
        place_in_region(job, self.ctx.region)
        if request.eval_priority and not (
            structs.MIN_PRIORITY <= request.eval_priority <= structs.MAX_PRIORITY
        ):
            raise InvalidArgument(
                "eval_priority",
                f"must be between {structs.MIN_PRIORITY} and {structs.MAX_PRIORITY} "
                "(0: the job's priority)",
            )
        submission, warning = _submission(request, self.ctx.job_max_source_size)
        done = await self.ctx.batcher.submit(
            lambda tx: register_job(
                tx,
                job,
                enforce_index=request.enforce_index,
                job_modify_index=request.job_modify_index,
                eval_priority=request.eval_priority,
                traceparent=request.traceparent,
                submission=submission,
            ),
            jobs=[(job.namespace, job.id)],
        )
        answer = _registered(done)
        answer.warnings = warning
        return answer

    async def GetSubmission(
        self, request: job_pb2.JobSubmissionRequest, context: Context
    ) -> job_pb2.JobSubmissionResponse:
        """The file a version was submitted with. The job (and its version)
        is resolved on this process's state at the query's index; the
        submission itself is read from the database, written in the same
        transaction as that version."""
        snap = await query.snapshot_for(self.ctx, request.query, JOB_TABLES)
        job = self._job(snap, request.job_id, request.query.namespace)
        version = request.version if request.HasField("version") else job.version
        sub = await self.ctx.db.job_submission(job.namespace, job.id, version)
        if sub is None:
            raise NotFound(f"job {job.id!r} version {version}: job source not found")
        return job_pb2.JobSubmissionResponse(submission=sub, meta=query.meta(snap, JOB_TABLES))

    async def Deregister(
        self, request: job_pb2.JobDeregisterRequest, context: Context
    ) -> job_pb2.JobDeregisterResponse:
        _job_ref(request.job_id, request.namespace)
        done = await self.ctx.batcher.submit(
            lambda tx: deregister_job(
                tx,
                request.namespace,
                request.job_id,
                purge=request.purge,
                traceparent=request.traceparent,
            )
        )
        job, ev = done.value
        return job_pb2.JobDeregisterResponse(
            eval_id=ev.id,
            eval_create_index=done.index,
            job_modify_index=job.job_modify_index,
            index=done.index,
        )

    async def Scale(
        self, request: job_pb2.JobScaleRequest, context: Context
    ) -> job_pb2.JobRegisterResponse:
        """Nomad's Job.Scale: scale-job or submit-job in the namespace."""
        namespace = request.namespace or "default"
        access.require_any_capability(namespace, (access.SCALE_JOB, access.SUBMIT_JOB))
        count = request.count if request.HasField("count") else None
        if count is not None and not 0 <= count <= MAX_GROUP_COUNT:
            raise InvalidArgument("count", f"must be between 0 and {MAX_GROUP_COUNT}")
        if count is not None and request.error:
            raise InvalidArgument("error", "a scaling event with error set takes no count")
        _job_ref(request.job_id, request.namespace)
        if not request.group:
            raise InvalidArgument("group", "missing task group name for scaling action")
        validate.name_length(request.group, "group")
        if len(request.message) > MAX_SCALE_MESSAGE:
            raise InvalidArgument("message", f"is longer than {MAX_SCALE_MESSAGE} characters")
        if request.meta.ByteSize() > MAX_SCALE_META_BYTES:
            raise InvalidArgument("meta", f"is larger than {MAX_SCALE_META_BYTES} bytes")
        validate.no_nul(request, "request")
        done = await self.ctx.batcher.submit(
            lambda tx: scale_job(
                tx,
                namespace,
                request.job_id,
                request.group,
                count,
                message=request.message,
                error=request.error,
                meta=request.meta if request.HasField("meta") else None,
                enforce_index=request.enforce_index,
                job_modify_index=request.job_modify_index,
            ),
            jobs=[(namespace, request.job_id)],
        )
        return _registered(done)

    async def ScaleStatus(
        self, request: job_pb2.JobGetRequest, context: Context
    ) -> job_pb2.JobScaleStatusResponse:
        """Nomad's Job.ScaleStatus: read-job or read-job-scaling."""
        namespace = request.query.namespace or "default"
        access.require_any_capability(namespace, (access.READ_JOB, access.READ_JOB_SCALING))
        tables = ("jobs", "allocs", "scaling_event")
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        job = self._job(snap, request.job_id, namespace)
        return scale_status(snap, job, query.meta(snap, tables))

    async def Revert(
        self, request: job_pb2.JobRevertRequest, context: Context
    ) -> job_pb2.JobRegisterResponse:
        _job_ref(request.job_id, request.namespace)
        namespace = request.namespace or "default"
        done = await self.ctx.batcher.submit(
            lambda tx: revert_job(
                tx,
                namespace,
                request.job_id,
                request.version,
                prior_version=request.prior_version if request.enforce_prior_version else None,
            ),
            jobs=[(namespace, request.job_id)],
        )
        return _registered(done)

    async def Evaluate(
        self, request: job_pb2.JobEvaluateRequest, context: Context
    ) -> job_pb2.JobRegisterResponse:
        _job_ref(request.job_id, request.namespace)
        namespace = request.namespace or "default"
        done = await self.ctx.batcher.submit(
            lambda tx: evaluate_job(
                tx, namespace, request.job_id, force_reschedule=request.force_reschedule
            ),
            jobs=[(namespace, request.job_id)],
        )
        job, ev = done.value
        return job_pb2.JobRegisterResponse(
            eval_id=ev.id,
            eval_create_index=done.index,
            job_modify_index=job.job_modify_index,
            index=done.index,
            version=job.version,
        )

    async def Stable(
        self, request: job_pb2.JobStableRequest, context: Context
    ) -> job_pb2.JobStableResponse:
        _job_ref(request.job_id, request.namespace)
        namespace = request.namespace or "default"
        done = await self.ctx.batcher.submit(
            lambda tx: set_stability(
                tx, namespace, request.job_id, request.version, request.stable
            ),
            jobs=[(namespace, request.job_id)],
        )
        return job_pb2.JobStableResponse(
            index=done.index, job_modify_index=done.value.job_modify_index
        )

    async def TagVersion(
        self, request: job_pb2.JobTagVersionRequest, context: Context
    ) -> job_pb2.JobTagVersionResponse:
        _job_ref(request.job_id, request.namespace)
        namespace = request.namespace or "default"
        r = request
        if r.unset:
            done = await self.ctx.batcher.submit(
                lambda tx: untag_version(tx, namespace, r.job_id, r.name),
                jobs=[(namespace, r.job_id)],
            )
            return job_pb2.JobTagVersionResponse(
                index=done.index, name=r.name, version=done.value.version
            )
        done = await self.ctx.batcher.submit(
            lambda tx: tag_version(
                tx,
                namespace,
                r.job_id,
                name=r.name,
                description=r.description,
                version=r.version,
                latest=r.latest,
            ),
            jobs=[(namespace, r.job_id)],
        )
        tag = done.value.version_tag
        return job_pb2.JobTagVersionResponse(
            index=done.index,
            name=tag.name,
            description=tag.description,
            tagged_time=tag.tagged_time,
            version=done.value.version,
        )

    async def Plan(
        self, request: job_pb2.JobPlanRequest, context: Context
    ) -> job_pb2.JobPlanResponse:
        """Dry run: forwarded to a live worker, which runs the scheduler on its
        snapshot without submitting (the state service holds no scheduler)."""
        if not request.HasField("job"):
            raise InvalidArgument("job", "is required")
        job = canonicalize(request.job)
        validate_job(job)
        place_in_region(job, self.ctx.region)
        snap = self.ctx.feed.snapshot()
        ns = snap.namespace_by_name(job.namespace)
        if ns is not None and not job.node_pool:
            job.node_pool = namespaces.default_pool(ns)
        found = namespaces.admission_problem(
            job, ns, snap.node_pool_by_name(job.node_pool) is not None
        )
        if found is not None:
            raise InvalidArgument(*found)
        members = await self.ctx.db.members(role="worker", max_age_s=30)
        last = ""
        for payload, _age in members:
            member = state_pb2.Member.FromString(payload)
            try:
                async with transport.dial(member.address) as ch:
                    resp: job_pb2.JobPlanResponse = await worker_pb2_grpc.WorkerStub(ch).PlanJob(
                        job_pb2.JobPlanRequest(job=job, diff=request.diff), timeout=60
                    )
                if periodic.is_active(job):
                    # Nomad's Job.Plan: when the next launch would be if submitted now
                    upcoming = periodic.next_launch(job.periodic, datetime.now(UTC))
                    resp.next_periodic_launch = periodic.to_unix_ns(upcoming) if upcoming else 0
                if request.diff:
                    current = self.ctx.feed.snapshot().job_by_id(job.namespace, job.id)
                    resp.diff.CopyFrom(
                        job_diff(None if current is None or current.stop else current, job)
                    )
                return resp
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument("job", exc.details() or "invalid job") from None
                last = f"{member.address}: {exc.details()}"
        raise Unavailable(
            f"no scheduler worker is running to plan the job{'; ' + last if last else ''}"
        )

    async def Get(self, request: job_pb2.JobGetRequest, context: Context) -> job_pb2.JobGetResponse:
        snap = await query.snapshot_for(self.ctx, request.query, JOB_TABLES)
        job = self._job(snap, request.job_id, request.query.namespace)
        return job_pb2.JobGetResponse(job=job, meta=query.meta(snap, JOB_TABLES))

    async def List(
        self, request: job_pb2.JobListRequest, context: Context
    ) -> job_pb2.JobListResponse:
        tables = ("jobs", "allocs")
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        jobs = [
            j
            for j in snap.iter_jobs()
            if query.namespace_matches(request.query, j.namespace, access.LIST_JOBS)
            and j.id.startswith(request.query.prefix)
        ]
        # Nomad's order and tokens: by namespace, then ID, `<namespace>.<id>`
        page, token = query.paginate(
            jobs, lambda j: f"{j.namespace or 'default'}.{j.id}", request.query
        )
        return job_pb2.JobListResponse(
            jobs=[stubs.job(snap, j) for j in page], meta=query.meta(snap, tables, token)
        )

    async def Statuses(
        self, request: job_pb2.JobStatusesRequest, context: Context
    ) -> job_pb2.JobStatusesResponse:
        if request.query.per_page < 0:
            raise InvalidArgument("query.per_page", "must not be negative")
        if len(request.jobs) > validate.MAX_BATCH:
            raise InvalidArgument("jobs", f"at most {validate.MAX_BATCH} jobs may be asked for")
        q = copy_msg(request.query)
        q.namespace = q.namespace or "default"
        spaces = {j.namespace or "default" for j in request.jobs}
        if len(spaces) == 1:
            # jobs of one namespace: that namespace's permission decides (Nomad)
            q.namespace = spaces.pop()
            access.require_namespace(q.namespace, access.READ_JOB)

        def shown(namespace: str) -> bool:
            return query.namespace_matches(q, namespace)

        first: set[job_statuses.Key] | None = None

        def compute(snap: StateSnapshot) -> tuple[job_pb2.JobStatusesResponse, int]:
            nonlocal first
            jobs, token, index, keys = job_statuses.page(snap, request, shown)
            if first is None:
                first = keys
            elif keys != first:
                # jobs came onto the page or left it: that is news too
                index = max(index, snap.table_index("jobs"))
            meta = query_pb2.QueryMeta(index=max(index, 1), next_token=token, known_leader=True)
            return job_pb2.JobStatusesResponse(jobs=jobs, meta=meta), index

        return await query.answer_when_newer(self.ctx, request.query, compute)

    async def Versions(
        self, request: job_pb2.JobVersionsRequest, context: Context
    ) -> job_pb2.JobVersionsResponse:
        snap = await query.snapshot_for(self.ctx, request.query, JOB_TABLES)
        job = self._job(snap, request.job_id, request.query.namespace)
        versions = snap.job_versions_of(job.namespace, job.id)
        # newest first: each version against the one before it (the oldest has none)
        diffs = (
            [job_diff(older, newer) for newer, older in zip(versions, versions[1:], strict=False)]
            if request.diffs
            else []
        )
        return job_pb2.JobVersionsResponse(
            versions=versions, diffs=diffs, meta=query.meta(snap, JOB_TABLES)
        )

    async def Summary(
        self, request: job_pb2.JobGetRequest, context: Context
    ) -> job_pb2.JobSummaryResponse:
        tables = (topics.JOB.index, topics.ALLOCATION.index, topics.JOB_SUMMARY.index)
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        job = self._job(snap, request.job_id, request.query.namespace)
        return job_pb2.JobSummaryResponse(
            summary=stubs.summarize(snap, job), meta=query.meta(snap, tables)
        )

    async def Allocations(
        self, request: job_pb2.JobGetRequest, context: Context
    ) -> job_pb2.JobAllocationsResponse:
        tables = ("allocs",)
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        job = self._job(snap, request.job_id, request.query.namespace)
        allocs = snap.allocs_by_job(job.namespace, job.id)
        if not request.all:
            allocs = [
                a
                for a in allocs
                if a.job_version == job.version or a.desired_status == DesiredStatus.RUN
            ]
        allocs.sort(key=lambda a: (a.create_index, a.id))
        return job_pb2.JobAllocationsResponse(allocs=allocs, meta=query.meta(snap, tables))

    async def Evaluations(
        self, request: job_pb2.JobGetRequest, context: Context
    ) -> job_pb2.JobEvaluationsResponse:
        tables = ("evals",)
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        job = self._job(snap, request.job_id, request.query.namespace)
        evals = sorted(
            snap.evals_by_job(job.namespace, job.id), key=lambda e: (e.create_index, e.id)
        )
        return job_pb2.JobEvaluationsResponse(evals=evals, meta=query.meta(snap, tables))

    async def Dispatch(
        self, request: job_pb2.JobDispatchRequest, context: Context
    ) -> job_pb2.JobDispatchResponse:
        """A child of the parameterized job with the caller's meta and
        payload, and its eval; the checks against the parent are made in the
        write's transaction (services/state/writes/dispatch.py)."""
        _job_ref(request.job_id, request.namespace)
        namespace = request.namespace or "default"
        done = await self.ctx.batcher.submit(
            lambda tx: dispatch_job(
                tx,
                namespace,
                request.job_id,
                payload=request.payload,
                meta=dict(request.meta),
                id_prefix_template=request.id_prefix_template,
            ),
            jobs=[(namespace, request.job_id)],
        )
        job, ev = done.value
        return job_pb2.JobDispatchResponse(
            dispatched_job_id=job.id,
            eval_id=ev.id if ev else "",
            eval_create_index=done.index if ev else 0,
            job_create_index=job.create_index,
            index=done.index,
        )


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        job_pb2_grpc.add_JobServicer_to_server,
        JobServicer(ctx),
        job_pb2.DESCRIPTOR.services_by_name["Job"].full_name,
    )
