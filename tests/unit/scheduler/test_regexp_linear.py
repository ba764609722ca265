"""Issue 26, finding 1: a user's pattern cannot pin a worker. Under Python's
backtracking `re`, each case below runs for minutes to centuries; on RE2
(linear time) the eval completes at once. No timing assertion: a test that
finishes at all proves it (pytest-timeout ends the run otherwise)."""

from __future__ import annotations

from corral.testing import mock
from corral.testing.harness import Harness
from services.worker.scheduler.feasible.constraints import MatchCache

# nested quantifiers over ~27 characters: 25 s of CPU per node with `re`,
# doubling with each extra character (the report); 40 here
CATASTROPHIC = "^(a+)+$"
SUBJECT = "a" * 40 + "!"


def test_catastrophic_regexp_constraint_is_placed_in_bounded_time() -> None:
    h = Harness()
    nodes = [mock.node(meta={"label": SUBJECT}) for _ in range(3)]
    h.upsert_nodes(*nodes)
    job = mock.job(count=2)
    job.constraints.add(l_target="${meta.label}", operand="regexp", r_target=CATASTROPHIC)
    job.task_groups[0].affinities.add(
        l_target=SUBJECT, operand="regexp", r_target=CATASTROPHIC, weight=50
    )
    h.upsert_jobs(job)
    h.process(job.type, mock.eval_for(job))
    # nothing matches, so nothing is placed: the eval is blocked, not stuck
    assert not any(p.node_allocation for p in h.plans)
    assert h.evals[-1].failed_tg_allocs["web"].constraint_filtered


def test_catastrophic_affinity_still_places() -> None:
    h = Harness()
    h.upsert_nodes(*[mock.node(meta={"label": SUBJECT}) for _ in range(3)])
    job = mock.job(count=3)
    job.affinities.add(l_target="${meta.label}", operand="regexp", r_target=CATASTROPHIC, weight=50)
    h.upsert_jobs(job)
    h.process(job.type, mock.eval_for(job))
    placed = sum(len(a.allocs) for p in h.plans for a in p.node_allocation.values())
    assert placed == 3


def test_datacenter_glob_is_linear() -> None:
    """`*a*a*...*b` over a 40-character datacenter: 17 s with `re` at ten
    stars, every star more multiplying it."""
    h = Harness()
    h.upsert_nodes(mock.node(datacenter="a" * 40))
    job = mock.job(count=1, datacenters=("*a" * 30 + "*b",))
    h.upsert_jobs(job)
    h.process(job.type, mock.eval_for(job))
    assert not any(p.node_allocation for p in h.plans)


def test_patterns_are_compiled_once_per_eval() -> None:
    cache = MatchCache()
    first = cache.regexp("^web-[0-9]+$")
    assert first is not None and cache.regexp("^web-[0-9]+$") is first
    assert cache.regexp("(?=x)") is None  # refused by RE2: matches nothing
