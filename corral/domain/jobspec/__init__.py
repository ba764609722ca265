"""Job files → `pb.Job`: `load.py` (`parse_job`, `load_job`, `var_inputs`)
picks Nomad's HCL2 job files (`hcl.py`, evaluated by `language/`:
variables, locals, functions, dynamic blocks) or Nomad's JSON API shape or
our proto JSON (`json.py`); Nomad's defaults (`defaults.py`) and the checks
that turn mistakes into one-line `file:line: field: problem` errors
(`validate.py`, `errors.py`).

This package module imports none of its modules (they import it back, as
their package: the layout test keeps every package free of import
circles): import from the modules themselves."""
