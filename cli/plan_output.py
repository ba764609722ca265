"""Rendering a `Job.Plan` answer the way `nomad job plan` does: the diff
with +/-/~ markers and the scheduler's annotations per task group, then the
dry-run outcome and the check-index to submit with."""

from __future__ import annotations

from typing import TextIO

from cli.diff_output import write_job_diff
from cli.monitor import write_placement_failure
from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb

# Annotation names in the order Nomad prints them.
UPDATE_NAMES = (
    ("place", "create"),
    ("destructive_update", "create/destroy update"),
    ("in_place_update", "in-place update"),
    ("stop", "destroy"),
    ("migrate", "migrate"),
    ("canary", "canary"),
    ("ignore", "ignore"),
    ("preemptions", "preempt"),
    ("reconnect_updates", "reconnect"),
    ("disconnect_updates", "disconnect"),
    ("reschedule_now", "reschedule now"),
    ("reschedule_later", "reschedule later"),
)


def changes(resp: job_pb2.JobPlanResponse) -> bool:
    """True when the plan would create or destroy allocations (exit 1)."""
    if resp.HasField("diff") and resp.diff.type == "None":
        return False
    for d in resp.annotations.desired_tg_updates.values():
        if d.stop + d.place + d.migrate + d.destructive_update + d.canary > 0:
            return True
    return False


def tg_annotation(upd: pb.DesiredUpdates | None, updates: dict[str, int] | None) -> str:
    """'(1 create, 2 ignore)' from the annotations, or from the diff's map."""
    parts: list[str] = []
    if upd is not None:
        for field_name, label in UPDATE_NAMES:
            n = getattr(upd, field_name)
            if n:
                parts.append(f"{n} {label}")
    elif updates:
        parts = [f"{n} {k}" for k, n in sorted(updates.items()) if n]
    return f" ({', '.join(parts)})" if parts else ""


def write_plan(
    out: TextIO,
    job: pb.Job,
    resp: job_pb2.JobPlanResponse,
    *,
    filename: str,
    verbose: bool,
    show_diff: bool = True,
) -> None:
    ann = resp.annotations.desired_tg_updates
    diff = resp.diff if resp.HasField("diff") else None
    if show_diff and diff is not None and diff.type:
        write_job_diff(out, diff, job.id, verbose=verbose, annotations=ann, tg_note=tg_annotation)
        # groups the scheduler annotated that the diff does not list
        listed = {tg.name for tg in diff.task_groups}
        for name in sorted(set(ann) - listed):
            out.write(f'Task Group: "{name}"{tg_annotation(ann[name], None)}\n')
        out.write("\n")
    elif ann:
        out.write(f'Job: "{job.id}"\n')
        for name in sorted(ann):
            out.write(f'Task Group: "{name}"{tg_annotation(ann[name], None)}\n')
        out.write("\n")

    out.write("Scheduler dry-run:\n")
    if resp.failed_tg_allocs:
        out.write("- WARNING: Failed to place all allocations.\n")
        for name, metric in sorted(resp.failed_tg_allocs.items()):
            write_placement_failure(out, name, metric, indent="  ")
    else:
        out.write("- All tasks successfully allocated.\n")
    for pa in resp.annotations.preempted_allocs:
        out.write(
            f'- Preempts alloc "{pa.id[:8]}" of job "{pa.job_id}" (group "{pa.task_group}")\n'
        )
    if resp.next_periodic_launch:
        from cli.output import fmt_time

        out.write(
            "- If submitted now, next periodic launch would be at "
            f"{fmt_time(resp.next_periodic_launch)}\n"
        )
    if resp.warnings:
        out.write(f"\nJob Warnings:\n{resp.warnings}\n")
    out.write(
        f"\nJob Modify Index: {resp.job_modify_index}\n"
        "To submit the job with version verification run:\n\n"
        f"corral job run -check-index {resp.job_modify_index} {filename}\n\n"
        "When running the job with the check-index flag, the job will only be run if the\n"
        "job modify index given matches the server-side version. If the index has\n"
        "changed, another user has modified the job and the plan's results are\n"
        "potentially invalid.\n"
    )
