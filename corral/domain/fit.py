"""Resource accounting shared by the scheduler and the plan applier: does a
set of allocs fit on a node? (Nomad's `structs.AllocsFit`, `NetworkIndex`
and `DeviceAccounter`.)

Both sides must agree exactly, or the scheduler proposes plans the applier
rejects forever, so there is one implementation of the rules:

* capacity = node resources − node reserved resources;
* client-terminal allocs (complete, failed, lost) hold nothing; server-
  terminal allocs that the client still runs *do* hold resources (callers
  pass the proposed set: existing − plan stops + plan placements);
* reserved cores are counted as whole cores *and* as their MHz
  (cores × node MHz per core) of CPU, as Nomad does;
* memory fits on `memory_mb` (the oversubscription ceiling `memory_max_mb`
  is not reserved);
* the first failing dimension is reported in Nomad's words: "max allocation
  exceeded", "cores", "cpu", "memory", "disk", "reserved node port collision
  …", "reserved alloc port collision …", "device oversubscribed".

Ports live in one port space per node (our nodes have no host networks or
addresses). Network bandwidth (`mbits`) is not accounted, like modern Nomad.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from corral.domain.errors import InvalidArgument
from corral.domain.structs import ClientStatus
from corral.v1 import structs_pb2 as pb

MAX_VALID_PORT = 65536
DEFAULT_MIN_DYNAMIC_PORT = 20000
DEFAULT_MAX_DYNAMIC_PORT = 32000
#: random picks tried per dynamic port before falling back to a full scan
MAX_RAND_PORT_ATTEMPTS = 20

_CLIENT_TERMINAL = ClientStatus.TERMINAL

DeviceKey = tuple[str, str, str]  # (vendor, type, name)


# --------------------------------------------------------------------------- capacity


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a node offers to allocs: its resources minus what it reserves."""

    cpu: int
    cores: int
    memory_mb: int
    disk_mb: int
    mhz_per_core: int
    max_allocs: int  # 0 = unlimited
    total_cpu: int
    total_memory_mb: int


def node_capacity(node: pb.Node) -> Capacity:
    r = node.node_resources
    rr = node.reserved_resources
    per_core = r.cpu // r.total_cores if r.total_cores > 0 else 0
    return Capacity(
        cpu=r.cpu - rr.cpu,
        cores=r.total_cores - rr.cores,
        memory_mb=r.memory_mb - rr.memory_mb,
        disk_mb=r.disk_mb - rr.disk_mb,
        mhz_per_core=per_core,
        max_allocs=r.max_allocs,
        total_cpu=r.cpu,
        total_memory_mb=r.memory_mb,
    )


@dataclass(slots=True)
class Usage:
    """Summed comparable resources of a set of allocs (Nomad's
    ComparableResources, flattened)."""

    cpu: int = 0
    cores: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    allocs: int = 0

    def add(self, res: pb.Resources, mhz_per_core: int) -> None:
        """Add one alloc's total resources (and count it)."""
        self.cpu += res.cpu + res.cores * mhz_per_core
        self.cores += res.cores
        self.memory_mb += res.memory_mb
        self.disk_mb += res.disk_mb
        self.allocs += 1

    def copy(self) -> Usage:
        return Usage(self.cpu, self.cores, self.memory_mb, self.disk_mb, self.allocs)


def usage_of(allocs: Iterable[pb.Allocation], mhz_per_core: int) -> Usage:
    """Resources held by `allocs`, skipping client-terminal ones."""
    used = Usage()
    for a in allocs:
        if a.client_status in _CLIENT_TERMINAL:
            continue
        used.add(a.resources, mhz_per_core)
    return used


def exceeded_dimension(cap: Capacity, used: Usage) -> str:
    """The first dimension `used` exceeds on `cap` ("" if it fits), in the
    order Nomad reports them (core overlap is checked before the rest)."""
    if cap.max_allocs and used.allocs > cap.max_allocs:
        return "max allocation exceeded"
    if used.cores > cap.cores:
        return "cores"
    if used.cpu > cap.cpu:
        return "cpu"
    if used.memory_mb > cap.memory_mb:
        return "memory"
    if used.disk_mb > cap.disk_mb:
        return "disk"
    return ""


@dataclass(frozen=True, slots=True)
class FitResult:
    fits: bool
    dimension: str  # "" when it fits
    used: Usage


def allocs_fit(
    node: pb.Node,
    allocs: Sequence[pb.Allocation],
    *,
    check_devices: bool = True,
    net_index: NetworkIndex | None = None,
) -> FitResult:
    """Do `allocs` (the proposed set for `node`) fit on it?

    `net_index`, when given, is a port index the caller already built from
    the node and these allocs (the scheduler does), so ports are not checked
    again here.
    """
    cap = node_capacity(node)
    used = usage_of(allocs, cap.mhz_per_core)
    dim = exceeded_dimension(cap, used)
    if dim:
        return FitResult(False, dim, used)
    if net_index is None:
        idx = NetworkIndex()
        reason = idx.set_node(node)
        if reason:
            return FitResult(False, f"reserved node port collision: {reason}", used)
        reason = idx.add_allocs(allocs)
        if reason:
            return FitResult(False, f"reserved alloc port collision: {reason}", used)
    if check_devices:
        accounter = DeviceAccounter(node)
        if accounter.add_allocs(allocs):
            return FitResult(False, "device oversubscribed", used)
    return FitResult(True, "", used)


# --------------------------------------------------------------------------- ports


def parse_port_spec(spec: str, field_name: str = "reserved_host_ports") -> list[int]:
    """Parse "22,80,8000-8100" into the ports it names (in order given).

    Raises InvalidArgument naming `field_name` on a malformed spec. An empty
    spec names no ports.
    """
    if not spec.strip():
        return []
    ports: list[int] = []
    for raw in spec.split(","):
        part = raw.strip()
        bounds = part.split("-")
        if len(bounds) == 1:
            if not part:
                raise InvalidArgument(field_name, "can't specify empty port")
            p = _parse_port(part, field_name)
            ports.append(p)
        elif len(bounds) == 2:
            start = _parse_port(bounds[0].strip(), field_name)
            end = _parse_port(bounds[1].strip(), field_name)
            if end < start:
                raise InvalidArgument(
                    field_name,
                    f"invalid range: ending value ({end}) less than starting ({start}) value",
                )
            ports.extend(range(start, end + 1))
        else:
            raise InvalidArgument(
                field_name,
                "can only parse single port numbers or port ranges (ex. 80,100-120,150)",
            )
    return ports


def _parse_port(text: str, field_name: str) -> int:
    if not text.isdigit():
        raise InvalidArgument(field_name, f"invalid port {text!r}")
    p = int(text)
    if p == 0:
        raise InvalidArgument(field_name, "port must be > 0")
    if p >= MAX_VALID_PORT:
        raise InvalidArgument(field_name, f"port must be < {MAX_VALID_PORT} but found {p}")
    return p


@functools.lru_cache(maxsize=256)
def _reserved_ports(spec: str) -> tuple[int, ...] | str:
    """Parsed node reserved ports (nodes share a handful of specs), or the
    parse error."""
    try:
        return tuple(parse_port_spec(spec))
    except InvalidArgument as e:
        return e.message


class PortAssignmentError(Exception):
    """A network ask cannot be satisfied on this node (static port taken or
    dynamic range exhausted); the message is the exhaustion reason."""


@dataclass(slots=True)
class NetworkIndex:
    """Ports in use on one node, and assignment of new ones.

    Built per candidate node from the node's reserved host ports and the
    proposed allocs' ports; `assign` then hands out the ask's static ports
    and picks dynamic ones from the node's dynamic range with the caller's
    rng (deterministic for a given seed).
    """

    used: set[int] = field(default_factory=set)
    min_dynamic_port: int = DEFAULT_MIN_DYNAMIC_PORT
    max_dynamic_port: int = DEFAULT_MAX_DYNAMIC_PORT

    @classmethod
    def for_node(
        cls, node: pb.Node, allocs: Iterable[pb.Allocation] = ()
    ) -> tuple[NetworkIndex, str]:
        """An index of `node` and `allocs`, and the collision reason ("" if
        none; a reason means the node's current state is itself invalid)."""
        idx = cls()
        reason = idx.set_node(node)
        if reason:
            return idx, f"reserved node port collision: {reason}"
        reason = idx.add_allocs(allocs)
        if reason:
            return idx, f"reserved alloc port collision: {reason}"
        return idx, ""

    def copy(self) -> NetworkIndex:
        return NetworkIndex(set(self.used), self.min_dynamic_port, self.max_dynamic_port)

    def set_node(self, node: pb.Node) -> str:
        """Record the node's reserved host ports and dynamic range; returns
        a reason if the reserved spec is malformed."""
        r = node.node_resources
        if r.min_dynamic_port > 0:
            self.min_dynamic_port = r.min_dynamic_port
        if r.max_dynamic_port > 0:
            self.max_dynamic_port = r.max_dynamic_port
        spec = node.reserved_resources.reserved_host_ports
        if not spec:
            return ""
        ports = _reserved_ports(spec)
        if isinstance(ports, str):
            return ports
        self.used.update(ports)
        return ""

    def add_allocs(self, allocs: Iterable[pb.Allocation]) -> str:
        """Mark the ports of non-client-terminal allocs used; returns the
        first collision as a reason ("" if none)."""
        for a in allocs:
            if a.client_status in _CLIENT_TERMINAL:
                continue
            reason = self.add_resources(a.resources)
            if reason:
                return reason
        return ""

    def add_resources(self, res: pb.Resources) -> str:
        """Mark the ports of one alloc's resources used; "" or a reason."""
        for net in res.networks:
            reason = self.add_network(net)
            if reason:
                return reason
        return ""

    def add_network(self, net: pb.NetworkResource) -> str:
        reason = ""
        used = self.used
        for ports in (net.reserved_ports, net.dynamic_ports):
            for p in ports:
                v = p.value
                if v <= 0 or v >= MAX_VALID_PORT:
                    reason = reason or f"invalid port {v}"
                    continue
                if v in used:
                    reason = reason or f"port {v} already in use"
                used.add(v)
        return reason

    def collides(self, port: int) -> bool:
        return port in self.used

    def assign(
        self, ask: pb.NetworkResource, rng: random.Random, out: pb.NetworkResource | None = None
    ) -> pb.NetworkResource:
        """Satisfy one network ask: static ports as given, dynamic ports
        picked from the free part of the dynamic range. The ports are marked
        used in this index. Raises PortAssignmentError on failure (the index
        is then left unchanged).
        """
        used = self.used
        taken: list[int] = []
        result = out if out is not None else pb.NetworkResource()
        result.mode = ask.mode
        result.mbits = ask.mbits
        try:
            for p in ask.reserved_ports:
                v = p.value
                if v <= 0 or v >= MAX_VALID_PORT:
                    raise PortAssignmentError(f"invalid port {v} (out of range)")
                if v in used:
                    raise PortAssignmentError(f"reserved port collision {p.label}={v}")
                used.add(v)
                taken.append(v)
                result.reserved_ports.add(
                    label=p.label, value=v, to=p.to, host_network=p.host_network
                )
            for p in ask.dynamic_ports:
                v = self._pick_dynamic(rng)
                used.add(v)
                taken.append(v)
                to = v if p.to == -1 else p.to
                result.dynamic_ports.add(label=p.label, value=v, to=to, host_network=p.host_network)
        except PortAssignmentError:
            for v in taken:
                used.discard(v)
            raise
        return result

    def _pick_dynamic(self, rng: random.Random) -> int:
        lo, hi = self.min_dynamic_port, self.max_dynamic_port
        if hi < lo:
            raise PortAssignmentError("dynamic port selection failed")
        used = self.used
        for _ in range(MAX_RAND_PORT_ATTEMPTS):
            v = rng.randint(lo, hi)
            if v not in used:
                return v
        free = [v for v in range(lo, hi + 1) if v not in used]
        if not free:
            raise PortAssignmentError("dynamic port selection failed")
        return free[rng.randrange(len(free))]


# --------------------------------------------------------------------------- devices


def device_key(vendor: str, dtype: str, name: str) -> DeviceKey:
    return (vendor, dtype, name)


class DeviceAccounter:
    """How many times each device instance of a node is claimed."""

    __slots__ = ("instances",)

    def __init__(self, node: pb.Node) -> None:
        self.instances: dict[DeviceKey, dict[str, int]] = {}
        for dev in node.node_resources.devices:
            key = (dev.vendor, dev.type, dev.name)
            inst = self.instances.setdefault(key, {})
            for iid in dev.instance_ids:
                inst[iid] = 0

    def add_allocs(self, allocs: Iterable[pb.Allocation]) -> bool:
        """Count the devices of non-client-terminal allocs; True if some
        instance is now claimed more than once. Instances the node does not
        have are ignored (the node may have lost a device)."""
        collision = False
        for a in allocs:
            if a.client_status in _CLIENT_TERMINAL:
                continue
            if self.add_reserved(a.resources.allocated_devices):
                collision = True
        return collision

    def add_reserved(self, devices: Iterable[pb.AllocatedDevice]) -> bool:
        collision = False
        for d in devices:
            inst = self.instances.get((d.vendor, d.type, d.name))
            if inst is None:
                continue
            for iid in d.device_ids:
                if iid in inst:
                    inst[iid] += 1
                    if inst[iid] > 1:
                        collision = True
        return collision

    def free_instances(self, key: DeviceKey) -> list[str]:
        inst = self.instances.get(key, {})
        return [iid for iid, n in inst.items() if n == 0]
