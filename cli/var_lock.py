"""`corral var lock`: Nomad's lock leaser (api/locks.go) over the
Variables service. Acquire the lock (retrying every 1.1 TTL while someone
else holds it, unless early return), run the child while it is held,
renew it every 0.7 TTL, stop the child if the lock is lost, and release it
when the child is done."""

from __future__ import annotations

import os
import random
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

import grpc

from cli.context import CliError
from corral.v1 import structs_pb2 as pb
from corral.v1 import variables_pb2, variables_pb2_grpc

RENEWAL_FACTOR = 0.7
RETRY_FACTOR = 1.1
#: how many times a failed renewal call is retried before the lock is lost
DEFAULT_MAX_RETRY = 5

Log = Callable[[str], None]


@dataclass
class Lease:
    stub: variables_pb2_grpc.VariablesStub
    namespace: str
    variable: pb.Variable
    ttl_s: float
    log: Log
    max_retry: int = DEFAULT_MAX_RETRY

    def acquire(self) -> bool:
        """Whether the lock was taken (False: someone else holds it)."""
        resp = self.stub.Apply(
            variables_pb2.VariablesApplyRequest(
                op="lock-acquire", variable=self.variable, namespace=self.namespace
            ),
            timeout=30,
        )
        if resp.result != "ok":
            return False
        self.variable.metadata.lock.CopyFrom(resp.output.metadata.lock)
        return True

    def renew(self) -> bool:
        """Whether the lock is still ours; retries transport failures."""
        for attempt in range(self.max_retry + 1):
            try:
                self.stub.RenewLock(
                    variables_pb2.VariablesRenewLockRequest(
                        namespace=self.namespace,
                        path=self.variable.metadata.path,
                        lock_id=self.variable.metadata.lock.id,
                    ),
                    timeout=max(1.0, self.ttl_s / 2),
                )
                return True
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                    return False
                if attempt == self.max_retry:
                    return False
                self.log(f"lock renewal failed ({code}), retrying")
                time.sleep(min(1.0 * (attempt + 1), self.ttl_s / 4))
        return False

    def release(self) -> None:
        lock = pb.VariableLock(id=self.variable.metadata.lock.id)
        self.stub.Apply(
            variables_pb2.VariablesApplyRequest(
                op="lock-release",
                variable=pb.Variable(
                    metadata=pb.VariableMetadata(path=self.variable.metadata.path, lock=lock)
                ),
                namespace=self.namespace,
            ),
            timeout=30,
        )


def child_command(args: Sequence[str], shell: bool) -> list[str]:
    if not shell:
        return list(args)
    return [os.environ.get("SHELL") or "/bin/sh", "-c", " ".join(args)]


def run_locked(
    lease: Lease,
    command: list[str],
    *,
    early_return: bool,
    backoff_s: float,
) -> int:
    """Hold the lock around `command`; its exit code (0 with early return
    when the lock is held elsewhere)."""
    time.sleep(random.randrange(100) / 1000)  # Nomad's random start delay
    while not lease.acquire():
        if early_return:
            lease.log("lock is held elsewhere; returning early")
            return 0
        lease.log(f"lock is held elsewhere; trying again in {backoff_s:g}s")
        time.sleep(backoff_s)
    lease.log(f"Variable locked, ready to execute: {shlex.join(command)}")
    try:
        proc = subprocess.Popen(command)
    except OSError as exc:
        lease.release()
        raise CliError(f"Lock error: cannot run {command[0]!r}: {exc.strerror}") from None
    lost = threading.Event()

    def forward(signum: int, frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    # forward Ctrl-C and SIGTERM to the child (only the main thread may
    # install handlers; the CLI runs there)
    previous = (
        {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        if threading.current_thread() is threading.main_thread()
        else {}
    )
    try:
        renewal = lease.ttl_s * RENEWAL_FACTOR
        while True:
            try:
                code = proc.wait(timeout=renewal)
                break
            except subprocess.TimeoutExpired:
                if not lease.renew():
                    lost.set()
                    lease.log("lock lost: stopping the child")
                    proc.terminate()
                    try:
                        code = proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        code = proc.wait()
                    break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if lost.is_set():
        raise CliError("Lock error: the lock was lost while the command ran")
    lease.log("Releasing the lock")
    lease.release()
    if code != 0:
        raise CliError(f"Lock error: the command exited with code {code}")
    return 0
