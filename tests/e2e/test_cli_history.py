"""`corral job history -p` as a user runs it, against a real state process:
each version with its field-level diff against the one before."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.cluster import Cluster
from tests.e2e.test_task_env import corral

SPEC = """
job "hist" {
  type        = "batch"
  datacenters = ["dc1"]

  group "g" {
    count = %d

    task "t" {
      driver = "mock"

      config {
        run_for = "%s"
        tags    = ["a", "%s"]
      }
    }
  }
}
"""


def test_history_shows_each_versions_diff(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    c.start("state")
    spec = tmp_path / "hist.nomad.hcl"
    for count, run_for, tag in ((1, "5s", "b"), (2, "10s", "c")):
        spec.write_text(SPEC % (count, run_for, tag))
        run = corral(c, "job", "run", "-detach", str(spec))
        assert run.returncode == 0, run.stderr

    history = corral(c, "job", "history", "-p", "hist")
    assert history.returncode == 0, history.stderr
    newest, oldest = history.stdout.split("\n\n")
    assert newest.startswith("Version     = 1\n")
    assert newest.endswith(
        "Diff        = \n"
        '+/- Job: "hist"\n'
        '+/- Task Group: "g"\n'
        '  +/- Count: "1" => "2"\n'
        '  +/- Task: "t"\n'
        "    +/- Config {\n"
        '      +/- run_for: "5s" => "10s"\n'
        '      +/- tags:    ["a", "b"] => ["a", "c"]\n'
        "        }"
    )
    assert oldest.startswith("Version     = 0\n") and "Diff" not in oldest
    for internal in ("Fields[", "StringValue", "ListValue"):
        assert internal not in history.stdout

    plain = corral(c, "job", "history", "hist")
    assert plain.returncode == 0 and "Diff" not in plain.stdout

    one = corral(c, "job", "history", "-p", "-version", "1", "hist")
    assert one.returncode == 0 and one.stdout == newest + "\n"

    as_json = corral(c, "job", "history", "-p", "-json", "hist")
    assert as_json.returncode == 0, as_json.stderr
    parsed = json.loads(as_json.stdout)
    assert [v["version"] for v in parsed["versions"]] == [1, 0]
    assert [d["type"] for d in parsed["diffs"]] == ["Edited"]
