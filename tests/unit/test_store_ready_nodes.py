"""The store's ready-node index (issue 30): every node write changes it by
that node, and after any sequence of registrations, status changes, drains,
eligibility, datacenter and pool moves and deletes it equals what a walk of
every node finds, in the walk's order; a snapshot keeps its own answer
while the store moves on."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.domain import structs, topics
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import Eligibility, NodeStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.util import _compute_ready_nodes, ready_nodes_in_dcs

IDS = [f"node-{i}" for i in range(10)]
DCS = ["dc1", "dc2", "dc3"]
POOLS = ["", "default", "gpu"]  # "" is the default pool

_writes = st.builds(
    lambda i, dc, pool, status, drain, eligible: ("put", i, dc, pool, status, drain, eligible),
    st.sampled_from(IDS),
    st.sampled_from(DCS),
    st.sampled_from(POOLS),
    st.sampled_from(
        [NodeStatus.READY, NodeStatus.DOWN, NodeStatus.INITIALIZING, NodeStatus.DISCONNECTED]
    ),
    st.booleans(),
    st.booleans(),
)
_deletes = st.builds(lambda i: ("delete", i), st.sampled_from(IDS))
#: batches of one to four events (one transaction may write a node twice)
_batches = st.lists(
    st.lists(st.one_of(_writes, _writes, _deletes), min_size=1, max_size=4),
    min_size=1,
    max_size=25,
)


def _event(op: tuple[Any, ...]) -> pb.Event:
    if op[0] == "delete":
        return pb.Event(
            topic=topics.NODE.name, type="NodeDeregistration", node=pb.Node(id=op[1]), deleted=True
        )
    _, node_id, dc, pool, status, drain, eligible = op
    node = pb.Node(
        id=node_id,
        datacenter=dc,
        node_pool=pool,
        status=status,
        drain=drain,
        scheduling_eligibility=Eligibility.ELIGIBLE if eligible else Eligibility.INELIGIBLE,
    )
    return pb.Event(topic=topics.NODE.name, type="NodeRegistration", node=node)


def _walk(snap: StateSnapshot, dc: str | None, pool: str) -> tuple[list[str], set[str]]:
    """Ready ids in `nodes` order and not-ready ids, by looking at every node."""
    ready: list[str] = []
    not_ready: set[str] = set()
    for n in snap.nodes.values():
        if dc is not None and n.datacenter != dc:
            continue
        if (n.node_pool or structs.DEFAULT_NODE_POOL) != pool:
            continue
        if structs.node_ready(n):
            ready.append(n.id)
        else:
            not_ready.add(n.id)
    return ready, not_ready


def _answers(snap: StateSnapshot) -> dict[Any, Any]:
    """Every question the index answers, as the snapshot answers it now."""
    out: dict[Any, Any] = {}
    for dc in [*DCS, None]:
        for pool in ["default", "gpu"]:
            ready = [n.id for n in snap.ready_nodes(dc, pool).values()]
            not_ready = set(snap.not_ready_nodes(dc, pool).keys())
            assert all(snap.nodes[i] is snap.ready_nodes(dc, pool)[i] for i in ready)
            out[(dc, pool)] = (ready, not_ready)
    for dcs in (["*"], [], ["dc1"], ["dc2", "dc1"], ["dc1", "dc1", "dc3"], ["dc*"], ["d*2", "dc3"]):
        for pool in ("", "all", "default", "gpu"):
            nodes, not_ready, by_dc = ready_nodes_in_dcs(snap, dcs, pool)
            out[(tuple(dcs), pool)] = ([n.id for n in nodes], not_ready, by_dc)
    return out


@settings(max_examples=150, deadline=None)
@given(_batches)
def test_the_ready_index_equals_a_walk_of_every_node(batches: list[list[tuple[Any, ...]]]) -> None:
    store = StateStore()
    taken: list[tuple[StateSnapshot, dict[Any, Any]]] = []
    for i, ops in enumerate(batches, start=1):
        store.apply(pb.ChangeBatch(index=i, events=[_event(op) for op in ops]))
        snap = store.snapshot()
        for dc in [*DCS, None]:
            for pool in ["default", "gpu"]:
                ready, not_ready = _walk(snap, dc, pool)
                assert [n.id for n in snap.ready_nodes(dc, pool).values()] == ready
                assert set(snap.not_ready_nodes(dc, pool).keys()) == not_ready
        for pool in ("default", "gpu"):
            counts = {dc: len(r) for dc in DCS if (r := _walk(snap, dc, pool)[0])}
            assert snap.ready_counts_by_dc(pool) == counts
        # the scheduler's question, answered from the index, as the walk does
        for dcs in (("*",), (), ("dc1",), ("dc2", "dc1"), ("dc1", "dc1", "dc3")):
            for pool in ("", "all", "default", "gpu"):
                nodes, not_ready, by_dc = ready_nodes_in_dcs(snap, dcs, pool)
                want_nodes, want_not_ready, want_by_dc = _compute_ready_nodes(snap, dcs, pool)
                assert [n.id for n in nodes] == [n.id for n in want_nodes], (dcs, pool)
                assert not_ready == set(want_not_ready) and by_dc == want_by_dc, (dcs, pool)
        taken.append((snap, _answers(snap)))
    # a snapshot never sees a later write
    for snap, answers in taken:
        assert _answers(snap) == answers


def test_build_indexes_ready_nodes_and_later_writes_leave_old_snapshots_alone() -> None:
    ready = pb.Node(id="a", datacenter="dc1", status=NodeStatus.READY)
    gpu = pb.Node(id="b", datacenter="dc2", node_pool="gpu", status=NodeStatus.READY)
    down = pb.Node(id="c", datacenter="dc1", status=NodeStatus.DOWN)
    store = StateStore(StateStore.build(3, nodes=[ready, gpu, down]))
    first = store.snapshot()
    assert list(first.ready_nodes(None, "default").keys()) == ["a"]
    assert list(first.ready_nodes("dc1", "default").keys()) == ["a"]
    assert list(first.ready_nodes(None, "gpu").keys()) == ["b"]
    assert set(first.not_ready_nodes("dc1", "default").keys()) == {"c"}
    assert first.ready_counts_by_dc("gpu") == {"dc2": 1}
    # a drain takes the node out of every key at once; the old snapshot keeps it
    drained = pb.Node()
    drained.CopyFrom(ready)
    drained.drain = True
    store.apply(pb.ChangeBatch(index=4, events=[pb.Event(topic=topics.NODE.name, node=drained)]))
    second = store.snapshot()
    assert set(second.ready_nodes(None, "default").keys()) == set()
    assert set(second.not_ready_nodes("dc1", "default").keys()) == {"a", "c"}
    assert second.ready_counts_by_dc("default") == {}
    assert list(first.ready_nodes(None, "default").keys()) == ["a"]
    assert first.ready_nodes("dc1", "default")["a"] is first.nodes["a"]
    # a write of a ready node that keeps it ready (a client's alloc update
    # stamps the node) swaps in the new message under every key
    stamped = pb.Node()
    stamped.CopyFrom(gpu)
    stamped.last_alloc_update_index = 5
    store.apply(pb.ChangeBatch(index=5, events=[pb.Event(topic=topics.NODE.name, node=stamped)]))
    third = store.snapshot()
    for dc in ("dc2", None):
        assert third.ready_nodes(dc, "gpu")["b"] is third.nodes["b"] == stamped
    assert second.ready_nodes(None, "gpu")["b"] is first.nodes["b"]
