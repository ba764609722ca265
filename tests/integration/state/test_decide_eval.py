"""`State.DecideEval` on a real state service (issue 30, one hop per
decision): a worker's created evals and outcome are written in one
transaction, the change batch carries the decision (eval id, token,
outcome) for the broker, and a bad decision is refused naming the problem
with nothing written."""

from __future__ import annotations

import grpc
import pytest

from corral.domain.structs import EvalStatus
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.integration.state.helpers import pending_eval


async def _held(stub: state_pb2_grpc.StateAsyncStub, leader: str, job: str) -> pb.Evaluation:
    """A pending eval as the broker writes it (the one a worker holds)."""
    ev = pending_eval(job)
    await stub.UpsertEvals(state_pb2.UpsertEvalsRequest(evals=[ev], leader_id=leader))
    return ev


async def _batch(stub: state_pb2_grpc.StateAsyncStub, index: int) -> pb.ChangeBatch:
    async for batch in stub.Subscribe(state_pb2.SubscribeRequest(from_index=index - 1)):
        assert batch.index == index
        return batch
    raise AssertionError("the feed ended")


async def _index(stub: state_pb2_grpc.StateAsyncStub) -> int:
    return int((await stub.GetIndex(state_pb2.GetIndexRequest())).index)


async def test_created_then_outcome_each_one_write_carrying_the_decision(
    state_stub: state_pb2_grpc.StateAsyncStub, broker_leader: str
) -> None:
    held = await _held(state_stub, broker_leader, "decide-web")
    # before a plan: the evals it may refer to, without an outcome
    blocked = pending_eval("decide-web", status=EvalStatus.BLOCKED, previous_eval=held.id)
    resp = await state_stub.DecideEval(
        state_pb2.DecideEvalRequest(eval_id=held.id, token="tok", created=[blocked])
    )
    batch = await _batch(state_stub, resp.index)
    assert [e.evaluation.id for e in batch.events if e.topic == "Evaluation"] == [blocked.id]
    assert [(d.eval_id, d.token, d.outcome) for d in batch.eval_decisions] == [
        (held.id, "tok", False)
    ]

    # the outcome with a follow-up: one write, one index, the ack's decision
    done = pb.Evaluation()
    done.CopyFrom(held)
    done.status = EvalStatus.COMPLETE
    follow = pending_eval("decide-web", previous_eval=held.id, wait=10**9)
    resp = await state_stub.DecideEval(
        state_pb2.DecideEvalRequest(eval_id=held.id, token="tok", outcome=done, created=[follow])
    )
    batch = await _batch(state_stub, resp.index)
    written = {
        e.evaluation.id: e.evaluation.status for e in batch.events if e.topic == "Evaluation"
    }
    assert written[held.id] == EvalStatus.COMPLETE
    assert written[follow.id] == EvalStatus.PENDING
    # completing the job's eval cancelled its blocked eval (UpsertEvals' rule)
    assert written[blocked.id] == EvalStatus.CANCELED
    assert [(d.eval_id, d.outcome) for d in batch.eval_decisions] == [(held.id, True)]


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("no token", grpc.StatusCode.INVALID_ARGUMENT, "token"),
        ("nothing", grpc.StatusCode.INVALID_ARGUMENT, "outcome"),
        ("pending outcome", grpc.StatusCode.INVALID_ARGUMENT, "outcome.status"),
        ("another eval's outcome", grpc.StatusCode.INVALID_ARGUMENT, "outcome.id"),
        ("not a follow-up", grpc.StatusCode.INVALID_ARGUMENT, "previous_eval"),
        ("created exists", grpc.StatusCode.ALREADY_EXISTS, "already exists"),
        ("reblock of a non-blocked eval", grpc.StatusCode.FAILED_PRECONDITION, "not blocked"),
        ("held eval gone", grpc.StatusCode.NOT_FOUND, "not found"),
    ],
)
async def test_bad_decisions_are_refused_and_write_nothing(
    state_stub: state_pb2_grpc.StateAsyncStub,
    broker_leader: str,
    case: str,
    code: grpc.StatusCode,
    words: str,
) -> None:
    held = await _held(state_stub, broker_leader, "decide-bad")
    outcome = pb.Evaluation()
    outcome.CopyFrom(held)
    outcome.status = EvalStatus.COMPLETE
    follow = pending_eval("decide-bad", previous_eval=held.id)
    req = state_pb2.DecideEvalRequest(eval_id=held.id, token="tok", outcome=outcome)
    if case == "no token":
        req.token = ""
    elif case == "nothing":
        req.ClearField("outcome")
    elif case == "pending outcome":
        req.outcome.status = EvalStatus.PENDING
    elif case == "another eval's outcome":
        req.outcome.id = follow.id
    elif case == "not a follow-up":
        follow.previous_eval = "someone-else"
        req.created.append(follow)
    elif case == "created exists":
        req.created.append(held)  # the held eval itself
        req.created[0].previous_eval = held.id
        req.created[0].id = (await _held(state_stub, broker_leader, "decide-bad")).id
    elif case == "reblock of a non-blocked eval":
        req.outcome.status = EvalStatus.BLOCKED
    elif case == "held eval gone":
        req.eval_id = req.outcome.id = "never-written"
    before = await _index(state_stub)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await state_stub.DecideEval(req)
    assert err.value.code() == code, err.value.details()
    assert words in (err.value.details() or "")
    assert await _index(state_stub) == before
