"""Host volumes in placement (Nomad's HostVolumeChecker for static host
volumes, feasible_test.go): the node must offer every host volume the group
asks for, writable where the request is; a per_alloc request names the
alloc's own volume `source[N]`; a node without them is filtered as
"missing compatible host volumes"."""

from __future__ import annotations

from corral.domain import structs, volumes
from corral.domain.structs import EvalStatus
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb

FILTER = "missing compatible host volumes"


def _node(**offered: bool) -> pb.Node:
    """A node offering host volumes name -> read_only."""
    n = mock.node()
    for name, read_only in offered.items():
        n.host_volumes[name].CopyFrom(
            pb.ClientHostVolumeConfig(name=name, path=f"/srv/{name}", read_only=read_only)
        )
    n.computed_class = structs.computed_class(n)
    return n


def _job(count: int = 1, **requests: pb.VolumeRequest) -> pb.Job:
    job = mock.job(count=count)
    for name, req in requests.items():
        req.name = name
        req.type = volumes.TYPE_HOST
        job.task_groups[0].volumes[name].CopyFrom(req)
    return job


def _run(h: Harness, job: pb.Job) -> pb.Evaluation:
    h.upsert_jobs(job)
    h.process(job.type, mock.eval_for(job))
    return h.last_eval()


def _placed(h: Harness) -> list[pb.Allocation]:
    return [a for p in h.plans for lst in p.node_allocation.values() for a in lst.allocs]


def test_only_nodes_with_the_volume_are_used_and_others_are_filtered() -> None:
    h = Harness()
    without = [_node() for _ in range(3)]
    with_it = _node(data=False)
    h.upsert_nodes(*without, with_it)
    _run(h, _job(count=2, data=pb.VolumeRequest(source="data")))
    placed = _placed(h)
    assert len(placed) == 2 and {a.node_id for a in placed} == {with_it.id}
    assert all(a.metrics.constraint_filtered[FILTER] >= 1 for a in placed)


def test_a_writable_request_needs_a_writable_volume() -> None:
    h = Harness()
    h.upsert_nodes(_node(data=True))
    ev = _run(h, _job(data=pb.VolumeRequest(source="data")))
    assert not _placed(h)
    assert ev.status == EvalStatus.COMPLETE and ev.blocked_eval
    failed = ev.failed_tg_allocs["web"]
    assert failed.nodes_filtered == 1 and failed.constraint_filtered[FILTER] == 1


def test_a_read_only_request_takes_a_read_only_volume() -> None:
    h = Harness()
    node = _node(data=True)
    h.upsert_nodes(node)
    _run(h, _job(data=pb.VolumeRequest(source="data", read_only=True)))
    assert [a.node_id for a in _placed(h)] == [node.id]


def test_a_missing_volume_blocks_with_nomads_reason() -> None:
    h = Harness()
    h.upsert_nodes(_node(logs=False), _node())
    ev = _run(h, _job(data=pb.VolumeRequest(source="data")))
    assert not _placed(h)
    failed = ev.failed_tg_allocs["web"]
    assert failed.constraint_filtered[FILTER] == 2


def test_per_alloc_volumes_follow_the_alloc_index() -> None:
    h = Harness()
    first = _node(**{"data[0]": False})
    second = _node(**{"data[1]": False})
    h.upsert_nodes(second, first)
    job = _job(count=2, data=pb.VolumeRequest(source="data", per_alloc=True))
    _run(h, job)
    by_name = {a.name: a.node_id for a in _placed(h)}
    assert by_name == {f"{job.id}.web[0]": first.id, f"{job.id}.web[1]": second.id}


def test_source_for_names_the_allocs_own_volume() -> None:
    req = pb.VolumeRequest(source="db", per_alloc=True)
    assert volumes.source_for(req, "job.group[12]") == "db[12]"
    assert volumes.source_for(pb.VolumeRequest(source="db"), "job.group[12]") == "db"


def test_changing_a_groups_volumes_is_a_destructive_update() -> None:
    from services.worker.scheduler import util

    old = _job(data=pb.VolumeRequest(source="data"))
    new = structs.copy_msg(old)
    new.task_groups[0].volumes["data"].read_only = True
    assert util.tasks_updated(new, old, "web") == "group volumes"
    new = structs.copy_msg(old)
    new.task_groups[0].tasks[0].volume_mounts.add(volume="data", destination="/d")
    assert util.tasks_updated(new, old, "web").endswith("volume mounts")
