import io

from cli.plan_output import changes, write_plan
from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb


def plan(**updates: int) -> job_pb2.JobPlanResponse:
    resp = job_pb2.JobPlanResponse(job_modify_index=12)
    resp.annotations.desired_tg_updates["web"].CopyFrom(pb.DesiredUpdates(**updates))
    resp.diff.CopyFrom(job_pb2.JobDiff(type="Edited", id="j"))
    return resp


def test_exit_code_rules_follow_nomad():
    assert changes(plan(place=1))
    assert changes(plan(stop=2))
    assert changes(plan(destructive_update=1))
    assert changes(plan(migrate=1)) and changes(plan(canary=1))
    assert not changes(plan(in_place_update=3, ignore=1))
    none = plan(place=1)
    none.diff.type = "None"
    assert not changes(none)


def test_rendering_shows_annotations_and_check_index():
    resp = plan(place=2, ignore=1)
    resp.diff.task_groups.add(type="Edited", name="web").fields.add(
        type="Edited", name="Count", old="1", new="3"
    )
    out = io.StringIO()
    job = pb.Job(id="j")
    write_plan(out, job, resp, filename="j.hcl", verbose=False)
    text = out.getvalue()
    assert '+/- Job: "j"' in text
    assert '+/- Task Group: "web" (2 create, 1 ignore)' in text
    assert '+/- Count: "1" => "3"' in text
    assert "- All tasks successfully allocated." in text
    assert "corral job run -check-index 12 j.hcl" in text


def test_rendering_failed_placements():
    resp = plan(place=1)
    resp.failed_tg_allocs["web"].CopyFrom(
        pb.AllocMetric(nodes_evaluated=3, nodes_exhausted=3, dimension_exhausted={"memory": 3})
    )
    out = io.StringIO()
    write_plan(out, pb.Job(id="j"), resp, filename="j.hcl", verbose=False)
    text = out.getvalue()
    assert "WARNING: Failed to place all allocations." in text
    assert 'Task Group "web" (failed to place 1 allocation)' in text
    assert 'Dimension "memory" exhausted on 3 nodes' in text


def test_unchanged_job_still_shows_the_annotations():
    resp = plan(ignore=3)
    resp.diff.type = "None"
    out = io.StringIO()
    write_plan(out, pb.Job(id="j"), resp, filename="j.hcl", verbose=False)
    assert 'Task Group: "web" (3 ignore)' in out.getvalue()
    assert not changes(resp)
