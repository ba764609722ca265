"""When each task of an alloc may start (Nomad's tasklifecycle.Coordinator).

A task's stage comes from its `lifecycle` block: prestart (ephemeral or
sidecar), main (no block), poststart (ephemeral or sidecar), poststop. The
coordinator is a small state machine over the alloc's task states; each
state opens the gates of the stages allowed to run and closes the others:

    init        every task pending (nothing may start yet)
    prestart    prestart tasks run
    main        every non-sidecar prestart task succeeded and every
                prestart sidecar runs: main tasks start (sidecars go on)
    poststart   no main task is pending any more: poststart tasks start
    wait_alloc  every ephemeral poststart task ended
    poststop    every task but the poststop ones is dead: poststop tasks run

A stage with no task is passed straight through. A prestart task that
fails for good keeps the alloc in `prestart`, so the main tasks never
start (the alloc runner then fails the alloc, as Nomad does).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping

from corral.domain.structs import TaskStateName
from corral.v1 import structs_pb2 as pb


class Stage(enum.Enum):
    PRESTART_EPHEMERAL = "prestart"
    PRESTART_SIDECAR = "prestart sidecar"
    MAIN = "main"
    POSTSTART_EPHEMERAL = "poststart"
    POSTSTART_SIDECAR = "poststart sidecar"
    POSTSTOP = "poststop"


class State(enum.Enum):
    INIT = "init"
    PRESTART = "prestart"
    MAIN = "main"
    POSTSTART = "poststart"
    WAIT_ALLOC = "wait_alloc"
    POSTSTOP = "poststop"


#: which stages may run in each state (the others are blocked)
ALLOWED: dict[State, frozenset[Stage]] = {
    State.INIT: frozenset(),
    State.PRESTART: frozenset({Stage.PRESTART_EPHEMERAL, Stage.PRESTART_SIDECAR}),
    State.MAIN: frozenset({Stage.PRESTART_SIDECAR, Stage.MAIN}),
    State.POSTSTART: frozenset(
        {Stage.PRESTART_SIDECAR, Stage.MAIN, Stage.POSTSTART_EPHEMERAL, Stage.POSTSTART_SIDECAR}
    ),
    State.WAIT_ALLOC: frozenset({Stage.PRESTART_SIDECAR, Stage.MAIN, Stage.POSTSTART_SIDECAR}),
    State.POSTSTOP: frozenset({Stage.POSTSTOP}),
}


def stage_of(task: pb.Task) -> Stage:
    hook = task.lifecycle.hook if task.HasField("lifecycle") else ""
    sidecar = task.lifecycle.sidecar
    if hook == "prestart":
        return Stage.PRESTART_SIDECAR if sidecar else Stage.PRESTART_EPHEMERAL
    if hook == "poststart":
        return Stage.POSTSTART_SIDECAR if sidecar else Stage.POSTSTART_EPHEMERAL
    if hook == "poststop":
        return Stage.POSTSTOP
    return Stage.MAIN


def is_sidecar(task: pb.Task) -> bool:
    return stage_of(task) in (Stage.PRESTART_SIDECAR, Stage.POSTSTART_SIDECAR)


def successful(state: pb.TaskState) -> bool:
    """Nomad's TaskState.Successful: dead, not failed."""
    return state.state == TaskStateName.DEAD and not state.failed


class Coordinator:
    def __init__(self, tasks: list[pb.Task]) -> None:
        self.by_stage: dict[Stage, list[str]] = {}
        for task in tasks:
            self.by_stage.setdefault(stage_of(task), []).append(task.name)
        self.gates = {stage: asyncio.Event() for stage in Stage}
        self.state = State.INIT
        self._enter(State.INIT)

    async def wait(self, task: pb.Task) -> None:
        """Until `task` may start."""
        await self.gates[stage_of(task)].wait()

    def may_start(self, task: pb.Task) -> bool:
        return self.gates[stage_of(task)].is_set()

    def restart(self) -> None:
        """Every task will run again (alloc restart of all tasks): back to init."""
        self._enter(State.INIT)

    def restore(self, states: Mapping[str, pb.TaskState]) -> None:
        """After an agent restart: the tasks may be running already, so skip
        init (which waits for all of them to be pending)."""
        self._enter(State.PRESTART)
        self.update(states)

    def update(self, states: Mapping[str, pb.TaskState]) -> None:
        """The task states changed: move through as many states as they allow."""
        while True:
            following = self._next(states)
            if following == self.state:
                return
            self._enter(following)

    def _next(self, states: Mapping[str, pb.TaskState]) -> State:
        if self._alloc_done(states):
            return State.POSTSTOP
        s = self.state
        if s is State.INIT:
            pending = all(st.state == TaskStateName.PENDING for st in states.values())
            return State.PRESTART if pending else s
        if s is State.PRESTART:
            return State.MAIN if self._prestart_done(states) else s
        if s is State.MAIN:
            main = self.by_stage.get(Stage.MAIN, [])
            started = all(_state(states, t) != TaskStateName.PENDING for t in main)
            return State.POSTSTART if started else s
        if s is State.POSTSTART:
            ephemeral = self.by_stage.get(Stage.POSTSTART_EPHEMERAL, [])
            ended = all(_state(states, t) == TaskStateName.DEAD for t in ephemeral)
            return State.WAIT_ALLOC if ended else s
        return s  # wait_alloc and poststop move only when the alloc is done

    def _prestart_done(self, states: Mapping[str, pb.TaskState]) -> bool:
        for name in self.by_stage.get(Stage.PRESTART_EPHEMERAL, []):
            state = states.get(name)
            if state is None or not successful(state):
                return False
        return all(
            _state(states, name) == TaskStateName.RUNNING
            for name in self.by_stage.get(Stage.PRESTART_SIDECAR, [])
        )

    def _alloc_done(self, states: Mapping[str, pb.TaskState]) -> bool:
        return all(
            _state(states, name) == TaskStateName.DEAD
            for stage, names in self.by_stage.items()
            if stage is not Stage.POSTSTOP
            for name in names
        )

    def _enter(self, state: State) -> None:
        allowed = ALLOWED[state]
        for stage, gate in self.gates.items():
            if stage in allowed:
                gate.set()
            else:
                gate.clear()
        self.state = state


def _state(states: Mapping[str, pb.TaskState], name: str) -> str:
    state = states.get(name)
    return state.state if state is not None else TaskStateName.PENDING
