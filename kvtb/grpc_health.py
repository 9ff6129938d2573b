"""gRPC health checking (grpc.health.v1) and server reflection for every service.

Servers call `add_health_and_reflection` before they start: everything is NOT_SERVING
until the service calls `health.set_serving()`, and again while it shuts down.
`kvtb health ADDR` probes a server (used by `kvtb up` and by the containers' health checks), as the
operator over mutual TLS (the internal ports), else in plain text (the frontend's user port).
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import time
from typing import Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kvtb.credentials import IDENTITIES, CredentialsError
from kvtb.rpc import OPERATOR, Security, channel

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """The health servicer of one server and the service names it answers for.

    With a grpc.aio server, call set_serving / set_not_serving from its event loop.
    """

    def __init__(self, servicer: health.HealthServicer, service_names: Iterable[str]):
        self.servicer = servicer
        self.service_names = ["", *service_names]
        self._pending: list[asyncio.Future] = []  # keeps the aio servicer's updates alive

    def _set(self, status: int) -> None:
        for name in self.service_names:
            result = self.servicer.set(name, status)
            if inspect.isawaitable(result):  # the grpc.aio servicer's set is a coroutine
                self._pending.append(asyncio.ensure_future(result))

    def set_serving(self) -> None:
        self._set(SERVING)

    def set_not_serving(self) -> None:
        self._set(NOT_SERVING)


def add_health_and_reflection(server, service_names: Iterable[str], *, aio: bool = False) -> Health:
    """Register health (NOT_SERVING for now) and reflection for the named services.

    With aio=True, call it from the server's running event loop.
    """
    names = list(service_names)
    servicer = health.aio.HealthServicer() if aio else health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME], server)
    status = Health(servicer, names)
    status.set_not_serving()  # the servicer itself starts with "" SERVING
    return status


def securities(security: Security | None = None) -> list[Security]:
    """How to reach a port whose security is not known: over mutual TLS as the operator, or else as
    whichever identity's certificate the credentials directory holds (a container holds only its
    own), then in plain text (the frontend's user port); or just `security` when it is given."""
    if security is not None:
        return [security]
    found = []
    for identity in (OPERATOR, *IDENTITIES):
        try:
            found.append(Security.of(identity))
            break
        except CredentialsError:
            continue
    return [*found, Security.off()]


def check(address: str, service: str = "", timeout_s: float = 2.0, security: Security | None = None) -> int | None:
    """Return the server's health status, or None when it cannot be reached."""
    for sec in securities(security):
        with channel(address, sec) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            try:
                return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s).status
            except grpc.RpcError:
                continue
    return None


def wait_serving(address: str, timeout_s: float = 60.0, service: str = "", security: Security | None = None) -> bool:
    """Poll until the server at address answers SERVING; False after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check(address, service, security=security) == SERVING:
            return True
        time.sleep(0.2)
    return False


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvtb health", description="Probe a gRPC server's health.")
    parser.add_argument("address", help="host:port of a kvtb service")
    parser.add_argument("--service", default="", help="service name (default: the server)")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait")
    parser.add_argument("--wait", action="store_true", help="poll until SERVING or timeout")
    args = parser.parse_args(argv)
    if args.wait:
        ok = wait_serving(args.address, args.timeout, args.service)
    else:
        ok = check(args.address, args.service, args.timeout) == SERVING
    print(f"{args.address}: {'SERVING' if ok else 'NOT SERVING or unreachable'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
