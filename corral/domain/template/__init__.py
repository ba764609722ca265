"""Nomad's template language: Go's text/template with consul-template's
functions, as a pure library (no I/O beyond the `file` function and the
host's addresses for `sockaddr`). See docs/templates.md.

    tmpl = NomadTemplate('{{ with nomadVar "nomad/jobs/web" }}{{ .password }}{{ end }}')
    result = tmpl.render(env=task_env, data=provider, sandbox_dir=task_dir)
    if result.complete:
        write(result.output)        # else fetch result.missing and render again
"""

from corral.domain.template.errors import LimitExceeded, TemplateError
from corral.domain.template.exec import FuncError, GoFunction, Limits
from corral.domain.template.nomad import (
    UNKNOWN,
    Dependency,
    FileDependency,
    MemoryData,
    NomadData,
    NomadService,
    NomadServicesSnippet,
    NomadVariable,
    NomadVarItems,
    NomadVarMeta,
    ProviderError,
    ServiceQuery,
    ServicesQuery,
    VarGet,
    VarList,
)
from corral.domain.template.render import NomadTemplate, RenderResult, nomad_funcs, render
from corral.domain.template.template import Template
from corral.domain.template.values import Signature

__all__ = [
    "UNKNOWN",
    "Dependency",
    "FileDependency",
    "FuncError",
    "GoFunction",
    "LimitExceeded",
    "Limits",
    "MemoryData",
    "NomadData",
    "NomadService",
    "NomadServicesSnippet",
    "NomadTemplate",
    "NomadVarItems",
    "NomadVarMeta",
    "NomadVariable",
    "ProviderError",
    "RenderResult",
    "ServiceQuery",
    "ServicesQuery",
    "Signature",
    "Template",
    "TemplateError",
    "VarGet",
    "VarList",
    "nomad_funcs",
    "render",
]
