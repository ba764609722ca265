"""What a task's templates read from the cluster, fetched and watched for
them (consul-template's watcher and views, over Corral's gRPC API).

`TemplateData` is the `NomadData` provider a render asks: it answers from
what its watchers fetched and `UNKNOWN` for the rest. `watch(deps)` keeps
one watcher per dependency a render used or missed: a loop of blocking
queries (`min_index` = the index it last saw) made with the task's own
workload identity, so a template reads exactly what its task may read.
Each new answer that differs from the last sets `changed`; the template
manager then renders again. A file a template reads (`file`) is watched
by its size, time and inode once a second.

A failing query is retried with consul-template's backoff (`Retry`: 12
attempts, 250 ms doubling up to 1 min, Nomad's `nomad_retry`); once the
attempts are used up the dependency is `failed` and the manager fails the
task, as Nomad does ("Template failed: ..."). A query the server refuses
as invalid fails at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import grpc

from corral.domain.template.nomad import (
    UNKNOWN,
    Dependency,
    FileDependency,
    NomadService,
    NomadServicesSnippet,
    NomadVariable,
    NomadVarMeta,
    ServiceQuery,
    ServicesQuery,
    VarGet,
    VarList,
)
from corral.security.acl import TOKEN_METADATA_KEY
from corral.v1 import query_pb2, service_pb2, service_pb2_grpc, variables_pb2, variables_pb2_grpc
from corral.v1 import structs_pb2 as pb

log = logging.getLogger(__name__)

#: the region of a Corral that is not federated (and of a query naming none)
DEFAULT_REGION = "global"
#: how long one blocking query waits before it is asked again (consul-template's
#: block_query_wait is 60 s)
BLOCK_WAIT_MS = 60_000
#: a page of a list read (the rest follows by next_token)
PAGE = 500


@dataclass(frozen=True)
class Retry:
    """Nomad's client `template { nomad_retry { attempts, backoff,
    max_backoff } }`: attempts 0 retries forever."""

    attempts: int = 12
    backoff: float = 0.25
    max_backoff: float = 60.0

    def delay(self, attempt: int) -> float:
        return float(min(self.backoff * 2 ** max(attempt - 1, 0), self.max_backoff))


class QueryError(Exception):
    """A query failed; `permanent` ones are not retried."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class Answer:
    """One answer to a dependency: its value for the template functions,
    what identifies it (`key`: a new key means a change) and the index to
    block on next."""

    value: Any
    key: bytes
    index: int


class Fetcher(Protocol):
    async def fetch(self, dep: Dependency, index: int) -> Answer:
        """The dependency's answer once its index passes `index` (or when
        the blocking query times out); QueryError when it cannot be had."""
        ...


TokenSource = Callable[[], Awaitable[str]]


class GrpcFetcher:
    """Blocking queries on the state's Variables and ServiceRegistration
    services, each carrying the task's workload identity (`token`)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        token: TokenSource,
        *,
        wait_ms: int = BLOCK_WAIT_MS,
        region: str = DEFAULT_REGION,
    ) -> None:
        self.variables = variables_pb2_grpc.VariablesStub(channel)
        self.catalog = service_pb2_grpc.ServiceRegistrationStub(channel)
        self.token = token
        self.wait_ms = wait_ms
        #: the agent's region: the only one a query may name. The task's
        #: workload identity is signed by its region's keyring, which other
        #: regions of a federation do not hold (they replicate ACLs, not keys)
        self.region = region

    async def fetch(self, dep: Dependency, index: int) -> Answer:
        if isinstance(dep, FileDependency):
            raise QueryError(f"{dep} is not a cluster query", permanent=True)
        if dep.region not in ("", self.region):
            raise QueryError(
                f"{dep}: a template reads its own region ({self.region!r}) only; "
                f"got {dep.region!r}",
                permanent=True,
            )
        metadata = ((TOKEN_METADATA_KEY, await self.token()),)
        timeout = self.wait_ms / 1000 + 30
        try:
            if isinstance(dep, VarGet):
                return await self._variable(dep, index, metadata, timeout)
            if isinstance(dep, VarList):
                return await self._variables(dep, index, metadata, timeout)
            if isinstance(dep, ServiceQuery):
                return await self._service(dep, index, metadata, timeout)
            return await self._services(dep, index, metadata, timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            permanent = code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED)
            raise QueryError(
                f"{dep}: {_code_text(code)}: {exc.details()}", permanent=permanent
            ) from None

    def _query(self, namespace: str, index: int, **kw: Any) -> query_pb2.QueryOptions:
        return query_pb2.QueryOptions(
            namespace=namespace, min_index=index, wait_ms=self.wait_ms if index else 0, **kw
        )

    async def _variable(self, dep: VarGet, index: int, metadata: Any, timeout: float) -> Answer:
        resp = await self.variables.Read(
            variables_pb2.VariablesReadRequest(
                path=dep.path, query=self._query(dep.namespace, index)
            ),
            metadata=metadata,
            timeout=timeout,
        )
        if not resp.found:
            return Answer(None, b"", resp.meta.index)
        v, m = resp.variable, resp.variable.metadata
        value = NomadVariable(
            m.path,
            dict(v.items),
            namespace=m.namespace,
            create_index=m.create_index,
            modify_index=m.modify_index,
            create_time=m.create_time,
            modify_time=m.modify_time,
        )
        key = pb.Variable(
            metadata=pb.VariableMetadata(
                namespace=m.namespace, path=m.path, modify_index=m.modify_index
            ),
            items=v.items,
        ).SerializeToString(deterministic=True)
        return Answer(value, key, resp.meta.index)

    async def _variables(self, dep: VarList, index: int, metadata: Any, timeout: float) -> Answer:
        metas: list[pb.VariableMetadata] = []
        next_token, at = "", index
        while True:
            resp = await self.variables.List(
                variables_pb2.VariablesListRequest(
                    query=self._query(
                        dep.namespace, at, prefix=dep.prefix, per_page=PAGE, next_token=next_token
                    )
                ),
                metadata=metadata,
                timeout=timeout,
            )
            if not next_token:
                result_index = resp.meta.index
            metas.extend(resp.variables)
            next_token, at = resp.meta.next_token, 0
            if not next_token:
                break
        value = [
            NomadVarMeta(
                m.namespace, m.path, m.create_index, m.modify_index, m.create_time, m.modify_time
            )
            for m in sorted(metas, key=lambda m: (m.namespace, m.path))
        ]
        key = b"\0".join(f"{m.namespace}\0{m.path}\0{m.modify_index}".encode() for m in metas)
        return Answer(value, key, result_index)

    async def _service(
        self, dep: ServiceQuery, index: int, metadata: Any, timeout: float
    ) -> Answer:
        regs: list[pb.ServiceRegistration] = []
        next_token, at = "", index
        while True:
            resp = await self.catalog.GetService(
                service_pb2.ServiceGetRequest(
                    service_name=dep.name,
                    tag=dep.tag,
                    choose=dep.choose,
                    query=self._query(dep.namespace, at, per_page=PAGE, next_token=next_token),
                ),
                metadata=metadata,
                timeout=timeout,
            )
            if not next_token:
                result_index = resp.meta.index
            regs.extend(resp.registrations)
            next_token, at = resp.meta.next_token, 0
            if not next_token:
                break
        value = [
            NomadService(
                r.id,
                r.service_name,
                r.address,
                r.port,
                node=r.node_id,
                datacenter=r.datacenter,
                tags=list(r.tags),
                job_id=r.job_id,
                alloc_id=r.alloc_id,
            )
            for r in regs
        ]
        key = b"\0".join(_registration_key(r) for r in regs)
        return Answer(value, key, result_index)

    async def _services(
        self, dep: ServicesQuery, index: int, metadata: Any, timeout: float
    ) -> Answer:
        resp = await self.catalog.List(
            service_pb2.ServiceListRequest(query=self._query(dep.namespace, index)),
            metadata=metadata,
            timeout=timeout,
        )
        stubs = [s for ns in resp.namespaces if ns.namespace == dep.namespace for s in ns.services]
        value = [NomadServicesSnippet(s.service_name, list(s.tags)) for s in stubs]
        key = b"\0".join("\0".join([s.service_name, *s.tags]).encode() + b"\1" for s in stubs)
        return Answer(value, key, resp.meta.index)


def _registration_key(r: pb.ServiceRegistration) -> bytes:
    """What a template sees of an instance (not its indexes: a re-registration
    that changes nothing changes no template)."""
    return "\0".join(
        [
            r.id,
            r.service_name,
            r.address,
            str(r.port),
            r.node_id,
            r.datacenter,
            r.job_id,
            r.alloc_id,
            *sorted(r.tags),
        ]
    ).encode()


def _code_text(code: grpc.StatusCode) -> str:
    """A status as a Nomad user reads it (403 for PERMISSION_DENIED, ...)."""
    return {
        grpc.StatusCode.PERMISSION_DENIED: "Unexpected response code: 403 (Permission denied)",
        grpc.StatusCode.NOT_FOUND: "Unexpected response code: 404",
        grpc.StatusCode.INVALID_ARGUMENT: "Unexpected response code: 400",
        grpc.StatusCode.UNAVAILABLE: "the servers are unavailable",
        grpc.StatusCode.DEADLINE_EXCEEDED: "the query timed out",
    }.get(code, code.name)


def file_signature(path: str) -> tuple[int, int, int, int] | None:
    """What tells a file changed (None: it does not exist)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _key(dep: Dependency) -> Dependency:
    """One watch per variable: `nomadVar` (blocking) and `nomadVarExists`
    read the same answer."""
    return replace(dep, block=False) if isinstance(dep, VarGet) else dep


@dataclass
class _Watch:
    dep: Dependency
    value: Any = UNKNOWN
    key: bytes | None = None
    index: int = 0
    task: asyncio.Task[None] | None = None


@dataclass
class TemplateData:
    """The `NomadData` of one task's templates (see the module doc)."""

    fetcher: Fetcher
    retry: Retry = field(default_factory=Retry)
    #: how often a file a template reads is looked at (seconds)
    file_interval: float = 1.0
    #: set when something a render used or missed has a new answer
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: why a dependency could not be had (the task fails), else ""
    failed: str = ""
    _watches: dict[Dependency, _Watch] = field(default_factory=dict)

    # -- NomadData

    def _known(self, dep: Dependency) -> Any:
        w = self._watches.get(_key(dep))
        return UNKNOWN if w is None else w.value

    def variable(self, query: VarGet) -> NomadVariable | None:
        return self._known(query)  # type: ignore[no-any-return]

    def variables(self, query: VarList) -> list[NomadVarMeta]:
        return self._known(query)  # type: ignore[no-any-return]

    def service(self, query: ServiceQuery) -> list[NomadService]:
        return self._known(query)  # type: ignore[no-any-return]

    def services(self, query: ServicesQuery) -> list[NomadServicesSnippet]:
        return self._known(query)  # type: ignore[no-any-return]

    # -- watching

    def watch(self, deps: Iterable[Dependency]) -> None:
        """Watch exactly `deps` from now on: new ones start fetching, those
        no render needs any more stop."""
        wanted = {_key(d) for d in deps}
        for dep in list(self._watches):
            if dep not in wanted:
                w = self._watches.pop(dep)
                if w.task is not None:
                    w.task.cancel()
        for dep in wanted:
            if dep in self._watches:
                continue
            w = _Watch(dep)
            self._watches[dep] = w
            loop = self._watch_file(w) if isinstance(dep, FileDependency) else self._watch(w)
            w.task = asyncio.get_running_loop().create_task(loop, name=f"template-dep {dep}")

    @property
    def watched(self) -> set[Dependency]:
        return set(self._watches)

    async def stop(self) -> None:
        tasks = [w.task for w in self._watches.values() if w.task is not None]
        self._watches.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _watch(self, w: _Watch) -> None:
        attempt = 0
        while True:
            try:
                answer = await self.fetcher.fetch(w.dep, w.index)
            except asyncio.CancelledError:
                raise
            except QueryError as exc:
                attempt += 1
                if exc.permanent or (self.retry.attempts and attempt > self.retry.attempts):
                    self._fail(str(exc))
                    return
                log.info("template query %s failed (attempt %d): %s", w.dep, attempt, exc)
                await asyncio.sleep(self.retry.delay(attempt))
                continue
            except Exception as exc:  # a bug must not hang the task's start
                log.exception("template query %s", w.dep)
                self._fail(f"{w.dep}: {exc}")
                return
            attempt = 0
            # an index that went backwards: the servers started over (consul-template
            # resets to 0 and reads again)
            w.index = answer.index if answer.index >= w.index else 0
            if w.key != answer.key or w.value is UNKNOWN:
                w.value, w.key = answer.value, answer.key
                self.changed.set()

    async def _watch_file(self, w: _Watch) -> None:
        assert isinstance(w.dep, FileDependency)
        seen = file_signature(w.dep.path)
        w.value = None  # the library reads the file itself
        while True:
            await asyncio.sleep(self.file_interval)
            now = file_signature(w.dep.path)
            if now != seen:
                seen = now
                self.changed.set()

    def _fail(self, message: str) -> None:
        if not self.failed:
            self.failed = message
        self.changed.set()


@dataclass(frozen=True)
class TemplateClient:
    """What the agent gives every task's templates: its connection to the
    state and Nomad's retry settings; each task reads with its own token."""

    channel: grpc.aio.Channel
    retry: Retry = field(default_factory=Retry)
    wait_ms: int = BLOCK_WAIT_MS
    region: str = DEFAULT_REGION

    def data(self, token: TokenSource) -> TemplateData:
        return TemplateData(
            GrpcFetcher(self.channel, token, wait_ms=self.wait_ms, region=self.region),
            retry=self.retry,
        )
