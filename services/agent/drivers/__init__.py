"""Task drivers (Nomad's plugins/drivers): `exec` isolates a command in
namespaces and a root of its own, `raw_exec` runs it as a plain process,
`mock` pretends. `exec` and `raw_exec` start every run through an executor
process (services/agent/executor) and hold it to its resources with a
cgroup where the agent has them (services/agent/cgroups.py).

The modules: `base.py` (`Driver`, `TaskConfig`, `TaskHandle`, ...), one per
driver (`exec.py`, `rawexec.py`, `mock.py`), and `build.py` (the enabled
drivers by name); this package module imports none of them (they import it
back, as their package: the layout test keeps every package free of import
circles).
"""
