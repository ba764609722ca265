"""Installs the ledger's counters (corral_ledger_probe.py, beside this
file) in every process started with this directory on PYTHONPATH:
`bench/cluster.py` puts it there for the roles it starts. Nothing of it
is imported from Corral's own code."""

from corral_ledger_probe import install  # type: ignore[import-not-found]

install()
