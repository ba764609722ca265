"""Shared helpers for the template tests."""

from __future__ import annotations

from typing import Any

from corral.domain.template.errors import TemplateError
from corral.domain.template.template import Template


def run(text: str, data: Any = None, **kwargs: Any) -> str:
    return Template("t", text, **kwargs).execute(data)


def error(text: str, data: Any = None, **kwargs: Any) -> str:
    try:
        out = Template("t", text, **kwargs).execute(data)
    except TemplateError as exc:
        return str(exc)
    raise AssertionError(f"expected an error, rendered {out!r}")
