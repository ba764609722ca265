"""The in-memory state store: applying change batches and O(1) snapshots."""

from __future__ import annotations

from corral.domain import topics
from corral.domain.store import StateStore
from corral.v1 import structs_pb2 as pb


def _batch(index: int, *events: pb.Event) -> pb.ChangeBatch:
    return pb.ChangeBatch(index=index, events=list(events))


def test_snapshot_taken_before_changes_does_not_see_them() -> None:
    store = StateStore()
    node = pb.Node(id="n1", datacenter="dc1", status="ready")
    store.apply(_batch(1, pb.Event(topic=topics.NODE.name, type="NodeRegistration", node=node)))
    before = store.snapshot()
    alloc = pb.Allocation(id="a1", job_id="web", namespace="default", node_id="n1", eval_id="e1")
    store.apply(
        _batch(2, pb.Event(topic=topics.ALLOCATION.name, type="PlanResult", allocation=alloc))
    )
    after = store.snapshot()

    assert before.index == 1 and after.index == 2
    assert before.allocs_by_node("n1") == []
    assert [a.id for a in after.allocs_by_node("n1")] == ["a1"]
    assert [a.id for a in after.allocs_by_job("default", "web")] == ["a1"]
    assert [a.id for a in after.allocs_by_eval("e1")] == ["a1"]
    assert after.table_index("allocs") == 2 and after.table_index("nodes") == 1
    assert after.refresh_index() == 2


def test_old_batches_are_ignored_and_deletes_clean_secondary_indexes() -> None:
    store = StateStore()
    node = pb.Node(id="n1", datacenter="dc1")
    store.apply(_batch(5, pb.Event(topic=topics.NODE.name, node=node)))
    store.apply(
        _batch(4, pb.Event(topic=topics.NODE.name, node=pb.Node(id="n2", datacenter="dc1")))
    )
    assert store.snapshot().node_by_id("n2") is None

    moved = pb.Node(id="n1", datacenter="dc2")
    store.apply(_batch(6, pb.Event(topic=topics.NODE.name, node=moved)))
    snap = store.snapshot()
    assert [n.id for n in snap.nodes_in_datacenters(["dc2"])] == ["n1"]
    assert snap.nodes_in_datacenters(["dc1"]) == []

    store.apply(_batch(7, pb.Event(topic=topics.NODE.name, node=moved, deleted=True)))
    assert store.snapshot().nodes_in_datacenters(["dc2"]) == []
    assert store.snapshot().node_by_id("n1") is None


def test_job_versions_are_kept_and_current_is_newest() -> None:
    store = StateStore()
    v0 = pb.Job(id="web", namespace="default", version=0, create_index=1)
    v1 = pb.Job(id="web", namespace="default", version=1, create_index=1)
    store.apply(_batch(1, pb.Event(topic=topics.JOB.name, type="JobRegistered", job=v0)))
    store.apply(_batch(2, pb.Event(topic=topics.JOB.name, type="JobRegistered", job=v1)))
    snap = store.snapshot()
    job = snap.job_by_id("default", "web")
    assert job is not None and job.version == 1
    assert [j.version for j in snap.job_versions_of("default", "web")] == [1, 0]
    v0_again = snap.job_by_version("default", "web", 0)
    assert v0_again is not None and v0_again.version == 0


def test_build_from_tables() -> None:
    snap = StateStore.build(
        42,
        nodes=[pb.Node(id="n1", datacenter="dc1")],
        evals=[pb.Evaluation(id="e1", job_id="web", namespace="default")],
        table_indexes={"nodes": 40, "evals": 42},
    )
    assert snap.index == 42
    assert snap.table_index("nodes") == 40
    assert [e.id for e in snap.evals_by_job("default", "web")] == ["e1"]


def test_an_alloc_updated_by_a_newer_eval_moves_between_eval_indexes() -> None:
    """An alloc's eval id changes when a later eval updates it in place;
    several updates and a delete of the same alloc can share one batch."""
    store = StateStore()

    def alloc(eval_id: str, status: str = "pending") -> pb.Allocation:
        return pb.Allocation(
            id="a1",
            job_id="web",
            namespace="default",
            node_id="n1",
            eval_id=eval_id,
            client_status=status,
        )

    def put(a: pb.Allocation, deleted: bool = False) -> pb.Event:
        return pb.Event(topic=topics.ALLOCATION.name, type="x", allocation=a, deleted=deleted)

    store.apply(_batch(1, put(alloc("e1"))))
    store.apply(_batch(2, put(alloc("e2")), put(alloc("e3", "running"))))
    snap = store.snapshot()
    assert snap.allocs_by_eval("e1") == [] and snap.allocs_by_eval("e2") == []
    assert [a.client_status for a in snap.allocs_by_eval("e3")] == ["running"]
    assert [a.eval_id for a in snap.allocs_by_node("n1")] == ["e3"]
    assert [a.eval_id for a in snap.allocs_by_job("default", "web")] == ["e3"]

    store.apply(_batch(3, put(alloc("e4")), put(alloc("e4"), deleted=True)))
    snap = store.snapshot()
    assert snap.alloc_by_id("a1") is None
    assert snap.allocs_by_eval("e3") == [] and snap.allocs_by_eval("e4") == []
    assert snap.allocs_by_node("n1") == [] and snap.allocs_by_job("default", "web") == []
    assert "n1" not in snap.allocs_by_node_map


def test_a_lean_store_keeps_allocs_without_their_placement_metrics() -> None:
    """Issue 19: a replica keeps allocs without the scheduler's placement
    metrics (three quarters of their bytes); the state's own store keeps
    them whole, for `alloc status -verbose`."""
    alloc = pb.Allocation(id="a1", job_id="web", namespace="default", node_id="n1", eval_id="e1")
    alloc.metrics.nodes_evaluated = 100
    alloc.metrics.nodes_available["dc1"] = 3
    alloc.resources.cpu = 250

    def batch() -> pb.ChangeBatch:
        return _batch(
            1, pb.Event(topic=topics.ALLOCATION.name, type="PlanResult", allocation=alloc)
        )

    full = StateStore()
    full.apply(batch())
    assert full.snapshot().alloc_by_id("a1") == alloc
    lean = StateStore(lean=True)
    lean.apply(batch())
    kept = lean.snapshot().alloc_by_id("a1")
    assert kept is not None and not kept.HasField("metrics")
    expected = pb.Allocation()
    expected.CopyFrom(alloc)
    expected.ClearField("metrics")
    assert kept == expected
    assert lean.snapshot().allocs_by_node("n1") == [kept]
    built = StateStore.build(5, allocs=[alloc], lean=True)
    assert not built.allocs["a1"].HasField("metrics")
    assert alloc.HasField("metrics")  # the caller's message is left alone
