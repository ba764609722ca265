"""A task's place in its alloc and what of its output is kept, as Nomad
checks them (nomad/structs: TaskLifecycleConfig, LogConfig, a group's main
tasks): one set of rules for the job parser and the state."""

from __future__ import annotations

from corral.v1 import structs_pb2 as pb

HOOKS = ("prestart", "poststart", "poststop")
#: Nomad's DefaultLogConfig
DEFAULT_LOG_MAX_FILES = 10
DEFAULT_LOG_MAX_FILE_SIZE_MB = 10


def is_main(task: pb.Task) -> bool:
    return not task.HasField("lifecycle") or not task.lifecycle.hook


def default_log_config(task: pb.Task) -> None:
    """Nomad's canonicalization: a task without a logs block keeps 10
    files of 10 MB per stream; a block leaving a size out gets its default."""
    lc = task.log_config
    lc.max_files = lc.max_files or DEFAULT_LOG_MAX_FILES
    lc.max_file_size_mb = lc.max_file_size_mb or DEFAULT_LOG_MAX_FILE_SIZE_MB


def lifecycle_problem(task: pb.Task) -> str | None:
    if not task.HasField("lifecycle"):
        return None
    hook = task.lifecycle.hook
    if not hook:
        return "no lifecycle hook provided (prestart, poststart or poststop)"
    if hook not in HOOKS:
        return f"invalid hook {hook!r} (prestart, poststart or poststop)"
    return None


def log_config_problem(task: pb.Task, disk_mb: int) -> tuple[str, str] | None:
    """(field, problem) of the task's logs block, or None. The files a task
    may keep must fit in the group's ephemeral disk (Nomad's check)."""
    lc = task.log_config
    if lc.max_files < 1:
        return "max_files", f"minimum number of files is 1; got {lc.max_files}"
    if lc.max_file_size_mb < 1:
        return "max_file_size_mb", f"minimum file size is 1MB; got {lc.max_file_size_mb}"
    usage = lc.max_files * lc.max_file_size_mb
    if disk_mb and disk_mb <= usage:
        return (
            "max_files",
            f"log storage ({usage} MB) must be less than requested disk capacity ({disk_mb} MB)",
        )
    return None


def main_task_problem(tg: pb.TaskGroup) -> str | None:
    if tg.tasks and not any(is_main(t) for t in tg.tasks):
        return f"task group {tg.name!r} must have at least one main task (one without lifecycle)"
    return None
