"""What a replica receives of the change feed: a set of topics and a view of
each alloc (`SubscribeRequest.topics` / `alloc_view`, the same on
`SnapshotRequest`).

A replica parses and holds every event it is sent, and allocs are most of
the feed's bytes. No replica reads placement metrics (three quarters of a
placed alloc's bytes): every replica subscribes to the scheduling view. The
broker reads of an alloc only its ids, statuses and deployment health, which
the status view keeps; it does not ask for it (`BROKER_STATUS_VIEW`). The state
process projects each batch once per view (`services/state/feed.py`) for all
the subscribers of that view.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from corral.domain import topics
from corral.domain.topics import Topic
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb

FULL = state_pb2.ALLOC_VIEW_FULL
SCHEDULING = state_pb2.ALLOC_VIEW_SCHEDULING
STATUS = state_pb2.ALLOC_VIEW_STATUS

Dropped = Literal[
    "metrics",
    "resources",
    "task_resources",
    "task_states",
    "alloc_states",
    "reschedule_tracker",
    "desired_transition",
    "preempted_allocations",
    "client_description",
    "desired_description",
]

#: what the scheduling view leaves out of an alloc
SCHEDULING_DROPS: tuple[Dropped, ...] = ("metrics",)
#: and the status view: everything sized by the job's tasks (ids, job, node,
#: eval, statuses, deployment health and indexes stay), all of `Dropped`
STATUS_DROPS: tuple[Dropped, ...] = get_args(Dropped)
_DROPS: dict[int, tuple[Dropped, ...]] = {SCHEDULING: SCHEDULING_DROPS, STATUS: STATUS_DROPS}


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
        return {t for topic in self._topics() for t in topic.tables}

    def table_indexes(self, indexes: dict[str, int]) -> dict[str, int]:
        """The table indexes a replica of this view stamps as it applies
        batches: only its topics' tables."""
        if not self.topics:
            return dict(indexes)
        keep = {topic.index for topic in self._topics()}
        return {t: i for t, i in indexes.items() if t in keep}

    def _topics(self) -> list[Topic]:
        return [t for t in map(topics.named, self.topics) if t is not None]

    def alloc(self, alloc: pb.Allocation) -> pb.Allocation:
        """`alloc` as this view holds it (the same message for FULL)."""
        drops = _DROPS.get(self.alloc_view)
        if not drops:
            return alloc
        out = pb.Allocation()
        out.CopyFrom(alloc)
        for name in drops:
            out.ClearField(name)
        return out

    def allocs(self, allocs: list[pb.Allocation]) -> list[pb.Allocation]:
        if self.alloc_view == FULL:
            return allocs
        return [self.alloc(a) for a in allocs]

    def batch(self, batch: pb.ChangeBatch) -> pb.ChangeBatch:
        """`batch` as this view's subscribers receive it: the same message
        when nothing is left out, else a new one (the batch is shared).

        One deep copy of the whole batch, then fields cleared in place:
        building the events one by one in Python cost the state process
        about twice as much CPU per alloc (`python -m bench.feed_views`)."""
        if self.is_full:
            return batch
        out = pb.ChangeBatch()
        out.CopyFrom(batch)
        if self.topics:
            events = out.events
            for i in range(len(events) - 1, -1, -1):
                if events[i].topic not in self.topics:
                    del events[i]
        drops = _DROPS.get(self.alloc_view)
        if drops:
            for ev in out.events:
                if ev.HasField("allocation"):
                    a = ev.allocation
                    for name in drops:
                        a.ClearField(name)
        return out


#: The narrowest view the broker's code works on: its blocked-eval routing
#: reads of an alloc its node and client status, the periodic dispatcher its
#: job and desired and client status, the deployment watcher its deployment
#: health; nothing in the broker reads job summaries. The broker does not
#: subscribe with it: a view of its own costs the state process one more
#: projection and encoding of every batch (about 0.002 CPU-ms per placement,
#: `python -m bench.feed_views`), more than it saves the broker in parsing
#: (about 0.0017), and the state is the bottleneck. It shares the
#: scheduling view, which the state encodes once for every replica.
BROKER_STATUS_VIEW = FeedView.of(
    (
        t.name
        for t in (
            topics.JOB,
            topics.EVALUATION,
            topics.ALLOCATION,
            topics.NODE,
            topics.DEPLOYMENT,
            topics.OPERATOR,
        )
    ),
    STATUS,
)


def check_topics(names: Iterable[str]) -> list[str]:
    """Topics a subscriber may not name (not feed topics)."""
    return sorted(set(names) - set(topics.FOLLOWED_NAMES))
