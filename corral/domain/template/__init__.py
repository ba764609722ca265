"""Nomad's template language: Go's text/template with consul-template's
functions, as a pure library (no I/O beyond the `file` function and the
host's addresses for `sockaddr`). See docs/templates.md.

    tmpl = NomadTemplate('{{ with nomadVar "nomad/jobs/web" }}{{ .password }}{{ end }}')
    result = tmpl.render(env=task_env, data=provider, sandbox_dir=task_dir)
    if result.complete:
        write(result.output)        # else fetch result.missing and render again

The modules: `template.py` (the language: `Template`), `render.py`
(`NomadTemplate`, `render`, `nomad_funcs`), `nomad.py` (the data providers
and their dependencies), `exec.py` (`Limits`, `GoFunction`), `errors.py`;
this package module imports none of them (they import it back, as their
package: the layout test keeps every package free of import circles).
"""
