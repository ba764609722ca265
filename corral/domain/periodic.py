"""Periodic jobs: cron specs, their time zone, the next launch and the child
job a launch creates. Shared by the state (validation, launch records), the
broker's dispatcher (launches) and the CLI (jobspec checks, `job status`).

Cron expressions are evaluated by `cronsim` (Debian cron's semantics, also
across daylight-saving changes: a fixed-time job runs once when its hour is
skipped or repeated). The field layouts are Nomad's:

* 5 fields: minute hour day-of-month month day-of-week;
* 6 fields: the same plus a year, which must be `*`;
* 7 fields: second first, then the 5 fields, then a year (`*`);
* `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`.

Years other than `*` are refused at registration rather than ignored.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from corral.domain.structs import copy_msg
from corral.v1 import structs_pb2 as pb

LAUNCH_SUFFIX = "/periodic-"
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_CHILD = re.compile(r"^(?P<parent>.+)" + re.escape(LAUNCH_SUFFIX) + r"(?P<unix>\d+)$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PeriodicError(ValueError):
    """A periodic block that cannot work; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def specs(cfg: pb.PeriodicConfig) -> list[str]:
    """The cron expressions of a periodic block (`cron` or `crons`)."""
    return [cfg.spec] if cfg.spec else list(cfg.crons)


def is_active(job: pb.Job) -> bool:
    """A parent the dispatcher launches: periodic, enabled, not stopped,
    not parameterized (Nomad's IsPeriodicActive)."""
    return (
        job.HasField("periodic")
        and job.periodic.enabled
        and not job.stop
        and not job.HasField("parameterized")
    )


def _cronsim_expr(spec: str) -> str:
    """Nomad's field layouts mapped onto cronsim's (5 fields, or 6 with
    seconds first)."""
    expr = _MACROS.get(spec.strip().lower(), spec.strip())
    fields = expr.split()
    if len(fields) == 5:
        return expr
    if len(fields) in (6, 7):
        if fields[-1] != "*":
            raise CronSimError("a year other than * is not supported")
        return " ".join(fields[:-1])
    raise CronSimError(f"{len(fields)} fields (5, 6 or 7 expected)")


def parse_cron(spec: str) -> str:
    """Check one expression; return it in cronsim's layout or raise
    ValueError saying what is wrong."""
    try:
        expr = _cronsim_expr(spec)
        CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(f"invalid cron expression {spec!r}: {exc}") from None
    return expr


def location(cfg: pb.PeriodicConfig) -> ZoneInfo:
    """The time zone the cron specs are read in (UTC when unset)."""
    name = cfg.time_zone or "UTC"
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}") from None


def validate(cfg: pb.PeriodicConfig, field: str = "job.periodic") -> None:
    """Every problem the dispatcher would hit, raised as PeriodicError."""
    if cfg.spec and cfg.crons:
        raise PeriodicError(f"{field}.crons", "use either cron or crons, not both")
    exprs = specs(cfg)
    if not any(s.strip() for s in exprs):
        raise PeriodicError(f"{field}.spec", "a cron expression is required")
    for i, spec in enumerate(exprs):
        name = f"{field}.spec" if cfg.spec else f"{field}.crons[{i}]"
        try:
            parse_cron(spec)
        except ValueError as exc:
            raise PeriodicError(name, str(exc)) from None
    try:
        location(cfg)
    except ValueError as exc:
        raise PeriodicError(f"{field}.time_zone", str(exc)) from None


def next_launch(cfg: pb.PeriodicConfig, after: datetime) -> datetime | None:
    """The earliest time strictly after `after` at which any spec matches,
    in the block's time zone; None if no spec can match again."""
    tz = location(cfg)
    start = after.astimezone(tz)
    best: datetime | None = None
    for spec in specs(cfg):
        try:
            t = next(iter(CronSim(parse_cron(spec), start)))
        except StopIteration:
            continue
        if best is None or t < best:
            best = t
    return best


def from_unix_ns(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)


def to_unix_ns(t: datetime) -> int:
    delta = t.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def child_id(parent_id: str, launch: datetime) -> str:
    """`<parent>/periodic-<unix seconds>`: the same tick always names the
    same child, so a launch registered twice is the same job."""
    return f"{parent_id}{LAUNCH_SUFFIX}{int(launch.timestamp())}"


def launch_of(child_job_id: str, parent_id: str) -> int | None:
    """The launch time (unix ns) a child's id encodes, if it is one of
    `parent_id`'s periodic children."""
    m = _CHILD.match(child_job_id)
    if m is None or m.group("parent") != parent_id:
        return None
    return int(m.group("unix")) * 1_000_000_000


def derive_child(parent: pb.Job, launch: datetime) -> pb.Job:
    """The child a launch registers: a copy of the parent's spec with a
    derived id and name, no periodic block, the parent recorded."""
    child = copy_msg(parent)
    child.id = child_id(parent.id, launch)
    child.name = child.id
    child.parent_id = parent.id
    child.ClearField("periodic")
    for f in (
        "status",
        "status_description",
        "version",
        "submit_time",
        "create_index",
        "modify_index",
        "job_modify_index",
        "stable",
        "stop",
    ):
        child.ClearField(f)
    return child
