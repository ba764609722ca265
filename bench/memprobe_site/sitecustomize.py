"""Loads bench.memprobe in every process started with this directory on
PYTHONPATH (see bench/memprobe.py); does nothing unless CORRAL_MEMPROBE_OUT is set."""

import os
import sys

if os.environ.get("CORRAL_MEMPROBE_OUT"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from bench.memprobe import install

    install()
