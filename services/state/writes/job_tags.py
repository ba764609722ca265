"""Job version tags (Nomad 1.9's Job.TagVersion): a name given to one
version of a job, unique among the job's versions, to find that version
again (`job revert JOB NAME`, `job history`). The tag lives on the stored
version (and on the job row when it is the current version), as Nomad keeps
`VersionTag` on the job; a new version starts untagged."""

from __future__ import annotations

from corral.domain.errors import InvalidArgument, NotFound
from corral.domain.structs import copy_msg
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.db.database import WriteTx

#: the longest tag description (a tag name is a name: validate.MAX_NAME_LEN)
MAX_DESCRIPTION_LEN = validate.MAX_META_VALUE_LEN


def check_tag(name: str, description: str) -> None:
    if not name:
        raise InvalidArgument("name", "is required: the version tag's name")
    validate.name_length(name, "name")
    if len(description) > MAX_DESCRIPTION_LEN:
        raise InvalidArgument("description", f"is longer than {MAX_DESCRIPTION_LEN} characters")


async def _current(tx: WriteTx, namespace: str, job_id: str) -> pb.Job:
    job = await tx.get_job(namespace, job_id)
    if job is None:
        raise NotFound(f"job {job_id!r} not found in namespace {namespace!r}")
    return job


def _write(tx: WriteTx, current: pb.Job, version: pb.Job) -> None:
    """Store a retagged version: the job row too when it is the current one."""
    version.modify_index = tx.index
    if version.version == current.version:
        tx.put_job(version, EventType.JOB_VERSION)
    else:
        tx.put_job_version(version)


async def tag_version(
    tx: WriteTx,
    namespace: str,
    job_id: str,
    *,
    name: str,
    description: str,
    version: int,
    latest: bool,
) -> pb.Job:
    """Give `version` (the current one with `latest`) the tag `name`;
    the same name again on the same version changes its description. The
    name may not be on another version of the job. Returns the version."""
    check_tag(name, description)
    if latest and version > 0:
        raise InvalidArgument("version", f"must be zero when tagging latest, got: {version}")
    current = await _current(tx, namespace, job_id)
    if latest:
        version = current.version
    found: pb.Job | None = None
    for v in await tx.job_versions(namespace, job_id):
        if v.version == version:
            # the job row is the current version as it stands (its status)
            found = current if version == current.version else v
        elif v.version_tag.name == name:
            raise InvalidArgument(
                "name",
                f"tag {name!r} already exists on a different version ({v.version}) "
                f"of job {job_id!r}",
            )
    if found is None:
        raise NotFound(f"job {job_id!r} version {version} not found")
    tagged = copy_msg(found)
    tagged.version_tag.CopyFrom(
        pb.JobVersionTag(name=name, description=description, tagged_time=tx.now)
    )
    _write(tx, current, tagged)
    return tagged


async def untag_version(tx: WriteTx, namespace: str, job_id: str, name: str) -> pb.Job:
    """Take the tag `name` away from the version that has it; returns that
    version as it was (with the tag)."""
    if not name:
        raise InvalidArgument("name", "is required: the version tag's name")
    current = await _current(tx, namespace, job_id)
    for v in await tx.job_versions(namespace, job_id):
        if v.version_tag.name == name:
            untagged = copy_msg(current if v.version == current.version else v)
            untagged.ClearField("version_tag")
            _write(tx, current, untagged)
            return v
    raise NotFound(f"tag {name!r} not found on job {job_id!r}")
