"""Job files → `pb.Job`: Nomad-style HCL (`hcl.py`), Nomad's JSON API shape or
our proto JSON (`json.py`), Nomad's defaults (`defaults.py`) and the checks
that turn mistakes into one-line `file:line: field: problem` errors
(`validate.py`)."""

from __future__ import annotations

from pathlib import Path

from corral.domain.jobspec.duration import format_duration, parse_duration
from corral.domain.jobspec.errors import JobspecError
from corral.v1 import structs_pb2 as pb

__all__ = ["JobspecError", "format_duration", "load_job", "parse_duration", "parse_job"]


def parse_job(text: str, filename: str = "<stdin>") -> pb.Job:
    """Parse a job from text: JSON when it starts with `{`, HCL otherwise.

    The result has Nomad's defaults applied and has passed validation."""
    from corral.domain.jobspec import hcl, json

    if text.lstrip().startswith("{"):
        return json.parse(text, filename)
    return hcl.parse(text, filename)


def load_job(path: str) -> pb.Job:
    """Read and parse a job file (`-` reads standard input)."""
    import sys

    if path == "-":
        return parse_job(sys.stdin.read(), "<stdin>")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobspecError(path, None, "", "no such file") from None
    except IsADirectoryError:
        raise JobspecError(path, None, "", "is a directory, not a job file") from None
    except UnicodeDecodeError as exc:
        raise JobspecError(path, None, "", f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise JobspecError(path, None, "", exc.strerror or str(exc)) from None
    return parse_job(text, path)
