"""A parsed Go template set, ready to execute (Go's template.Template)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.domain.template import gofmt
from corral.domain.template.builtins import BUILTINS
from corral.domain.template.errors import TemplateError
from corral.domain.template.exec import MISSING_KEY_MODES, Executor, FuncMap, Limits
from corral.domain.template.nodes import Tree
from corral.domain.template.parser import parse
from corral.domain.template.values import MISSING


class Template:
    """`text` parsed once under `name`, with the functions it may call
    (`funcs`, on top of Go's builtins) and the names it must refuse with a
    reason (`refused`: a function Nomad has that Corral does not)."""

    def __init__(
        self,
        name: str,
        text: str,
        *,
        funcs: FuncMap | None = None,
        refused: Mapping[str, str] | None = None,
        left_delim: str = "",
        right_delim: str = "",
        missing_key: str = "default",
        limits: Limits | None = None,
    ) -> None:
        if missing_key not in MISSING_KEY_MODES:
            raise TemplateError(f"template: unrecognized option: missingkey={missing_key}")
        self.name = name
        self.funcs: FuncMap = dict(funcs or {})
        self.missing_key = missing_key
        self.limits = limits or Limits()
        refused = refused or {}
        limit = self.limits.max_value_len
        if len(text) > limit:
            raise TemplateError(
                f"template: {name}: the template has {len(text)} characters, "
                f"more than the limit of {limit}"
            )

        def has_function(fn: str) -> bool:
            return fn in self.funcs or fn in BUILTINS

        def refuse(fn: str) -> str | None:
            why = refused.get(fn)
            if why is None or has_function(fn):
                return None
            reason = f": {why}" if why else ""
            return f"function {gofmt.quote(fn)} is not supported by Corral{reason}"

        try:
            self.trees: dict[str, Tree] = parse(
                name,
                text,
                left=left_delim or "{{",
                right=right_delim or "}}",
                has_function=has_function,
                refused=refuse,
                max_depth=self.limits.max_nesting,
            )
        except RecursionError:
            raise TemplateError(f"template: {name}: max expression depth exceeded") from None

    def defined_templates(self) -> list[str]:
        return sorted(n for n, t in self.trees.items() if t.root is not None)

    def execute(self, data: Any = MISSING, *, context: Any = None, name: str | None = None) -> str:
        """Render the template (or the defined template `name`) with `data`
        as dot; `context` is handed to functions that need the render's
        context. Raises TemplateError (LimitExceeded past a limit)."""
        target = self.name if name is None else name
        if target not in self.trees:
            raise TemplateError(
                f"template: no template {gofmt.quote(target)} associated with template "
                f"{gofmt.quote(self.name)}"
            )
        ex = Executor(self.trees, self.funcs, BUILTINS, self.missing_key, self.limits, context)
        # Go's Execute(w, nil): dot is "no value", not a nil interface.
        return ex.execute(target, MISSING if data is None else data)
