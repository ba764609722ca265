"""Host volumes (Nomad's static host volumes): a node offers host
directories by name (`ClientHostVolumeConfig`, from the agent's
configuration); a task group asks for them (`volume "x" { type = "host",
source, read_only, per_alloc }`); its tasks mount them (`volume_mount`).

The one home of the rules the job parsers, the state, the scheduler and
the agent share: what a request may say (`problem`), which node volume
it names (`source_for`: `source[N]` for a `per_alloc` request, as
Nomad), and whether a node can give it (`node_offers`).

CSI and dynamic host volumes are not part of Corral: a `type = "csi"`
request and a `sticky` one (dynamic host volumes only) are refused rather
than accepted and never honoured.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping

from corral.domain.structs import JobType
from corral.v1 import structs_pb2 as pb

TYPE_HOST = "host"
TYPE_CSI = "csi"

PROPAGATION_PRIVATE = "private"
#: Nomad's other propagation modes: they need the task's mounts to stay
#: connected to the host's, which Corral's exec driver does not do
PROPAGATION_UNSUPPORTED = ("host-to-task", "bidirectional")

ACCESS_SINGLE_NODE_READER = "single-node-reader-only"
#: the access modes a host volume request may name (Nomad's
#: HostVolumeAccessMode*; static volumes ignore them in placement)
HOST_ACCESS_MODES = (
    "",
    ACCESS_SINGLE_NODE_READER,
    "single-node-writer",
    "single-node-single-writer",
    "single-node-multi-writer",
)
HOST_ATTACHMENT_MODES = ("", "file-system", "block-device")


def alloc_suffix(alloc_name: str) -> str:
    """The `[N]` at the end of an alloc name `<job>.<group>[N]` ('' if none)."""
    at = alloc_name.rfind("[")
    return alloc_name[at:] if at >= 0 else ""


def source_for(req: pb.VolumeRequest, alloc_name: str) -> str:
    """The node volume a request names for one alloc: its source, or with
    `per_alloc` the source followed by the alloc's index (`data[0]`)."""
    return req.source + alloc_suffix(alloc_name) if req.per_alloc else req.source


def host_requests(volumes: Mapping[str, pb.VolumeRequest]) -> list[pb.VolumeRequest]:
    return [v for _, v in sorted(volumes.items()) if v.type == TYPE_HOST]


def node_offers(node: pb.Node, volumes: Mapping[str, pb.VolumeRequest], alloc_name: str) -> bool:
    """Whether `node` has every host volume the group asks for, writable
    where the request is (Nomad's HostVolumeChecker for static volumes)."""
    for req in host_requests(volumes):
        offered = node.host_volumes.get(source_for(req, alloc_name))
        if offered is None:
            return False
        if offered.read_only and not req.read_only:
            return False
    return True


def _escapes(destination: str) -> bool:
    """Whether a path inside the task's root climbs out of it (`..`)."""
    depth = 0
    for part in destination.split("/"):
        if part in ("", "."):
            continue
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


def mount_target(destination: str) -> str:
    """A volume mount's destination as an absolute path inside the task's
    root ("data" and "/data" alike)."""
    return posixpath.normpath("/" + destination.lstrip("/"))


def problem(job: pb.Job) -> tuple[str, str] | None:
    """(proto path, problem) of the first wrong volume request or volume
    mount of `job`, or None (Nomad's VolumeRequest.Validate and the task's
    volume mount checks, and what Corral does not have)."""
    for found in _problems(job):
        return found
    return None


def _problems(job: pb.Job) -> Iterator[tuple[str, str]]:
    for gi, tg in enumerate(job.task_groups):
        gp = f"job.task_groups[{gi}]"
        canaries = tg.update.canary if tg.HasField("update") else 0
        for name in sorted(tg.volumes):
            req = tg.volumes[name]
            vp = f"{gp}.volumes[{name}]"
            if req.type == TYPE_CSI:
                yield f"{vp}.type", "CSI volumes are not supported by Corral (host volumes are)"
            if req.type != TYPE_HOST:
                yield f"{vp}.type", f"volume has unrecognized type {req.type!r} (expected host)"
            if not req.source:
                yield f"{vp}.source", "volume has an empty source"
            if req.sticky:
                yield (
                    f"{vp}.sticky",
                    "sticky volumes (dynamic host volumes) are not supported by Corral",
                )
            if req.per_alloc:
                if job.type in (JobType.SYSTEM, JobType.SYSBATCH):
                    yield (
                        f"{vp}.per_alloc",
                        "volume cannot be per_alloc for system or sysbatch jobs",
                    )
                if canaries > 0:
                    yield f"{vp}.per_alloc", "volume cannot be per_alloc when canaries are in use"
            if req.access_mode not in HOST_ACCESS_MODES:
                yield (
                    f"{vp}.access_mode",
                    f"host volumes cannot be mounted with {req.access_mode} access mode",
                )
            if req.access_mode == ACCESS_SINGLE_NODE_READER and not req.read_only:
                yield f"{vp}.access_mode", f"{req.access_mode} volumes must be read-only"
            if req.attachment_mode not in HOST_ATTACHMENT_MODES:
                yield (
                    f"{vp}.attachment_mode",
                    f"unknown attachment mode {req.attachment_mode!r} "
                    "(expected file-system or block-device)",
                )
        for ti, task in enumerate(tg.tasks):
            for mi, m in enumerate(task.volume_mounts):
                mp = f"{gp}.tasks[{ti}].volume_mounts[{mi}]"
                if not m.volume:
                    yield f"{mp}.volume", "volume mount references an empty volume"
                elif m.volume not in tg.volumes:
                    yield (
                        f"{mp}.volume",
                        f"Volume Mount ({mi}) references undefined volume {m.volume}",
                    )
                if not m.destination:
                    yield f"{mp}.destination", "is required"
                elif _escapes(m.destination):
                    yield f"{mp}.destination", "must not leave the task's directory (..)"
                if m.propagation_mode in PROPAGATION_UNSUPPORTED:
                    yield (
                        f"{mp}.propagation_mode",
                        f"propagation mode {m.propagation_mode!r} is not supported by Corral "
                        "(its mounts are private to the task)",
                    )
                elif m.propagation_mode not in ("", PROPAGATION_PRIVATE):
                    yield (
                        f"{mp}.propagation_mode",
                        f"volume mount has an invalid propagation mode: {m.propagation_mode!r}",
                    )
                if m.selinux_label:
                    yield f"{mp}.selinux_label", "SELinux labels are not supported by Corral"
