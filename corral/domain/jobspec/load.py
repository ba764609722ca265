"""A job file or text → `pb.Job`: JSON when it starts with `{` (`json.py`),
HCL otherwise (`hcl.py`), with Nomad's defaults applied and validated; and
the variable values `job run|plan|validate` pass to the HCL parser."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.language.variables import ENV_PREFIX, VarInputs
from corral.v1 import structs_pb2 as pb


def parse_job(text: str, filename: str = "<stdin>", inputs: VarInputs | None = None) -> pb.Job:
    """Parse a job from text: JSON when it starts with `{`, HCL otherwise.

    The result has Nomad's defaults applied and has passed validation.
    `inputs` gives HCL variables their values (-var, -var-file, NOMAD_VAR_*)."""
    # the parsers load when a job is parsed, not with every CLI command
    from corral.domain.jobspec import hcl, json

    if text.lstrip().startswith("{"):
        if inputs is not None and (inputs.args or inputs.files or inputs.content):
            raise JobspecError(filename, None, "", "cannot use variables with JSON files")
        return json.parse(text, filename)
    return hcl.parse(text, filename, inputs)


def _read(path: str, what: str) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobspecError(path, None, "", "no such file") from None
    except IsADirectoryError:
        raise JobspecError(path, None, "", f"is a directory, not a {what}") from None
    except UnicodeDecodeError as exc:
        raise JobspecError(path, None, "", f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise JobspecError(path, None, "", exc.strerror or str(exc)) from None


def var_inputs(
    args: list[str] | None = None,
    files: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    strict: bool = True,
) -> VarInputs:
    """What `job run|plan|validate` pass to the parser: `-var k=v` flags,
    `-var-file` paths (read here) and the NOMAD_VAR_* environment."""
    environ = os.environ if env is None else env
    return VarInputs(
        args=list(args or []),
        files=[(f, _read(f, "var file")) for f in files or []],
        env={k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)},
        strict=strict,
    )


def read_job_file(path: str) -> tuple[str, str]:
    """A job file's (text, name for errors); `-` reads standard input."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    return _read(path, "job file"), path


def load_job(path: str, inputs: VarInputs | None = None) -> pb.Job:
    """Read and parse a job file (`-` reads standard input)."""
    return parse_job(*read_job_file(path), inputs)


def submission(text: str, inputs: VarInputs | None = None) -> pb.JobSubmission:
    """What a registration keeps of the file it came from (Nomad's
    JobSubmission): the text, its format, the -var and NOMAD_VAR_* values
    (flags winning) and the var files' text, so the job can be shown and
    submitted again as written."""
    sub = pb.JobSubmission(source=text, format="json" if text.lstrip().startswith("{") else "hcl2")
    if inputs is not None:
        sub.variable_flags.update({k[len(ENV_PREFIX) :]: v for k, v in inputs.env.items()})
        sub.variable_flags.update(inputs.flags())
        texts = [t.rstrip("\n") for _, t in inputs.files] + [inputs.content.rstrip("\n")]
        sub.variables = "\n\n".join(t for t in texts if t)
    return sub
