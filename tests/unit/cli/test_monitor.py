import io

from cli.monitor import _draw_table, _progress, write_placement_failure
from corral.v1 import structs_pb2 as pb


def alloc(group: str, version: int, desired: str, client: str) -> pb.Allocation:
    return pb.Allocation(
        task_group=group, job_version=version, desired_status=desired, client_status=client
    )


def test_progress_counts_allocs_that_should_run():
    job = pb.Job(type="service", task_groups=[pb.TaskGroup(name="web", count=4)])
    allocs = [
        alloc("web", 2, "run", "running"),
        alloc("web", 2, "run", "pending"),
        alloc("web", 2, "run", "failed"),
        alloc("web", 1, "run", "running"),  # kept at the old version (count-only change)
        alloc("web", 1, "stop", "complete"),  # replaced
        alloc("web", 2, "stop", "running"),  # being stopped (scaled down)
    ]
    g = _progress(job, allocs, 2)["web"]
    assert (g.desired, g.placed, g.pending, g.running, g.failed) == (4, 4, 1, 2, 1)


def test_system_jobs_desire_what_was_placed():
    job = pb.Job(type="system", task_groups=[pb.TaskGroup(name="agent", count=1)])
    allocs = [alloc("agent", 0, "run", "running") for _ in range(4)]
    assert _progress(job, allocs, 0)["agent"].desired == 4


def test_batch_completions_count_as_placed():
    job = pb.Job(type="batch", task_groups=[pb.TaskGroup(name="work", count=2)])
    allocs = [alloc("work", 0, "run", "complete"), alloc("work", 0, "stop", "complete")]
    g = _progress(job, allocs, 0)["work"]
    assert (g.placed, g.complete) == (2, 2)


def test_table_is_appended_when_not_a_terminal():
    out = io.StringIO()
    rows = (("web", 3, 3, 1, 2, 0, 0),)
    n = _draw_table(out, rows, 0)
    n = _draw_table(out, rows, n)
    text = out.getvalue()
    assert "\x1b[" not in text
    assert text.count("Task Group") == 2 and n == 3


def test_placement_failure_explains():
    out = io.StringIO()
    m = pb.AllocMetric(
        nodes_evaluated=2,
        nodes_filtered=2,
        constraint_filtered={"${attr.kernel.name} = windows": 2},
        coalesced_failures=1,
    )
    write_placement_failure(out, "web", m)
    assert out.getvalue().splitlines() == [
        '    Task Group "web" (failed to place 2 allocations):',
        '      * Constraint "${attr.kernel.name} = windows": 2 nodes excluded by filter',
    ]
