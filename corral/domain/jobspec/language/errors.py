"""The one error of the HCL layer: a problem at a place in one source."""

from __future__ import annotations

import bisect


class Source:
    """A file's text with a line lookup by offset."""

    def __init__(self, text: str, filename: str) -> None:
        self.text = text
        self.filename = filename
        self._newlines = [i for i, c in enumerate(text) if c == "\n"]

    def line(self, offset: int) -> int:
        return bisect.bisect_left(self._newlines, offset) + 1

    def error(self, offset: int | None, message: str) -> HclError:
        return HclError(self.filename, None if offset is None else self.line(offset), message)


class HclError(Exception):
    """Rendered by the jobspec layer as `file:line: problem`."""

    def __init__(self, filename: str, line: int | None, message: str, field: str = "") -> None:
        super().__init__(message)
        self.filename = filename
        self.line = line
        self.message = message
        #: the block path of the argument being evaluated ('job "a" > group "b" > count')
        self.field = field

    def __str__(self) -> str:
        where = self.filename if self.line is None else f"{self.filename}:{self.line}"
        what = f"{self.field}: {self.message}" if self.field else self.message
        return f"{where}: {what}"
