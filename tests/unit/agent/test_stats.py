"""Resource usage arithmetic (services/agent/stats.py): CPU percentages
between two readings, MHz consumed, and an alloc's sum of its tasks."""

from __future__ import annotations

from corral.v1 import structs_pb2 as pb
from services.agent.cgroups import Usage
from services.agent.cpuset import Compute
from services.agent.stats import CpuTracker, TaskStats, alloc_usage


def test_percent_of_one_core_between_readings() -> None:
    t = CpuTracker()
    assert t.percent(1e9, now=10.0) == 0.0  # the first reading has nothing to compare
    assert t.percent(1.5e9, now=11.0) == 50.0
    assert t.percent(3.5e9, now=12.0) == 200.0  # two cores busy
    assert t.percent(3.5e9, now=13.0) == 0.0


def test_task_stats_turn_counters_into_nomads_shape() -> None:
    stats = TaskStats(Compute(total_mhz=4000, cores=2))
    usage = Usage(
        cpu_total_ns=0, rss=10, usage=20, memory_measured=["RSS"], cpu_measured=["Percent"]
    )
    stats.sample(usage, now=0.0)
    usage.cpu_total_ns, usage.cpu_user_ns = 0.5e9, 0.4e9
    reading = stats.sample(usage, now=1.0).resource_usage
    assert reading.cpu_stats.percent == 50.0
    assert reading.cpu_stats.total_ticks == 1000.0  # half of one 2000 MHz core
    assert reading.memory_stats.rss == 10 and list(reading.memory_stats.measured) == ["RSS"]
    assert stats.latest is not None


def _task(rss: int, percent: float, measured: list[str], ts: int) -> pb.TaskResourceUsage:
    return pb.TaskResourceUsage(
        resource_usage=pb.ResourceUsage(
            memory_stats=pb.MemoryStats(rss=rss, measured=measured),
            cpu_stats=pb.CpuStats(percent=percent, measured=["Percent"]),
        ),
        timestamp=ts,
    )


def test_an_allocs_usage_is_the_sum_of_its_tasks() -> None:
    total = alloc_usage(
        {"a": _task(10, 20.0, ["RSS"], 5), "b": _task(5, 30.0, ["RSS", "Usage"], 9)}
    )
    assert total.resource_usage.memory_stats.rss == 15
    assert total.resource_usage.cpu_stats.percent == 50.0
    assert list(total.resource_usage.memory_stats.measured) == ["RSS", "Usage"]
    assert total.timestamp == 9 and set(total.tasks) == {"a", "b"}
