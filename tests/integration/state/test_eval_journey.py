"""An eval's journey times (enqueue, dequeue, plan submit: issue 20's UI
timeline) ride on the eval blob through UpsertEvals and Evals.Get, and a
later rewrite by a writer that did not run the eval keeps them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from corral.domain.structs import EvalStatus
from corral.security import transport
from corral.v1 import eval_pb2, eval_pb2_grpc, query_pb2, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.integration.state.helpers import pending_eval

MS = 1_000_000
T0 = 1_790_000_000_000 * MS


@pytest.fixture(scope="module")
async def evals_stub(state_app: StateApp) -> AsyncIterator[eval_pb2_grpc.EvalsAsyncStub]:
    async with transport.dial(state_app.server.bound_address) as channel:
        yield eval_pb2_grpc.EvalsStub(channel)


def _times(ev: pb.Evaluation) -> tuple[int, int, int]:
    return ev.enqueue_time, ev.dequeue_time, ev.plan_submit_time


async def _write(stub: state_pb2_grpc.StateAsyncStub, ev: pb.Evaluation, leader: str) -> int:
    resp = await stub.UpsertEvals(state_pb2.UpsertEvalsRequest(evals=[ev], leader_id=leader))
    return int(resp.index)


async def _get(stub: eval_pb2_grpc.EvalsAsyncStub, eval_id: str, index: int) -> pb.Evaluation:
    resp = await stub.Get(
        eval_pb2.EvalGetRequest(eval_id=eval_id, query=query_pb2.QueryOptions(min_index=index - 1))
    )
    return resp.eval


async def test_journey_times_survive_upsert_get_and_a_foreign_rewrite(
    state_stub: state_pb2_grpc.StateAsyncStub,
    evals_stub: eval_pb2_grpc.EvalsAsyncStub,
    broker_leader: str,
) -> None:
    ev = pending_eval("journey-web")
    index = await _write(state_stub, ev, broker_leader)
    assert _times(await _get(evals_stub, ev.id, index)) == (0, 0, 0)

    # the worker's final update of its run carries the three times
    ran = pb.Evaluation()
    ran.CopyFrom(ev)
    ran.status = EvalStatus.COMPLETE
    ran.enqueue_time, ran.dequeue_time, ran.plan_submit_time = T0, T0 + MS, T0 + 2 * MS
    index = await _write(state_stub, ran, broker_leader)
    got = await _get(evals_stub, ev.id, index)
    assert got.status == EvalStatus.COMPLETE
    assert _times(got) == (T0, T0 + MS, T0 + 2 * MS)

    # another writer (the broker cancelling, the reaper) rewrites it from its
    # own copy without the times: they stay
    other = pb.Evaluation()
    other.CopyFrom(ev)
    other.status = EvalStatus.CANCELED
    other.status_description = "rewritten elsewhere"
    index = await _write(state_stub, other, broker_leader)
    got = await _get(evals_stub, ev.id, index)
    assert got.status == EvalStatus.CANCELED
    assert _times(got) == (T0, T0 + MS, T0 + 2 * MS)

    # a later run replaces them as a whole (no plan this time)
    rerun = pb.Evaluation()
    rerun.CopyFrom(ran)
    rerun.enqueue_time, rerun.dequeue_time, rerun.plan_submit_time = T0 + 9 * MS, T0 + 10 * MS, 0
    index = await _write(state_stub, rerun, broker_leader)
    assert _times(await _get(evals_stub, ev.id, index)) == (T0 + 9 * MS, T0 + 10 * MS, 0)
