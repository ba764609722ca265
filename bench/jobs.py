"""Benchmark jobs, written as jobspecs and parsed by the CLI's parser, so a
benchmark job is exactly what `corral job run` would submit."""

from __future__ import annotations

from dataclasses import dataclass

from corral.domain.jobspec.load import parse_job
from corral.v1 import structs_pb2 as pb


@dataclass(frozen=True)
class Group:
    name: str
    count: int
    node_class: str = ""  # constrain the group to one node class


def job(
    job_id: str,
    groups: list[Group],
    *,
    type_: str = "service",
    cpu: int = 100,
    memory: int = 256,
    meta: dict[str, str] | None = None,
) -> pb.Job:
    """A mock-driver job whose tasks run until stopped."""
    parts = [f'job "{job_id}" {{', f'  type = "{type_}"', '  datacenters = ["*"]']
    if meta:
        parts.append("  meta {")
        parts += [f'    {k} = "{v}"' for k, v in meta.items()]
        parts.append("  }")
    for g in groups:
        parts.append(f'  group "{g.name}" {{')
        if type_ not in ("system", "sysbatch"):
            parts.append(f"    count = {g.count}")
        if g.node_class:
            parts += [
                "    constraint {",
                '      attribute = "${node.class}"',
                f'      value     = "{g.node_class}"',
                "    }",
            ]
        parts += [
            '    task "main" {',
            '      driver = "mock"',
            '      config { run_for = "0s" }',
            f"      resources {{\n        cpu = {cpu}\n        memory = {memory}\n      }}",
            "    }",
            "  }",
        ]
    parts.append("}")
    return parse_job("\n".join(parts), f"{job_id}.nomad.hcl")


def service(job_id: str, count: int, **kw: object) -> pb.Job:
    return job(job_id, [Group("g", count)], **kw)  # type: ignore[arg-type]
