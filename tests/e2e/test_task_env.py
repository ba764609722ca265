"""Task environment, interpolation and dispatch on real processes: the
`corral` CLI against a cluster whose agent runs raw_exec tasks, and the
tasks' own output files as the proof."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from corral.domain import structs
from corral.v1 import structs_pb2 as pb
from tests.cluster import ROOT, Cluster
from tests.devprocess import cli
from tests.e2e.test_agent_lifecycle import allocs, start
from tests.wait import until

PARAMETERIZED = """
job "render" {
  type        = "batch"
  datacenters = ["dc1"]

  meta {
    owner = "media"
  }

  parameterized {
    payload       = "required"
    meta_required = ["input"]
    meta_optional = ["quality"]
  }

  group "frames" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    task "draw" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args = [
          "-c",
          "echo \\"$0 $1 $2 parent=$NOMAD_JOB_PARENT_ID INPUT=$NOMAD_META_INPUT quality=$QUALITY owner=$NOMAD_META_owner\\"; cat \\"$NOMAD_TASK_DIR/in/scene.txt\\"",
          "job=${NOMAD_JOB_ID}",
          "input=${NOMAD_META_input}",
          "dc=${node.datacenter}",
        ]
      }

      env {
        QUALITY = "${NOMAD_META_quality}"
      }

      dispatch_payload {
        file = "in/scene.txt"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""  # noqa: E501 - the task's shell line, as a user writes it


def corral(c: Cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return cli(c.state_addr, *args, stdin=stdin)


def task_output(tmp_path: Path, alloc: pb.Allocation, task: str) -> str:
    path = tmp_path / "agent0" / "allocs" / alloc.id / "alloc" / "logs" / f"{task}.stdout.0"
    return path.read_text() if path.exists() else ""


async def _all_complete(c: Cluster, job_id: str, n: int) -> bool:
    done = [a for a in await allocs(c, job_id) if a.client_status == "complete"]
    return len(done) == n


async def test_the_batch_example_prints_each_alloc_index(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path, 1)
    run = corral(c, "job", "run", "-detach", str(ROOT / "examples" / "batch.nomad.hcl"))
    assert run.returncode == 0, run.stderr
    await until(lambda: _all_complete(c, "batch", 3), timeout=90)
    placed = await allocs(c, "batch")
    outputs = {
        structs.alloc_name_index(a.name): task_output(tmp_path, a, "compute") for a in placed
    }
    assert outputs == {i: f"computing {i}\ndone\n" for i in range(3)}


async def test_dispatch_meta_and_payload_reach_the_task(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path, 1)
    spec = tmp_path / "render.nomad.hcl"
    spec.write_text(PARAMETERIZED)
    run = corral(c, "job", "run", str(spec))
    assert run.returncode == 0, run.stderr
    assert "corral job dispatch render" in run.stdout

    refused = corral(c, "job", "dispatch", "-meta", "input=a.blend", "render")
    assert refused.returncode == 1
    assert "payload is required" in refused.stderr

    payload = tmp_path / "scene.txt"
    payload.write_text("cube at 0,0,0\n")
    dispatched = corral(
        c,
        "job",
        "dispatch",
        "-meta",
        "input=a.blend",
        "-meta",
        "quality=high",
        "render",
        str(payload),
    )
    assert dispatched.returncode == 0, dispatched.stdout + dispatched.stderr
    child_id = next(
        line.split("=", 1)[1].strip()
        for line in dispatched.stdout.splitlines()
        if line.startswith("Dispatched Job ID")
    )
    assert child_id.startswith("render/dispatch-")
    # not detached: the monitor returned once the child's alloc left pending
    await until(lambda: _all_complete(c, child_id, 1), timeout=60)
    (alloc,) = await allocs(c, child_id)
    assert task_output(tmp_path, alloc, "draw") == (
        f"job={child_id} input=a.blend dc=dc1 parent=render INPUT=a.blend quality=high"
        " owner=media\ncube at 0,0,0\n"
    )

    from_stdin = corral(
        c,
        "job",
        "dispatch",
        "-detach",
        "-json",
        "-meta",
        "input=b.blend",
        "-id-prefix-template",
        "stdin",
        "render",
        "-",
        stdin="sphere\n",
    )
    assert from_stdin.returncode == 0, from_stdin.stderr
    resp = json.loads(from_stdin.stdout)
    assert resp["dispatched_job_id"].startswith("render/dispatch-stdin-") and resp["eval_id"]
    await until(lambda: _all_complete(c, resp["dispatched_job_id"], 1), timeout=60)
    (alloc,) = await allocs(c, resp["dispatched_job_id"])
    out = task_output(tmp_path, alloc, "draw")
    status = corral(c, "job", "status", "render")
    assert status.returncode == 0, status.stderr
    assert "Required Metadata = input\nOptional Metadata = quality\n" in status.stdout
    children = status.stdout.split("Dispatched Jobs\n", 1)[1]
    assert re.search(rf"^{re.escape(child_id)} +dead$", children, re.MULTILINE)
    assert resp["dispatched_job_id"] in children
    assert "input=b.blend dc=dc1 parent=render INPUT=b.blend" in out
    assert "quality=${NOMAD_META_quality} owner=media" in out  # unset optional meta: as written
    assert out.endswith("\nsphere\n")
