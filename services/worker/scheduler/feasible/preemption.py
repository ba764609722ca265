"""Preemption: when a group fits nowhere, which lower-priority allocs on a
node could be evicted to make room (Nomad's `scheduler/feasible/preemption.go`,
resource dimensions only).

Rules kept from Nomad:
* only allocs of *other* jobs whose priority is at least 10 below the
  preemptor's are candidates;
* candidates are consumed lowest priority first; within a priority, the alloc
  whose resources are closest to what is still missing is taken first
  (Euclidean distance over cpu/memory/disk relative to the need), with a
  penalty of 50 per alloc beyond the victim group's migrate max_parallel that
  this plan already preempts;
* afterwards, victims that turn out unnecessary are dropped, highest priority
  first, so the set is minimal in priority and count.

Port and device conflicts are not resolved by preemption here (Nomad can
also preempt for those); such nodes stay exhausted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.domain.fit import Capacity, Usage
from corral.domain.structs import JobType
from corral.v1 import structs_pb2 as pb

PRIORITY_DELTA = 10
MAX_PARALLEL_PENALTY = 50.0


def preemption_enabled(config: pb.SchedulerConfiguration, scheduler_type: str) -> bool:
    """Per scheduler type; an unset preemption config means the defaults
    (system on, sysbatch/batch/service off)."""
    if not config.HasField("preemption_config"):
        return scheduler_type == JobType.SYSTEM
    pc = config.preemption_config
    return {
        JobType.SYSTEM: pc.system_scheduler_enabled,
        JobType.SYSBATCH: pc.sysbatch_scheduler_enabled,
        JobType.BATCH: pc.batch_scheduler_enabled,
        JobType.SERVICE: pc.service_scheduler_enabled,
    }.get(scheduler_type, False)


@dataclass(slots=True)
class _Candidate:
    alloc: pb.Allocation
    priority: int
    usage: Usage
    max_parallel: int
    group_key: tuple[str, str, str]


def _distance(need: Usage, used: Usage) -> float:
    mem = cpu = disk = 0.0
    if need.memory_mb > 0:
        mem = (need.memory_mb - used.memory_mb) / need.memory_mb
    if need.cpu > 0:
        cpu = (need.cpu - used.cpu) / need.cpu
    if need.disk_mb > 0:
        disk = (need.disk_mb - used.disk_mb) / need.disk_mb
    return math.sqrt(mem * mem + cpu * cpu + disk * disk)


def _meets(cap: Capacity, used: Usage, ask: Usage) -> bool:
    """Does `ask` fit next to `used`?"""
    if cap.max_allocs and used.allocs + ask.allocs > cap.max_allocs:
        return False
    return (
        used.cores + ask.cores <= cap.cores
        and used.cpu + ask.cpu <= cap.cpu
        and used.memory_mb + ask.memory_mb <= cap.memory_mb
        and used.disk_mb + ask.disk_mb <= cap.disk_mb
    )


def _sub(u: Usage, v: Usage) -> None:
    u.cpu -= v.cpu
    u.cores -= v.cores
    u.memory_mb -= v.memory_mb
    u.disk_mb -= v.disk_mb
    u.allocs -= v.allocs


def preempt_for_task_group(
    *,
    capacity: Capacity,
    current: Sequence[pb.Allocation],
    ask: Usage,
    priority: int,
    namespace: str,
    job_id: str,
    max_parallel_of: Mapping[tuple[str, str, str], int] | None = None,
    already_preempted: Mapping[tuple[str, str, str], int] | None = None,
    priority_of: Mapping[str, int] | None = None,
    claimed: tuple[int, int, int, int, int] | None = None,
) -> list[pb.Allocation] | None:
    """Allocs of `current` (the node's proposed allocs) to evict so that
    `ask` fits, or None if no allowed set frees enough. `claimed` (cpu MHz,
    cores, memory, disk, allocs) is in use on the node besides `current`
    and cannot be evicted: what the worker's other loops claimed there
    (feasible/inflight.py).

    `max_parallel_of` / `already_preempted` are keyed by (namespace, job,
    group): the victim group's migrate max_parallel and how many of its
    allocs this plan already preempts. `priority_of` maps job id to priority
    for allocs that lack `job_priority`.
    """
    mp = max_parallel_of or {}
    done = dict(already_preempted or {})
    prio_of = priority_of or {}
    used = Usage()
    if claimed is not None:
        cpu, cores, mem, disk, n = claimed
        used = Usage(cpu + cores * capacity.mhz_per_core, cores, mem, disk, n)
    cands: list[_Candidate] = []
    ns = namespace or "default"
    for a in current:
        u = Usage()
        u.add(a.resources, capacity.mhz_per_core)
        used.cpu += u.cpu
        used.cores += u.cores
        used.memory_mb += u.memory_mb
        used.disk_mb += u.disk_mb
        used.allocs += 1
        if a.job_id == job_id and (a.namespace or "default") == ns:
            continue
        prio = a.job_priority or prio_of.get(a.job_id, 0)
        if priority - prio < PRIORITY_DELTA:
            continue
        key = (a.namespace or "default", a.job_id, a.task_group)
        cands.append(_Candidate(a, prio, u, mp.get(key, 0), key))
    if _meets(capacity, used, ask):
        return []
    if not cands:
        return None

    # what is missing, per dimension (Nomad's "resources needed")
    need = ask.copy()
    chosen: list[_Candidate] = []
    remaining = used.copy()
    met = False
    for prio in sorted({c.priority for c in cands}):
        group = [c for c in cands if c.priority == prio]
        while group and not met:
            best_i = 0
            best_d = math.inf
            for i, c in enumerate(group):
                n = done.get(c.group_key, 0)
                penalty = 0.0
                if c.max_parallel > 0 and n >= c.max_parallel:
                    penalty = (n + 1 - c.max_parallel) * MAX_PARALLEL_PENALTY
                d = _distance(need, c.usage) + penalty
                if d < best_d:
                    best_d, best_i = d, i
            c = group.pop(best_i)
            chosen.append(c)
            done[c.group_key] = done.get(c.group_key, 0) + 1
            _sub(remaining, c.usage)
            _sub(need, c.usage)
            met = _meets(capacity, remaining, ask)
        if met:
            break
    if not met:
        return None

    # drop victims that are not needed, highest priority (then smallest) first
    order = sorted(chosen, key=lambda c: (-c.priority, c.usage.memory_mb + c.usage.cpu))
    kept = list(chosen)
    for c in order:
        trial = [k for k in kept if k is not c]
        rest = used.copy()
        for k in trial:
            _sub(rest, k.usage)
        if _meets(capacity, rest, ask):
            kept = trial
    return [c.alloc for c in kept]
