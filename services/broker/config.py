"""Broker settings with Nomad's defaults (nomad-semantics.md §1, §2); every
timing is a flag and an environment variable (`--nack-timeout`,
`CORRAL_BROKER_NACK_TIMEOUT`) so tests and operators can shorten them."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from corral.runtime.runner import LeaderSettings
from corral.runtime.settings import SettingsGroup


class BrokerSettings(SettingsGroup):
    """The eval broker's, blocked evals' and reaper's timings."""

    nack_timeout: float = Field(
        60.0, gt=0, description="seconds a dequeued eval may stay unacked before redelivery"
    )
    delivery_limit: int = Field(3, ge=1, description="deliveries of one eval before it is failed")
    initial_nack_delay: float = Field(
        1.0, ge=0, description="seconds before a nacked eval is redelivered the first time"
    )
    subsequent_nack_delay: float = Field(
        20.0, ge=0, description="seconds before each later redelivery of a nacked eval"
    )
    failed_followup_delay: float = Field(
        60.0, ge=0, description="base delay (s) of the follow-up eval of a failed eval"
    )
    failed_followup_jitter: float = Field(
        300.0, ge=0, description="random delay [0, jitter) s added to that follow-up"
    )
    reaper_interval: float = Field(
        5.0, gt=0, description="seconds between sweeps for failed and cancelable evals"
    )
    cancel_batch_size: int = Field(
        728, ge=1, description="cancelable evals written back in one batch"
    )
    cancel_backlog_pause: float = Field(
        0.0,
        ge=0,
        description="pause (s) before the next batch while more than a batch waits (an eval "
        "storm); 0 = back to back, one write in flight at a time, so other writes still "
        "commit between two batches (Nomad writes one batch per ack or 5 s sweep)",
    )
    unblock_failed_interval: float = Field(
        60.0,
        gt=0,
        description="seconds between retries of blocked evals that failed on plan conflicts",
    )
    core_gc_interval: float = Field(
        300.0,
        ge=0,
        description="seconds between the leader's periodic GC core evals (Nomad's "
        "eval/job/node GC interval); 0 = off",
    )
    worker_lease_ttl: float = Field(
        5.0,
        gt=0,
        description="seconds a worker's lease lives after its last heartbeat or dequeue; when it "
        "lapses the evals that worker holds are nacked at once (the nack timeout stays the "
        "backstop)",
    )
    reconcile_interval: float = Field(
        30.0,
        ge=0,
        description="seconds between passes of the leader's eval reconciler, which re-enqueues "
        "pending evals and re-tracks blocked evals of the state the broker does not hold; "
        "0 = only on taking office",
    )
    dequeue_default_timeout: float = Field(
        1.0, gt=0, description="long-poll of a Dequeue that names no timeout (s)"
    )
    dequeue_max_timeout: float = Field(
        60.0, gt=0, description="longest Dequeue long-poll a worker may ask for (s)"
    )
    scheduler_version: int = Field(
        1, ge=0, description="scheduler version a worker must send on Dequeue (rolling upgrades)"
    )


class BrokerProcessSettings(LeaderSettings):
    """An eval broker process: the leader holds the evals, standbys keep a replica warm."""

    ROLE: ClassVar[str] = "broker"

    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    fault: Literal["", "drop-feed-evals"] = Field(
        "",
        description="test-only fault injection: drop-feed-evals (the feed router loses every "
        "eval change, as when a listener fails; only the reconciler finds them)",
    )
