"""Worker settings, with Nomad's defaults (nomad-semantics.md §3)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from corral.structs import SCHEDULER_VERSION, JobType

#: loops beyond the core count still pay off: a loop waiting on a plan commit
#: or a dequeue holds no CPU (Nomad caps at NumCPU; Python overlaps the waits)
MAX_SCHEDULERS = 64


#: loops per core by default: a loop spends most of an eval waiting for its
#: plan to commit and its eval update to be written (measured by bench W1 on
#: 2 cores: 4 loops 152 placements/s, 16 loops 223/s, 32 loops 219/s)
LOOPS_PER_CORE = 8
DEFAULT_MAX_LOOPS = 16


def default_num_schedulers() -> int:
    """Nomad runs one loop per core; ours default to more (see above)."""
    return min(DEFAULT_MAX_LOOPS, (os.cpu_count() or 1) * LOOPS_PER_CORE)


@dataclass
class WorkerSettings:
    state_addr: str
    broker_addrs: list[str]
    planner_addrs: list[str]
    listen: str = "127.0.0.1:0"
    num_schedulers: int = field(default_factory=default_num_schedulers)
    enabled_schedulers: list[str] = field(default_factory=lambda: list(JobType.ALL))
    scheduler_version: int = SCHEDULER_VERSION
    dequeue_timeout: float = 0.5
    # How long to wait for the replica to reach an eval's wait index before
    # nacking it (Nomad's raftSyncLimit) ...
    sync_limit: float = 5.0
    # ... and how much longer to keep waiting after the nack, ending early as
    # soon as the replica catches up (PR #15523's long backoff, 10 x sync limit).
    slow_catchup: float = 50.0
    backoff_fast: float = 0.02
    backoff_slow: float = 0.5
    backoff_limit: float = 10.0
    version_mismatch_backoff: float = 30.0
    # Bound on one submit_plan retrying a transient error (no leader, UNAVAILABLE)
    plan_retry_limit: float = 30.0
    # Test-only fault injection (see worker.FAULT_*); empty in production
    fault: str = ""
