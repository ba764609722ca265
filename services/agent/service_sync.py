"""The node's side of the service catalog (Nomad's nsd.ServiceRegistrationHandler):
the instances this client wants registered, pushed to the state with
`ServiceRegistration.Upsert` and `Deregister`, retried until the state
has them.

Each owner (an alloc's group services, or one task's) sets the instances
it wants; one loop sends the difference between what is wanted and what
the state was last told, so a registration and the deregistration that
follows it are never reordered, and a call refused while the state is
unreachable (or the node not ready) is simply sent again. `flush` waits for
the catalog to catch up: the alloc runner deregisters a task's services
before it waits out `shutdown_delay` and kills the task."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence

import grpc

from corral.v1 import structs_pb2 as pb

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, registration id)
Upsert = Callable[[Sequence[pb.ServiceRegistration]], Awaitable[object]]
Deregister = Callable[[str, Sequence[str]], Awaitable[object]]

BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def _key(reg: pb.ServiceRegistration) -> Key:
    return (reg.namespace or "default", reg.id)


class ServiceSync:
    def __init__(self, upsert: Upsert, deregister: Deregister) -> None:
        self._upsert = upsert
        self._deregister = deregister
        self._wanted: dict[object, dict[Key, pb.ServiceRegistration]] = {}
        #: what the state was last told: key → the instance sent
        self._sent: dict[Key, pb.ServiceRegistration] = {}
        self._changed = asyncio.Event()
        self._synced = asyncio.Event()
        self._synced.set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="service-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ------------------------------------------------------------ owners

    def set(self, owner: object, regs: Sequence[pb.ServiceRegistration]) -> None:
        """The instances `owner` wants registered now (none: `clear`)."""
        wanted = {_key(r): r for r in regs}
        if self._wanted.get(owner, {}) == wanted:
            return
        if wanted:
            self._wanted[owner] = wanted
        else:
            self._wanted.pop(owner, None)
        self._kick()

    def clear(self, owner: object) -> None:
        self.set(owner, [])

    def resync(self) -> None:
        """Send every wanted instance again (the state may have lost them:
        after a long disconnect, or a state database reset)."""
        self._sent.clear()
        self._kick()

    def wanted(self) -> dict[Key, pb.ServiceRegistration]:
        out: dict[Key, pb.ServiceRegistration] = {}
        for regs in self._wanted.values():
            out.update(regs)
        return out

    async def flush(self, timeout: float) -> bool:
        """Wait (at most `timeout`) until the state holds what is wanted."""
        try:
            await asyncio.wait_for(self._synced.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _kick(self) -> None:
        self._synced.clear()
        self._changed.set()

    # ------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        failures = 0
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._send()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.info("service registration deferred: %s", exc.details())
                await asyncio.sleep(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
                failures += 1
                self._changed.set()
                continue
            except Exception:
                log.exception("service registration failed; retrying")
                await asyncio.sleep(BACKOFF_S[-1])
                self._changed.set()
                continue
            failures = 0
            if not self._changed.is_set():
                self._synced.set()

    async def _send(self) -> None:
        wanted = self.wanted()
        gone: dict[str, list[pb.ServiceRegistration]] = defaultdict(list)
        for key, reg in self._sent.items():
            if key not in wanted:
                gone[key[0]].append(reg)
        for namespace, regs in sorted(gone.items()):
            await self._deregister(namespace, [r.id for r in regs])
            for r in regs:
                self._sent.pop(_key(r), None)
        new = [r for k, r in wanted.items() if self._sent.get(k) != r]
        if new:
            await self._upsert(new)
            for r in new:
                self._sent[_key(r)] = r
