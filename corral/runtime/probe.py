"""`python -m corral.runtime.probe ADDRESS [SERVICE]`: one gRPC health check, for
Kubernetes' exec probes.

The kubelet's own gRPC probe cannot speak TLS and every role refuses
plaintext, so a pod that must report more than "the port is open" runs this
inside its container: it dials with the pod's own certificate (the
CORRAL_CA_FILE/CERT_FILE/KEY_FILE of its environment, as the role does) and
exits 0 when SERVICE is SERVING, 1 otherwise (NOT_SERVING, unknown service,
unreachable, timed out), with one line on stderr saying which. The broker and
planner report `LEADER_SERVICE` SERVING only while they hold the leader lock,
so their readiness probe keeps standbys out of their Services.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.security import transport

# the health service name a LeaderRole reports SERVING only while in office
LEADER_SERVICE = "corral.leader"


def check(address: str, service: str = "", timeout: float = 3.0) -> tuple[bool, str]:
    """Whether `service` at `address` answers SERVING, and what it said."""
    # the first answer is the verdict: a probe that retries UNAVAILABLE would
    # report a dead process as a timeout
    channel = transport.dial_sync(address, options=[("grpc.enable_retries", 0)])
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as err:
        return False, f"{err.code().name}: {err.details()}"
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corral.runtime.probe", description=__doc__)
    parser.add_argument("address", help="host:port of the role's gRPC port")
    parser.add_argument("service", nargs="?", default="", help="health service name ('': all)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait")
    args = parser.parse_args(argv)
    ok, said = check(args.address, args.service, args.timeout)
    if not ok:
        print(f"{args.address} {args.service or '(server)'}: {said}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
