"""Job files → `pb.Job`: `load.py` (`parse_job`, `load_job`) picks Nomad-style
HCL (`hcl.py`) or Nomad's JSON API shape or our proto JSON (`json.py`);
Nomad's defaults (`defaults.py`) and the checks that turn mistakes into
one-line `file:line: field: problem` errors (`validate.py`, `errors.py`).

This package module imports none of its modules that import it back (the
layout test keeps the package free of import circles): import from the
modules themselves."""
