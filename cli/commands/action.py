"""`corral action` (and `corral job action`): run one of a job's actions,
Nomad's `nomad action -job J [-alloc A | -group G -task T] NAME`.

The command and arguments come from the job, looked up by the agent in the
version the alloc runs; the session itself is `alloc exec`'s (the same
stdin, terminal and escape handling, the same ACL: alloc-exec, and
alloc-node-exec for a driver without file system isolation). Without
`-alloc`, a random running alloc of the group is picked, as Nomad does. The
exit code is the action's."""

from __future__ import annotations

import argparse
from typing import Any

from cli.allocs import get_alloc
from cli.commands.alloc_access import (
    ExecSession,
    alloc_agent,
    alloc_task,
    random_job_alloc,
    terminal_flags,
    terminal_options,
)
from cli.context import CliError, Context, common
from cli.jobs import resolve_job
from cli.output import short
from corral.v1 import alloc_pb2


def _add(sub: Any, help_text: str) -> None:
    p = sub.add_parser(
        "action",
        help=help_text,
        description="Run the action NAME of a task of JOB inside a running alloc: "
        "-alloc names it, or -group and -task pick a random running alloc of the group. "
        "Exits with the action's exit code.",
    )
    p.add_argument("-job", "--job", dest="job", default="", help="the job defining the action")
    p.add_argument("-alloc", "--alloc", dest="alloc", default="", help="alloc id or prefix")
    p.add_argument("-task", "--task", dest="task", default="", help="the task defining it")
    p.add_argument("-group", "--group", dest="group", default="", help="the task's group")
    terminal_flags(p)
    p.add_argument("name", nargs="?", default="", metavar="NAME", help="the action's name")
    p.set_defaults(func=cmd_action)
    common(p)


def register(sub: Any) -> None:
    """`corral action`."""
    _add(sub, "Run a pre-defined action of a job's task")


def register_job_action(jobs: Any) -> None:
    """`corral job action` (the same command, as Nomad has both)."""
    _add(jobs, "Run a pre-defined action of a job's task")


def cmd_action(args: argparse.Namespace, ctx: Context) -> int:
    if not args.name:
        raise CliError("an action name is required (corral action -job JOB ... NAME)")
    if not args.job:
        raise CliError("a job ID is required (-job)")
    use_tty, escape = terminal_options(args)
    job = resolve_job(ctx, args.job)
    if args.alloc:
        a = get_alloc(ctx, args.alloc)
        if a.job_id != job.id or a.namespace != job.namespace:
            raise CliError(f'allocation "{short(a.id)}" is not an allocation of job {job.id}')
    else:
        if not args.group:
            raise CliError("a group name is required if no allocation is provided (-group)")
        if not args.task:
            raise CliError("a task name is required if no allocation is provided (-task)")
        a = random_job_alloc(ctx, job.id, args.group)
    task = alloc_task(a, args.task)
    setup = alloc_pb2.ExecSetup(
        alloc_id=a.id, task=task, action=args.name, job_id=job.id, tty=use_tty
    )
    session = ExecSession(setup, stdin=args.stdin, tty=use_tty, escape=escape)
    return session.run(ctx.client.client_alloc(alloc_agent(ctx, a)))
