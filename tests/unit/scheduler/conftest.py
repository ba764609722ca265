"""Every select the scheduler tests make through the class-level index is
replayed with the node walk and compared (`class_index.VERIFY`), and the
index is used from two candidate nodes on and for short walks too, so the whole scheduler suite
checks that class-level scoring chooses, scores and counts as the walk."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.worker.scheduler.feasible import class_index


@pytest.fixture(autouse=True)
def _verify_class_index(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(class_index, "VERIFY", True)
    monkeypatch.setattr(class_index, "MIN_NODES", 2)
    monkeypatch.setattr(class_index, "MIN_VISITS", 0)
    yield
