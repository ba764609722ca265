"""What a replica receives of the change feed: a set of topics and a view of
each alloc (`SubscribeRequest.topics` / `alloc_view`, the same on
`SnapshotRequest`).

A replica parses and holds every event it is sent, and allocs are most of
the feed's bytes. The broker reads of an alloc only its ids, statuses and
deployment health (routing terminal allocs to blocked evals, periodic
children still running, canary health), so it subscribes to a status view;
the workers and the planner never read placement metrics (three quarters of
a placed alloc's bytes), so they subscribe to the scheduling view. The state
process projects each batch once per view (`services/state/feed.py`) for all
the subscribers of that view.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corral.store import TOPIC_TABLE
from corral.structs import Topic
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb

FULL = state_pb2.ALLOC_VIEW_FULL
SCHEDULING = state_pb2.ALLOC_VIEW_SCHEDULING
STATUS = state_pb2.ALLOC_VIEW_STATUS

#: scalar alloc fields the status view keeps (`deployment_status` too)
STATUS_FIELDS = (
    "id",
    "namespace",
    "eval_id",
    "name",
    "node_id",
    "job_id",
    "job_version",
    "job_modify_index",
    "task_group",
    "desired_status",
    "client_status",
    "deployment_id",
    "create_index",
    "modify_index",
    "alloc_modify_index",
    "job_type",
    "job_priority",
)

#: snapshot tables of each topic (a job's older versions come with its jobs)
TOPIC_SNAPSHOT_TABLES = {
    Topic.JOB: ("jobs", "job_versions"),
    Topic.NODE: ("nodes",),
    Topic.ALLOCATION: ("allocs",),
    Topic.EVALUATION: ("evals",),
    Topic.DEPLOYMENT: ("deployments",),
    Topic.JOB_SUMMARY: ("job_summaries",),
}


@dataclass(frozen=True, slots=True)
class FeedView:
    """Topics (empty: all) and the alloc view of one subscriber."""

    topics: frozenset[str] = frozenset()
    alloc_view: int = FULL

    @staticmethod
    def of(topics: Iterable[str] = (), alloc_view: int = FULL) -> FeedView:
        return FeedView(frozenset(topics), alloc_view)

    @property
    def is_full(self) -> bool:
        return not self.topics and self.alloc_view == FULL

    def wants(self, topic: str) -> bool:
        return not self.topics or topic in self.topics

    def snapshot_tables(self) -> set[str] | None:
        """Snapshot tables this view holds (None: all)."""
        if not self.topics:
            return None
        return {t for topic in self.topics for t in TOPIC_SNAPSHOT_TABLES.get(topic, ())}

    def table_indexes(self, indexes: dict[str, int]) -> dict[str, int]:
        """The table indexes a replica of this view stamps as it applies
        batches: only its topics' tables."""
        if not self.topics:
            return dict(indexes)
        keep = {TOPIC_TABLE[t] for t in self.topics if t in TOPIC_TABLE}
        return {t: i for t, i in indexes.items() if t in keep}

    def alloc(self, alloc: pb.Allocation) -> pb.Allocation:
        """`alloc` as this view holds it (the same message for FULL)."""
        if self.alloc_view == FULL:
            return alloc
        if self.alloc_view == SCHEDULING:
            if not alloc.HasField("metrics"):
                return alloc
            out = pb.Allocation()
            out.CopyFrom(alloc)
            out.ClearField("metrics")
            return out
        out = pb.Allocation(**{f: getattr(alloc, f) for f in STATUS_FIELDS})
        if alloc.HasField("deployment_status"):
            out.deployment_status.CopyFrom(alloc.deployment_status)
        return out

    def allocs(self, allocs: list[pb.Allocation]) -> list[pb.Allocation]:
        if self.alloc_view == FULL:
            return allocs
        return [self.alloc(a) for a in allocs]

    def batch(self, batch: pb.ChangeBatch) -> pb.ChangeBatch:
        """`batch` as this view's subscribers receive it: the same message
        when nothing is left out, else a new one (the batch is shared)."""
        if self.is_full:
            return batch
        out = pb.ChangeBatch(index=batch.index, time=batch.time)
        for ev in batch.events:
            if not self.wants(ev.topic):
                continue
            if ev.HasField("allocation") and self.alloc_view != FULL:
                kept = out.events.add(
                    index=ev.index,
                    topic=ev.topic,
                    type=ev.type,
                    key=ev.key,
                    namespace=ev.namespace,
                    deleted=ev.deleted,
                )
                kept.allocation.CopyFrom(self.alloc(ev.allocation))
            else:
                out.events.append(ev)
        return out


def check_topics(topics: Iterable[str]) -> list[str]:
    """Topics a subscriber may not name (not feed topics)."""
    return sorted(set(topics) - set(Topic.ALL))
