"""A stand-in *process* for the supervisor's own tests (not a Corral role):
`ok` writes its ready file and waits for SIGTERM, `stubborn` ignores SIGTERM,
`crash` exits before it is ready."""

import json
import os
import signal
import sys
import time

mode = sys.argv[1]
ready = sys.argv[sys.argv.index("--ready-file") + 1]
if mode == "crash":
    print("boom: cannot bind", flush=True)
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
tmp = ready + ".tmp"
with open(tmp, "w") as fh:
    json.dump({"role": "test", "address": "127.0.0.1:1", "pid": os.getpid(), "metrics": ""}, fh)
os.replace(tmp, ready)
while True:
    time.sleep(0.1)
