"""Scaling policies and events in the state (Nomad's updateJobScalingPolicies,
deleteJobScalingPolicies and UpsertScalingEvent).

The stored policies of a job are exactly the policies embedded in its
current version: every registration that writes a new version updates them
in the same transaction, so a policy's id is read from the current job
(no query) and carried to the new one when its key (type, group, task) is
the same. The embedded copy carries the stored policy's id and indexes too,
as in Nomad, where the job and the policy table share one object.
"""

from __future__ import annotations

from corral.domain import scaling
from corral.domain.structs import copy_msg
from corral.v1 import structs_pb2 as pb
from services.state.db.database import WriteTx


def carry_ids(current: pb.Job | None, job: pb.Job) -> None:
    """Give `job`'s policies the ids and indexes of `current`'s policies of
    the same key (new ids for new keys), in place, before the two versions
    are compared: an unchanged policy then leaves the spec unchanged."""
    known = {scaling.key(p): p for p in scaling.embedded(current)} if current is not None else {}
    scaling.assign_ids(job, {k: p.id for k, p in known.items()})
    for p in scaling.embedded(job):
        before = known.get(scaling.key(p))
        if before is not None:
            p.create_index, p.modify_index = before.create_index, before.modify_index
        else:
            p.create_index = p.modify_index = 0


def update_policies(tx: WriteTx, current: pb.Job | None, job: pb.Job) -> None:
    """Write the policies of `job` (a new version, ids carried by
    `carry_ids`) that are new or changed, delete those of `current` it no
    longer has; stamp the written ones' indexes back into `job`."""
    before = {scaling.key(p): p for p in scaling.embedded(current)} if current is not None else {}
    keys = set()
    for p in scaling.embedded(job):
        k = scaling.key(p)
        keys.add(k)
        old = before.get(k)
        if old is not None and scaling.same_spec(old, p):
            continue
        stored = copy_msg(p)
        stored.create_index = old.create_index if old is not None else 0
        tx.put_scaling_policy(stored)
        p.create_index, p.modify_index = stored.create_index, stored.modify_index
    for k, old in before.items():
        if k not in keys:
            tx.delete_scaling_policy(old)


def purge(tx: WriteTx, job: pb.Job, events: pb.JobScalingEvents | None) -> None:
    """A purged job's policies and its scaling events (`events`, as read in
    this transaction) go with it. Called after every check of the write:
    it only queues deletes."""
    for p in scaling.embedded(job):
        tx.delete_scaling_policy(p)
    if events is not None:
        tx.delete_scaling_events(events)


async def record_event(
    tx: WriteTx, namespace: str, job_id: str, group: str, event: pb.ScalingEvent
) -> None:
    """Prepend `event` to the group's events, keeping the newest
    `scaling.MAX_EVENTS`."""
    current = await tx.get_scaling_events(namespace, job_id)
    out = (
        copy_msg(current)
        if current is not None
        else pb.JobScalingEvents(namespace=namespace, job_id=job_id)
    )
    event = copy_msg(event)
    event.create_index = tx.index
    kept = list(out.scaling_events[group].events)[: scaling.MAX_EVENTS - 1]
    del out.scaling_events[group].events[:]
    out.scaling_events[group].events.extend([event, *kept])
    tx.put_scaling_events(out)
