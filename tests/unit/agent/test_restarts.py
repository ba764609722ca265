"""The restart policy as Nomad's restart tracker applies it
(client/allocrunner/taskrunner/restarts): attempts per interval, the delay
with its jitter, the modes, which clean exits restart, kills and restarts
asked for, and the counters a restarted agent carries on with."""

from __future__ import annotations

import random

from corral.v1 import structs_pb2 as pb
from services.agent.drivers.base import ExitResult
from services.agent.restarts import (
    KILLED,
    NOT_RESTARTING,
    RESTARTING,
    TERMINATED,
    Decision,
    RestartTracker,
    restarting_message,
    restarts_on_success,
)

S = 10**9
FAILED = ExitResult(exit_code=1)
OK = ExitResult(exit_code=0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tracker(clock: Clock, *, on_success: bool = True, **policy: object) -> RestartTracker:
    p = pb.RestartPolicy(attempts=2, interval=60 * S, delay=S, mode="fail")
    for k, v in policy.items():
        setattr(p, k, v)
    return RestartTracker(p, on_success, clock=clock, rng=random.Random(7))


def after(t: RestartTracker, result: ExitResult) -> Decision:
    t.exited(result)
    return t.decide()


def test_attempts_within_the_interval_then_fail_mode_gives_up() -> None:
    clock = Clock()
    t = tracker(clock)
    for _ in range(2):
        d = after(t, FAILED)
        assert d.kind == RESTARTING and 1.0 <= d.delay <= 1.25  # delay plus up to 25% jitter
    d = after(t, FAILED)
    assert d.kind == NOT_RESTARTING
    assert d.reason == 'Exceeded allowed attempts 2 in interval 1m and mode is "fail"'


def test_a_new_interval_starts_the_count_again() -> None:
    clock = Clock()
    t = tracker(clock)
    after(t, FAILED)
    after(t, FAILED)
    clock.now += 61
    assert after(t, FAILED).kind == RESTARTING


def test_delay_mode_waits_for_the_next_interval() -> None:
    clock = Clock()
    t = tracker(clock, mode="delay", attempts=1)
    after(t, FAILED)
    clock.now += 20
    d = after(t, FAILED)
    assert d.kind == RESTARTING and d.delay == 40.0
    assert restarting_message(d) == (
        "Exceeded allowed attempts, applying a delay - Task restarting in 40s"
    )


def test_no_attempts() -> None:
    clock = Clock()
    assert after(tracker(clock, attempts=0), FAILED).kind == NOT_RESTARTING
    assert after(tracker(clock, attempts=0), OK).kind == NOT_RESTARTING  # a service task
    assert after(tracker(clock, attempts=0, on_success=False), OK).kind == TERMINATED


def test_which_clean_exits_restart() -> None:
    def lc(hook: str, sidecar: bool = False) -> pb.TaskLifecycleConfig:
        return pb.TaskLifecycleConfig(hook=hook, sidecar=sidecar)

    assert restarts_on_success("service", None)
    assert not restarts_on_success("batch", None)
    assert not restarts_on_success("sysbatch", None)
    assert not restarts_on_success("service", lc("prestart"))
    assert restarts_on_success("batch", lc("prestart", sidecar=True))
    assert restarts_on_success("service", lc("poststart", sidecar=True))
    assert not restarts_on_success("service", lc("poststart"))
    assert not restarts_on_success("service", lc("poststop"))
    clock = Clock()
    assert after(tracker(clock, on_success=False), OK).kind == TERMINATED
    assert after(tracker(clock), OK).kind == RESTARTING


def test_a_kill_never_restarts_and_an_asked_restart_is_not_counted() -> None:
    clock = Clock()
    t = tracker(clock, attempts=1)
    t.killed()
    assert after(t, FAILED).kind == KILLED
    for _ in range(5):  # a person's restarts do not use up the attempts
        t.restart_asked(failure=False)
        d = after(t, OK)
        assert (d.kind, d.delay) == (RESTARTING, 0.0)
    assert after(t, FAILED).kind == RESTARTING
    t.restart_asked(failure=True)  # a check's restart counts
    assert after(t, FAILED).kind == NOT_RESTARTING


def test_the_counters_outlive_an_agent_restart() -> None:
    clock = Clock()
    t = tracker(clock)
    after(t, FAILED)
    after(t, FAILED)
    again = tracker(clock)
    again.load(t.dump())
    assert after(again, FAILED).kind == NOT_RESTARTING
