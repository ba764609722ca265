"""Broker settings with Nomad's defaults (nomad-semantics.md §1, §2); every
timing is a flag and an environment variable so tests and operators can
shorten them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BrokerSettings:
    nack_timeout: float = 60.0
    delivery_limit: int = 3
    initial_nack_delay: float = 1.0
    subsequent_nack_delay: float = 20.0
    # follow-up of a failed eval: base + uniform random [0, jitter)
    failed_followup_delay: float = 60.0
    failed_followup_jitter: float = 300.0
    reaper_interval: float = 5.0
    cancel_batch_size: int = 728
    # with more than a batch waiting (an eval storm), the next batch follows
    # after this pause instead of the next ack or sweep: Nomad waits, and a
    # 100,000-eval storm then takes 137 sweeps (11 minutes) to write back
    cancel_backlog_pause: float = 0.25
    # blocked evals whose placement failed on plan conflicts are retried this often
    unblock_failed_interval: float = 60.0
    # the leader's periodic GC core evals (Nomad's eval/job/node GC interval); 0 = off
    core_gc_interval: float = 300.0
    dequeue_default_timeout: float = 1.0
    dequeue_max_timeout: float = 60.0
    scheduler_version: int = 1

    def validate(self) -> None:
        for name in ("nack_timeout", "reaper_interval", "unblock_failed_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.delivery_limit < 1:
            raise ValueError("delivery_limit must be >= 1")
        for name in (
            "initial_nack_delay",
            "subsequent_nack_delay",
            "failed_followup_delay",
            "failed_followup_jitter",
            "core_gc_interval",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
