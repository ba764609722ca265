"""Nomad's task lifecycle coordinator: which tasks may start as the task
states move (tasklifecycle/coordinator_test.go's cases)."""

from __future__ import annotations

from corral.v1 import structs_pb2 as pb
from services.agent.lifecycle import Coordinator, State


def task(name: str, hook: str = "", sidecar: bool = False) -> pb.Task:
    t = pb.Task(name=name)
    if hook:
        t.lifecycle.CopyFrom(pb.TaskLifecycleConfig(hook=hook, sidecar=sidecar))
    return t


TASKS = [
    task("init", "prestart"),
    task("proxy", "prestart", sidecar=True),
    task("main"),
    task("warm", "poststart"),
    task("log", "poststart", sidecar=True),
    task("cleanup", "poststop"),
]


def states(**by_name: str) -> dict[str, pb.TaskState]:
    out = {t.name: pb.TaskState(state="pending") for t in TASKS}
    for name, value in by_name.items():
        state, _, failed = value.partition("/")
        out[name] = pb.TaskState(state=state, failed=failed == "failed")
    return out


def at(c: Coordinator) -> State:
    return c.state


def allowed(c: Coordinator) -> set[str]:
    return {t.name for t in TASKS if c.may_start(t)}


def test_the_lifecycle_order() -> None:
    c = Coordinator(TASKS)
    assert allowed(c) == set()
    c.update(states())
    assert at(c) is State.PRESTART and allowed(c) == {"init", "proxy"}
    c.update(states(init="running", proxy="running"))
    assert allowed(c) == {"init", "proxy"}  # init has not succeeded yet
    c.update(states(init="dead", proxy="running"))
    assert at(c) is State.MAIN and allowed(c) == {"proxy", "main"}
    c.update(states(init="dead", proxy="running", main="running"))
    assert at(c) is State.POSTSTART and allowed(c) == {"proxy", "main", "warm", "log"}
    c.update(states(init="dead", proxy="running", main="running", warm="dead", log="running"))
    assert at(c) is State.WAIT_ALLOC and allowed(c) == {"proxy", "main", "log"}
    c.update(states(init="dead", proxy="dead", main="dead", warm="dead", log="dead"))
    assert at(c) is State.POSTSTOP and allowed(c) == {"cleanup"}


def test_a_failed_prestart_task_keeps_the_main_tasks_waiting() -> None:
    c = Coordinator(TASKS)
    c.update(states())
    c.update(states(init="dead/failed", proxy="running"))
    assert at(c) is State.PRESTART and "main" not in allowed(c)


def test_stages_without_tasks_are_passed_through() -> None:
    c = Coordinator([task("main")])
    c.update({"main": pb.TaskState(state="pending")})
    assert at(c) is State.MAIN and c.may_start(task("main"))


def test_restore_does_not_wait_for_every_task_to_be_pending() -> None:
    c = Coordinator(TASKS)
    c.restore(states(init="dead", proxy="running", main="running", log="running"))
    assert at(c) is State.POSTSTART and "warm" in allowed(c)


def test_restart_goes_back_to_the_start() -> None:
    c = Coordinator(TASKS)
    c.update(states())
    c.update(states(init="dead", proxy="running", main="running"))
    c.restart()
    assert at(c) is State.INIT and allowed(c) == set()
    c.update(states())
    assert allowed(c) == {"init", "proxy"}
