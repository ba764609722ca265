"""The one error a job file can produce: where (file, line) and what (field, problem)."""

from __future__ import annotations


class JobspecError(Exception):
    """A malformed or unsupported job file.

    Rendered on one line as `file:line: field: problem` so an editor can jump
    to it; `line` is None when the problem has no single place (JSON input, a
    missing block)."""

    def __init__(self, filename: str, line: int | None, field: str, problem: str) -> None:
        self.filename = filename
        self.line = line
        self.field = field
        self.problem = problem
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.filename if self.line is None else f"{self.filename}:{self.line}"
        what = f"{self.field}: {self.problem}" if self.field else self.problem
        return f"{where}: {what}"
