"""A worker acknowledges, without scheduling, an eval that was canceled
while the broker held it (a max-disconnect-timeout follow-up whose allocs
reconnected)."""

from __future__ import annotations

from corral.domain import structs
from corral.domain.structs import EvalStatus, Trigger
from corral.testing import mock
from corral.testing.harness import Harness
from services.worker.worker import _canceled_meanwhile


def test_only_an_eval_stored_as_canceled_is_skipped() -> None:
    h = Harness()
    job = mock.job()
    h.upsert_jobs(job)
    held = mock.eval_for(job, triggered_by=Trigger.MAX_DISCONNECT_TIMEOUT)
    h.upsert_evals(held)
    assert not _canceled_meanwhile(h.snapshot(), held)

    canceled = structs.copy_msg(held)
    canceled.status = EvalStatus.CANCELED
    h.upsert_evals(canceled)
    assert _canceled_meanwhile(h.snapshot(), held)  # the broker's copy is still pending

    unknown = mock.eval_for(job)
    assert not _canceled_meanwhile(h.snapshot(), unknown)
