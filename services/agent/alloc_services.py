"""An alloc's Nomad-provider services on this client (Nomad's group and
task service hooks, checks hook and check watcher, together):

* the group's services are registered when the alloc starts and removed
  when it stops; a task's services while that task runs (registered when
  it starts, removed when it exits or is being killed);
* every check of the group's and the tasks' services runs from the alloc's
  start to its stop (`checks.CheckRunner`); `check_restart` restarts the
  task whose check stays unhealthy (`check_watch`);
* `${...}` in a service and its checks is resolved with the alloc's
  environment (group services, and every check) or the task's (a task's
  registration), as Nomad does; a canary registers `canary_tags` and
  `canary_meta` when it has them, and an alloc update (a promotion, an
  in-place job update) registers its instances again as they now are."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from corral.domain import services, structs
from corral.domain.structs import copy_msg
from corral.v1 import structs_pb2 as pb
from services.agent import taskenv
from services.agent.check_watch import POLL_S, CheckWatcher, watch_for
from services.agent.checks import Checker, CheckRunner, CheckTarget
from services.agent.service_sync import ServiceSync

log = logging.getLogger(__name__)

#: how long a stopping alloc waits for its deregistration to reach the state
#: before it goes on (the state removes the instances anyway once the alloc
#: is client-terminal)
DEREGISTER_TIMEOUT_S = 5.0

EnvOf = Callable[[str], taskenv.TaskEnv]  # "" = the alloc's environment


def interpolate(service: pb.Service, variables: dict[str, str]) -> pb.Service:
    """The service with runtime variables resolved (taskenv.InterpolateService)."""
    out = copy_msg(service)

    def sub(text: str) -> str:
        return taskenv.interpolate(text, variables)

    out.name = sub(out.name)
    out.port_label = sub(out.port_label)
    out.address = sub(out.address)
    out.tags[:] = [sub(t) for t in out.tags]
    out.canary_tags[:] = [sub(t) for t in out.canary_tags]
    for meta in (out.meta, out.canary_meta):
        for k in list(meta):
            meta[k] = sub(meta[k])
    for check in out.checks:
        for name in ("name", "path", "protocol", "port_label", "method", "body", "initial_status"):
            setattr(check, name, sub(getattr(check, name)))
        for values in check.header.values():
            values.values[:] = [sub(v) for v in values.values]
    return out


def resolve_address(
    address: str, mode: str, port_label: str, ports: list[pb.Port], node_ip: str
) -> tuple[str, int]:
    """Where a service (or check) is reached (serviceregistration.GetAddress
    for the modes Corral has): a custom `address` with the port's host
    value or number, else the node's address and the port's host value. A
    bare port number is taken on the node's address (Nomad leaves the
    address empty). ValueError when the label is no port of the alloc."""
    if mode in ("", services.ADDRESS_AUTO) and address:
        return address, _port(port_label, ports)
    if address:
        raise ValueError(f"cannot use a custom address with address_mode {mode!r}")
    return node_ip, _port(port_label, ports)


def _port(label: str, ports: list[pb.Port]) -> int:
    if not label:
        return 0
    for p in ports:
        if p.label == label:
            return p.value
    if label.isdigit() and 0 < int(label) <= 65535:
        return int(label)
    raise ValueError(f"invalid port {label!r}: port label not found")


class AllocServices:
    def __init__(
        self,
        alloc: Callable[[], pb.Allocation],
        job: Callable[[], pb.Job],
        node: pb.Node,
        sync: ServiceSync,
        checker: Checker,
        env_of: EnvOf,
        restart: Callable[[str, str], None],
    ) -> None:
        """`restart(task, reason)` restarts a task for check_restart ("":
        every task of the alloc)."""
        self._alloc = alloc
        self._job = job
        self.node = node
        self.sync = sync
        self.env_of = env_of
        self.checks = CheckRunner(checker)
        self.watcher = CheckWatcher(restart)
        self._group_active = False
        self._tasks_active: set[str] = set()
        self._poll: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ shape

    def _group(self) -> pb.TaskGroup | None:
        return structs.task_group(self._job(), self._alloc().task_group)

    def _owner(self, task: str) -> tuple[str, str]:
        return (self._alloc().id, task or "group")

    @property
    def has_checks(self) -> bool:
        tg = self._group()
        return tg is not None and any(s.checks for s in services.group_services(tg))

    def results(self) -> list[pb.CheckResult]:
        return self.checks.list()

    # ------------------------------------------------------------ registrations

    def _ports(self, task: str) -> list[pb.Port]:
        alloc = self._alloc()
        if task:
            return taskenv.task_ports(alloc, task)
        return [p for n in alloc.resources.networks for p in (*n.reserved_ports, *n.dynamic_ports)]

    def _registrations(self, task: str) -> list[pb.ServiceRegistration]:
        """The instances of the group's services ("") or of one task's."""
        tg = self._group()
        if tg is None:
            return []
        specs: list[pb.Service]
        if task:
            found = next((t for t in tg.tasks if t.name == task), None)
            specs = list(found.services) if found is not None else []
        else:
            specs = list(tg.services)
        if not specs:
            return []
        alloc = self._alloc()
        env = self.env_of(task)
        workload = services.workload_name(task, alloc.task_group)
        canary = alloc.deployment_status.canary
        out = []
        for spec in specs:
            svc = interpolate(spec, env.variables)
            try:
                host, port = resolve_address(
                    svc.address,
                    svc.address_mode,
                    svc.port_label,
                    self._ports(task),
                    taskenv.node_address(self.node),
                )
            except ValueError as exc:
                log.warning(
                    "alloc %s: service %r not registered: %s",
                    alloc.id,
                    svc.name,
                    exc,
                    extra={"alloc_id": alloc.id},
                )
                continue
            tags = svc.canary_tags if canary and svc.canary_tags else svc.tags
            meta = svc.canary_meta if canary and svc.canary_meta else svc.meta
            out.append(
                pb.ServiceRegistration(
                    id=services.registration_id(alloc.id, workload, svc),
                    service_name=svc.name,
                    namespace=alloc.namespace or structs.DEFAULT_NAMESPACE,
                    node_id=self.node.id,
                    datacenter=self.node.datacenter,
                    job_id=alloc.job_id,
                    alloc_id=alloc.id,
                    tags=list(tags),
                    address=host,
                    port=port,
                    meta=dict(meta),
                )
            )
        return out

    # ------------------------------------------------------------ checks

    def _targets(self) -> list[tuple[CheckTarget, str, str]]:
        """Every check of the group with where it goes, the task whose
        service it is ("" for a group service) and the task its
        check_restart restarts ("": every task of the alloc)."""
        tg = self._group()
        if tg is None:
            return []
        alloc = self._alloc()
        variables = self.env_of("").variables
        node_ip = taskenv.node_address(self.node)
        out = []
        owners: list[tuple[pb.Service, str]] = [(s, "") for s in tg.services]
        owners += [(s, t.name) for t in tg.tasks for s in t.services]
        for spec, task in owners:
            svc = interpolate(spec, variables)
            for check in svc.checks:
                host, port, problem = "", 0, ""
                mode = check.address_mode or (
                    services.ADDRESS_AUTO if svc.address else services.ADDRESS_HOST
                )
                try:
                    host, port = resolve_address(
                        svc.address if mode == services.ADDRESS_AUTO else "",
                        mode,
                        check.port_label or svc.port_label,
                        self._ports(task),
                        node_ip,
                    )
                except ValueError as exc:
                    problem = str(exc)
                target = CheckTarget(
                    id=services.check_id(alloc.id, alloc.task_group, check),
                    check=check,
                    group=alloc.name,
                    task=svc.task_name,
                    service=svc.name,
                    host=host,
                    port=port,
                    problem=problem,
                )
                out.append((target, task, task or check.task_name))
        return out

    def _arm(self, owner: str) -> None:
        """Watch the check_restart checks of the group's services ("") or
        of one task's, their grace starting now."""
        for target, of, restarts in self._targets():
            if of != owner:
                continue
            w = watch_for(target.id, target.check, restarts)
            if w is not None:
                self.watcher.watch(w)

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            self.watcher.poll(self.checks.results)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """The alloc starts: its group's services are registered and every
        check of the group starts (Prerun)."""
        self._group_active = True
        self.sync.set(self._owner(""), self._registrations(""))
        self.checks.observe([t for t, _, _ in self._targets()])
        self._arm("")
        self._poll = asyncio.create_task(self._poll_loop(), name="check-restart")

    def task_started(self, task: str) -> None:
        """A task (re)started: its services are registered (Poststart)."""
        self._tasks_active.add(task)
        self.sync.set(self._owner(task), self._registrations(task))
        self._arm(task)

    def task_stopped(self, task: str) -> None:
        """A task exited, or is about to be killed: its services go."""
        self._tasks_active.discard(task)
        self.sync.clear(self._owner(task))
        self.watcher.unwatch_task(task)

    def refresh(self) -> None:
        """The alloc or its job changed (canary promoted, in-place update):
        register what runs as it is now, run the checks as they are now."""
        if self._group_active:
            self.sync.set(self._owner(""), self._registrations(""))
            self.checks.observe([t for t, _, _ in self._targets()])
        for task in self._tasks_active:
            self.sync.set(self._owner(task), self._registrations(task))

    async def deregister(self) -> None:
        """Before the alloc's tasks are killed (PreKill): its group's
        services and every task's go, and the state is given a moment to
        hear it, so `shutdown_delay` starts with the instance gone."""
        self._group_active = False
        self.sync.clear(self._owner(""))
        for task in list(self._tasks_active):
            self.task_stopped(task)
        await self.sync.flush(DEREGISTER_TIMEOUT_S)

    async def stop(self) -> None:
        """The alloc is done: nothing of it stays registered or checked."""
        self._group_active = False
        self.sync.clear(self._owner(""))
        for task in list(self._tasks_active):
            self.task_stopped(task)
        await self.halt()

    async def halt(self) -> None:
        """The agent shuts down leaving the alloc running (its tasks are
        adopted by the next agent): the checks stop here, the instances stay
        registered."""
        self.watcher.clear()
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
            self._poll = None
        await self.checks.stop()
