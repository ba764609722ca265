"""The one error a template can raise: Go's message text, ready for a user."""

from __future__ import annotations


class TemplateError(Exception):
    """A template failed to parse or execute. `str()` is the message Go's
    text/template would give ("template: NAME:LINE: ..." for a parse error,
    "template: NAME:LINE:COL: executing "NAME" at <NODE>: ..." for an
    execution error)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class LimitExceeded(TemplateError):
    """A render went past one of its `Limits` (output, steps, depth, size)."""
