"""Nomad-provider health checks, run by the client that runs the alloc
(Nomad's client/serviceregistration/checks and allocrunner/checks_hook.go):
an `http` check passes on a 2xx or 3xx answer, a `tcp` check when a
connection opens, each within its timeout. Every check of an alloc runs
from when the alloc starts until it stops, first after half its interval,
then every interval; its latest result is kept here and read by the
deployment health watch, `check_restart` and `ClientAlloc.Checks`. Results
never go to the state (as in Nomad)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from corral.domain import services
from corral.v1 import structs_pb2 as pb

log = logging.getLogger(__name__)

#: at most this much of an http answer's body is kept as the check's output
OUTPUT_LIMIT = 3 * 1024
USER_AGENT = "Corral/0.1.0 (Nomad service check)"


@dataclass(frozen=True)
class CheckTarget:
    """A check with everything it needs to run: the (interpolated) check,
    and where it goes (host and port resolved by the caller), or why it
    cannot go anywhere."""

    id: str
    check: pb.ServiceCheck
    group: str  # the alloc's name, as Nomad reports it
    task: str
    service: str
    host: str = ""
    port: int = 0
    problem: str = ""  # the address could not be resolved

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.port else host


def stub(target: CheckTarget, now: int | None = None) -> pb.CheckResult:
    """The result before the first run: pending (Nomad), or what the
    check's `initial_status` says (Corral honours it; Nomad ignores it for
    its own checks)."""
    status = services.INITIAL_STATUS.get(target.check.initial_status, services.CHECK_PENDING)
    return _result(
        target,
        status,
        "nomad: waiting to run"
        if status == services.CHECK_PENDING
        else f"initial status {target.check.initial_status}",
        now=now,
    )


def _result(
    target: CheckTarget, status: str, output: str, code: int = 0, now: int | None = None
) -> pb.CheckResult:
    return pb.CheckResult(
        id=target.id,
        mode=services.check_mode(target.check),
        status=status,
        status_code=code,
        output=output,
        timestamp=int(time.time()) if now is None else now,
        group=target.group,
        task=target.task,
        service=target.service,
        check=target.check.name,
    )


def _failure(target: CheckTarget, output: str) -> pb.CheckResult:
    return _result(target, services.CHECK_FAILURE, output)


class Checker:
    """Runs one check once. Holds the agent's HTTP clients (one verifying
    certificates, one not, for `tls_skip_verify`), created lazily inside the
    running loop and closed by `close`."""

    def __init__(self) -> None:
        self._clients: dict[bool, httpx.AsyncClient] = {}

    def _client(self, verify: bool) -> httpx.AsyncClient:
        client = self._clients.get(verify)
        if client is None:
            client = self._clients[verify] = httpx.AsyncClient(
                verify=verify,
                follow_redirects=True,  # Go's http client follows them too
                headers={"User-Agent": USER_AGENT},
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    async def run(self, target: CheckTarget) -> pb.CheckResult:
        if target.problem:
            return _result(target, services.CHECK_FAILURE, target.problem)
        timeout = target.check.timeout / 1e9
        if target.check.type == services.CHECK_HTTP:
            return await self._http(target, timeout)
        return await self._tcp(target, timeout)

    async def _tcp(self, target: CheckTarget, timeout: float) -> pb.CheckResult:
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(target.host, target.port), timeout
            )
        except TimeoutError:
            return _failure(target, f"dial tcp {target.address}: i/o timeout")
        except OSError as exc:
            return _failure(target, f"dial tcp {target.address}: {exc}")
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return _result(target, services.CHECK_SUCCESS, "nomad: tcp ok")

    async def _http(self, target: CheckTarget, timeout: float) -> pb.CheckResult:
        check = target.check
        scheme = check.protocol or "http"
        path = check.path if check.path.startswith("/") else f"/{check.path}"
        url = f"{scheme}://{target.address}{path}"
        headers = [(k, v) for k, values in check.header.items() for v in values.values]
        client = self._client(not check.tls_skip_verify)
        try:
            async with client.stream(
                check.method.upper() or "GET",
                url,
                headers=headers,
                content=check.body.encode() if check.body else None,
                timeout=timeout,
            ) as answer:
                code = answer.status_code
                if code == 200:
                    return _result(target, services.CHECK_SUCCESS, "nomad: http ok", code)
                body = await _read_limited(answer)
        except httpx.TimeoutException:
            return _failure(target, f"nomad: {url}: timeout ({timeout:g}s)")
        except (httpx.HTTPError, OSError, ValueError) as exc:
            return _failure(target, f"nomad: {url}: {exc or type(exc).__name__}")
        status = services.CHECK_SUCCESS if code < 400 else services.CHECK_FAILURE
        return _result(target, status, body, code)


async def _read_limited(answer: httpx.Response) -> str:
    data = b""
    async for chunk in answer.aiter_bytes():
        data += chunk
        if len(data) >= OUTPUT_LIMIT:
            break
    return data[:OUTPUT_LIMIT].decode(errors="replace")


@dataclass
class _Observer:
    target: CheckTarget
    task: asyncio.Task[None] | None = None


@dataclass
class CheckRunner:
    """Every check of one alloc, each on its own timer; the latest results
    by check id. `on_result` is told of every new result."""

    checker: Checker
    on_result: Callable[[pb.CheckResult], None] = lambda r: None
    results: dict[str, pb.CheckResult] = field(default_factory=dict)
    _observers: dict[str, _Observer] = field(default_factory=dict)

    def observe(self, targets: list[CheckTarget]) -> None:
        """Run exactly these checks: new ones start (with their stub
        result), gone ones stop and their results go (checks_hook.observe).
        A check whose definition is unchanged keeps running on its timer."""
        wanted = {t.id: t for t in targets}
        for check_id in list(self._observers):
            if check_id not in wanted:
                self._stop(check_id)
                self.results.pop(check_id, None)
        for check_id, target in wanted.items():
            found = self._observers.get(check_id)
            if found is not None:
                found.target = target  # the same check; its address may have moved
                continue
            observer = _Observer(target)
            self._observers[check_id] = observer
            self.results[check_id] = stub(target)
            observer.task = asyncio.create_task(self._loop(observer), name=f"check-{check_id[:8]}")

    async def _loop(self, observer: _Observer) -> None:
        interval = observer.target.check.interval / 1e9
        await asyncio.sleep(interval / 2)
        while True:
            started = time.monotonic()
            try:
                result = await self.checker.run(observer.target)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not end the check's timer
                log.exception("check %s failed to run", observer.target.check.name)
                result = _result(observer.target, services.CHECK_FAILURE, f"nomad: {exc}")
            if self._observers.get(observer.target.id) is not observer:
                return
            self.results[observer.target.id] = result
            self.on_result(result)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    def _stop(self, check_id: str) -> None:
        observer = self._observers.pop(check_id, None)
        if observer is not None and observer.task is not None:
            observer.task.cancel()

    async def stop(self) -> None:
        """Stop every check and forget the results (checks_hook.PreKill)."""
        tasks = [o.task for o in self._observers.values() if o.task is not None]
        for check_id in list(self._observers):
            self._stop(check_id)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.results.clear()

    def list(self) -> list[pb.CheckResult]:
        return [self.results[k] for k in sorted(self.results)]
