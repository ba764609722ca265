"""Nomad's task `action` blocks (nomad/structs/actions.go): named commands
defined in the job and run on demand inside a running task of one of its
allocs, as `alloc exec` runs a command (the agent looks the action up in
the job version the alloc runs). Here: the rules a task's actions keep
(checked by the jobspec parser and again by the state on Register) and the
lookups the agent and the gateway make."""

from __future__ import annotations

import re
from collections.abc import Iterator

from corral.domain.task_exec import command_problem
from corral.v1 import structs_pb2 as pb

#: Nomad's validJobActionName: 1 to 128 characters, no whitespace or NUL
#: (a fixed pattern of ours, so Python's `re` is safe here)
_NAME = re.compile(r"^[^\x00\s]{1,128}$")
#: actions one task may define (Nomad sets no bound; every job is bounded here)
MAX_ACTIONS = 100


def problems(task: pb.Task) -> tuple[str, str] | None:
    """The first thing wrong with a task's actions, as (field below the
    task, problem), or None. Nomad's rules: a valid name, a command, no name
    twice in the task."""
    if len(task.actions) > MAX_ACTIONS:
        return "actions", f"has {len(task.actions)} actions, more than {MAX_ACTIONS}"
    seen: set[str] = set()
    for i, action in enumerate(task.actions):
        path = f"actions[{i}]"
        if not _NAME.match(action.name):
            return (
                f"{path}.name",
                f"invalid action name {action.name[:130]!r} (1 to 128 characters, "
                "no whitespace or NUL)",
            )
        if action.name in seen:
            return f"{path}.name", f"action {action.name!r} is defined more than once"
        seen.add(action.name)
        if not action.command:
            return f"{path}.command", f"action {action.name!r}: command cannot be empty"
        problem = command_problem([action.command, *action.args])
        if problem:
            return f"{path}.args", f"action {action.name!r}: the command {problem}"
    return None


def find(task: pb.Task, name: str) -> pb.Action | None:
    """The task's action called `name` (Nomad's Task.GetAction)."""
    return next((a for a in task.actions if a.name == name), None)


def of_job(job: pb.Job) -> Iterator[tuple[str, str, pb.Action]]:
    """Every action of the job as (group, task, action), in the job's
    order (Nomad's Job.GetActions, flattened)."""
    for tg in job.task_groups:
        for task in tg.tasks:
            for action in task.actions:
                yield tg.name, task.name, action
