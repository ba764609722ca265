"""Host volumes and artifacts in job files (Nomad's volume, volume_mount
and artifact blocks), in HCL and Nomad's JSON: what they become, Nomad's
defaults, and what is refused (with the line, or the JSON field) — the
same checks the state runs on a job registered over gRPC."""

from __future__ import annotations

import pytest

from corral.domain.errors import InvalidArgument
from corral.domain.jobspec import hcl
from corral.domain.jobspec import json as jobspec_json
from corral.domain.jobspec.errors import JobspecError
from corral.v1 import structs_pb2 as pb
from services.state.writes.jobs import canonicalize, validate_job

SUM = "sha256:" + "ab" * 32


def job(group: str = "", task: str = "", job_type: str = "service") -> str:
    return f"""
job "j" {{
  type = "{job_type}"
  group "g" {{
    count = 2
{group}
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/true"
      }}
{task}
    }}
  }}
}}
"""


VOLUME = """
    volume "data" {
      type      = "host"
      source    = "data"
      read_only = true
      per_alloc = true
    }
"""


def test_volumes_mounts_and_artifacts_parse_with_nomads_defaults() -> None:
    task = """
      volume_mount {
        volume      = "data"
        destination = "/srv/data"
        read_only   = true
      }
      artifact {
        source = "https://example.com/app.tar.gz"
        options {
          checksum = "SUM"
          archive  = "false"
        }
        headers {
          Authorization = "Bearer ${NOMAD_ALLOC_ID}"
        }
        chown = true
      }
      artifact {
        source = "https://example.com/bin/run.sh?x=1"
        mode   = "file"
      }
""".replace("SUM", SUM)
    parsed = hcl.parse(job(VOLUME, task), "j.hcl")
    tg = parsed.task_groups[0]
    assert tg.volumes["data"] == pb.VolumeRequest(
        name="data", type="host", source="data", read_only=True, per_alloc=True
    )
    t = tg.tasks[0]
    assert list(t.volume_mounts) == [
        pb.VolumeMount(volume="data", destination="/srv/data", read_only=True)
    ]
    first, second = t.artifacts
    assert first.getter_mode == "any" and first.relative_dest == "local/" and first.chown
    assert dict(first.getter_options) == {"checksum": SUM, "archive": "false"}
    assert dict(first.getter_headers) == {"Authorization": "Bearer ${NOMAD_ALLOC_ID}"}
    assert second.relative_dest == "local/run.sh"  # mode file: local/<the file's name>


@pytest.mark.parametrize(
    ("group", "task", "job_type", "problem"),
    [
        (
            "",
            'volume_mount {\n volume = "nope"\n destination = "/x"\n}',
            "service",
            "references undefined volume nope",
        ),
        (VOLUME.replace('"host"', '"csi"'), "", "service", "CSI volumes are not supported"),
        (VOLUME.replace("per_alloc = true", "sticky = true"), "", "service", "sticky volumes"),
        (VOLUME, "", "system", "cannot be per_alloc for system or sysbatch jobs"),
        (VOLUME.replace('source    = "data"', ""), "", "service", "volume has an empty source"),
        (
            VOLUME.replace("read_only = true", 'access_mode = "single-node-reader-only"'),
            "",
            "service",
            "must be read-only",
        ),
        (
            VOLUME.replace("}", 'mount_options {\n fs_type = "ext4"\n}\n}', 1),
            "",
            "service",
            "host volumes cannot have mount options",
        ),
        (
            VOLUME,
            'volume_mount {\n volume = "data"\n destination = "../../etc"\n}',
            "service",
            "must not leave the task's directory",
        ),
        (
            VOLUME,
            'volume_mount {\n volume = "data"\n destination = "/d"\n'
            ' propagation_mode = "bidirectional"\n}',
            "service",
            "not supported by Corral",
        ),
        (
            "",
            'artifact {\n source = "git::https://x/y"\n}',
            "service",
            "the git getter is not supported",
        ),
        (
            "",
            'artifact {\n source = "https://x/y"\n options {\n checksum = "sha256:12"\n}\n}',
            "service",
            "invalid sha256 checksum",
        ),
        (
            "",
            'artifact {\n source = "https://x/y"\n options {\n checksum = "crc:12"\n}\n}',
            "service",
            "unsupported checksum type: crc",
        ),
        (
            "",
            'artifact {\n source = "https://x/y"\n destination = "../../../x"\n}',
            "service",
            "destination escapes allocation directory",
        ),
        (
            "",
            'artifact {\n source = "https://x/y.rar"\n options {\n archive = "rar"\n}\n}',
            "service",
            "unknown archive format 'rar'",
        ),
        (
            "",
            'artifact {\n source = "https://x/y"\n mode = "tree"\n}',
            "service",
            "invalid artifact mode",
        ),
        ("", "artifact {\n}", "service", "source must be specified"),
    ],
)
def test_what_is_refused(group: str, task: str, job_type: str, problem: str) -> None:
    with pytest.raises(JobspecError) as err:
        hcl.parse(job(group, task, job_type), "j.hcl")
    assert problem in str(err.value)
    assert err.value.line is not None  # the line of the block it came from


def test_runtime_values_are_left_for_the_client() -> None:
    task = (
        'artifact {\n source = "https://${attr.unique.hostname}/x"\n'
        ' options {\n checksum = "${NOMAD_META_sum}"\n}\n}'
    )
    parsed = hcl.parse(job("", task), "j.hcl")
    assert parsed.task_groups[0].tasks[0].artifacts[0].getter_options["checksum"] == (
        "${NOMAD_META_sum}"
    )


def test_nomad_json_and_the_state_agree() -> None:
    body = {
        "ID": "j",
        "TaskGroups": [
            {
                "Name": "g",
                "Volumes": {"data": {"Name": "data", "Type": "host", "Source": "data"}},
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "exec",
                        "Config": {"command": "/bin/true"},
                        "VolumeMounts": [{"Volume": "data", "Destination": "/d"}],
                        "Artifacts": [{"GetterSource": "https://x/a.zip"}],
                    }
                ],
            }
        ],
    }
    parsed = jobspec_json.from_nomad(body)
    assert parsed.task_groups[0].tasks[0].artifacts[0].relative_dest == "local/"
    validate_job(canonicalize(parsed))
    body["TaskGroups"][0]["Tasks"][0]["VolumeMounts"][0]["Volume"] = "other"  # type: ignore[index]
    with pytest.raises(JobspecError, match=r"VolumeMounts\[0\]\.Volume"):
        jobspec_json.from_nomad(body)
    # over gRPC the state refuses it too, naming the field
    wrong = pb.Job()
    wrong.CopyFrom(parsed)
    wrong.task_groups[0].volumes["data"].type = "csi"
    with pytest.raises(InvalidArgument) as err:
        validate_job(canonicalize(wrong))
    assert err.value.field == "job.task_groups[0].volumes[data].type"
