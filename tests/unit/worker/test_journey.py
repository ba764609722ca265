"""The journey a worker records on the eval it ran (services/worker/
planner_bridge.py): its own writes carry the times, follow-ups none."""

from __future__ import annotations

from corral.domain.structs import new_id
from corral.v1 import structs_pb2 as pb
from services.worker.planner_bridge import Journey


def test_the_dequeued_eval_carries_the_run_and_a_follow_up_does_not() -> None:
    ran = pb.Evaluation(id=new_id(), status="complete")
    j = Journey(ran.id, enqueue_time=10, dequeue_time=20, plan_submit_time=30)
    j.stamp(ran)
    assert (ran.enqueue_time, ran.dequeue_time, ran.plan_submit_time) == (10, 20, 30)

    # a follow-up copied from the eval (the scheduler's next/blocked eval)
    follow = pb.Evaluation()
    follow.CopyFrom(ran)
    follow.id = new_id()
    follow.previous_eval = ran.id
    j.stamp(follow)
    assert (follow.enqueue_time, follow.dequeue_time, follow.plan_submit_time) == (0, 0, 0)


def test_a_rerun_replaces_an_earlier_runs_times() -> None:
    # a blocked eval dequeued again arrives with its last run's times
    ev = pb.Evaluation(id=new_id(), enqueue_time=1, dequeue_time=2, plan_submit_time=3)
    Journey(ev.id, enqueue_time=0, dequeue_time=50).stamp(ev)
    assert (ev.enqueue_time, ev.dequeue_time, ev.plan_submit_time) == (0, 50, 0)
