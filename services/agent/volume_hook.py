"""Host volumes on the client (Nomad's volume hook): before a task starts,
every host volume its group asks for must be one this node offers (the
agent may have been restarted without it since the alloc was placed), a
task that mounts one needs a driver that mounts (raw_exec does not, as in
Nomad), and its `volume_mount` blocks become the driver's mounts:
read-only when the node's volume, the group's request or the mount says so.
"""

from __future__ import annotations

from corral.domain import volumes
from corral.v1 import structs_pb2 as pb
from services.agent.drivers.base import Capabilities, Mount
from services.agent.taskenv import TaskEnv, interpolate


class VolumeError(Exception):
    """The task cannot have its volumes here; the message is the task event's."""


def check(
    alloc: pb.Allocation, tg: pb.TaskGroup, task: pb.Task, node: pb.Node, driver: Capabilities
) -> None:
    missing = [
        source
        for req in volumes.host_requests(tg.volumes)
        if (source := volumes.source_for(req, alloc.name)) not in node.host_volumes
    ]
    if missing:
        raise VolumeError(f"host volume validation error: missing {', '.join(missing)}")
    if task.volume_mounts and not driver.mounts:
        raise VolumeError(
            f'task driver "{task.driver}" for "{task.name}" does not support host volumes'
        )


def mounts(
    alloc: pb.Allocation, tg: pb.TaskGroup, task: pb.Task, node: pb.Node, env: TaskEnv
) -> list[Mount]:
    """The task's mounts (after `check`): `${...}` in a mount's volume and
    destination resolved from the task's environment, as Nomad does."""
    out = []
    for m in task.volume_mounts:
        req = tg.volumes.get(interpolate(m.volume, env.variables))
        if req is None or req.type != volumes.TYPE_HOST:
            continue
        offered = node.host_volumes.get(volumes.source_for(req, alloc.name))
        if offered is None:
            raise VolumeError(f"no host volume named: {volumes.source_for(req, alloc.name)}")
        out.append(
            Mount(
                host_path=offered.path,
                task_path=volumes.mount_target(interpolate(m.destination, env.variables)),
                read_only=offered.read_only or req.read_only or m.read_only,
            )
        )
    return out
