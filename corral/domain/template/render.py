"""Rendering a Nomad `template` block's text: Go's template language with
the functions Nomad offers (consul-template's helpers, the Nomad data
functions, `sprig_*`), Nomad's options (delimiters, error_on_missing_key,
the function denylist) and what the runner needs back (the output, the
dependencies used, those still missing)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.domain.template.exec import FuncMap, GoFunction, Limits
from corral.domain.template.functions import CONSUL_TEMPLATE_FUNCS, REFUSED, RenderContext
from corral.domain.template.nomad import Dependency, NomadData, glob_match
from corral.domain.template.sprig import sprig_funcs, sprig_refused
from corral.domain.template.template import Template
from corral.domain.template.values import MISSING, Signature

# Nomad client's default template.function_denylist.
DEFAULT_DENYLIST: tuple[str, ...] = ("plugin", "writeToFile")


def _denied(*_: object) -> str:
    from corral.domain.template.exec import FuncError

    raise FuncError("function is disabled")


def nomad_funcs(denylist: Sequence[str] = DEFAULT_DENYLIST) -> FuncMap:
    """The function map of a Nomad template: consul-template's helpers and
    Nomad functions, Sprig as sprig_*, denied names answering "function is
    disabled" as consul-template's denylist does."""
    funcs: dict[str, GoFunction] = {**CONSUL_TEMPLATE_FUNCS, **sprig_funcs()}
    for pattern in denylist:
        for name in list(funcs):
            if glob_match(pattern, name):
                funcs[name] = GoFunction(_denied, Signature((), "any"))
    return funcs


def refused_funcs() -> dict[str, str]:
    return {**REFUSED, **sprig_refused()}


@dataclass(frozen=True)
class RenderResult:
    """One render: `output` is final only when `missing` is empty (otherwise
    the runner fetches the missing dependencies and renders again)."""

    output: str
    used: frozenset[Dependency]
    missing: frozenset[Dependency]

    @property
    def complete(self) -> bool:
        return not self.missing


@dataclass
class NomadTemplate:
    """A template block's text, parsed once and rendered as often as its
    dependencies change. Raises TemplateError on a syntax error."""

    text: str
    name: str = ""
    left_delimiter: str = "{{"
    right_delimiter: str = "}}"
    error_on_missing_key: bool = False
    function_denylist: Sequence[str] = DEFAULT_DENYLIST
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        self._template = Template(
            self.name,
            self.text,
            funcs=nomad_funcs(self.function_denylist),
            refused=refused_funcs(),
            left_delim=self.left_delimiter,
            right_delim=self.right_delimiter,
            # consul-template runs Go's templates with missingkey=zero, or
            # missingkey=error under error_on_missing_key.
            missing_key="error" if self.error_on_missing_key else "zero",
            limits=self.limits,
        )

    def render(
        self,
        *,
        env: Mapping[str, str] | None = None,
        data: NomadData | None = None,
        namespace: str = "default",
        sandbox_dir: str | None = None,
        now: Callable[[], dt.datetime] | None = None,
    ) -> RenderResult:
        """Execute with the task's environment (`env`), the Nomad data known
        so far (`data`; None: nothing fetched yet) and the task directory
        the `file` function is confined to (`sandbox_dir`). Dot is nil, as
        in consul-template. Raises TemplateError."""
        ctx = RenderContext(
            env=dict(env or {}),
            namespace=namespace,
            data=data,
            sandbox_dir=sandbox_dir,
        )
        if now is not None:
            ctx.now = now
        output = self._template.execute(MISSING, context=ctx)
        return RenderResult(output, frozenset(ctx.used), frozenset(ctx.missing))


def render(text: str, **kwargs: object) -> RenderResult:
    """Parse and render `text` once (see NomadTemplate.render for kwargs)."""
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in NomadTemplate.__dataclass_fields__}
    tmpl = NomadTemplate(text, **options)  # type: ignore[arg-type]
    return tmpl.render(**kwargs)  # type: ignore[arg-type]
