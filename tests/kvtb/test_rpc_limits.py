"""The bounds every gRPC server sets (kvtb.rpc.server_options), on a real mutual-TLS server."""
from __future__ import annotations

import socket
import time
from concurrent import futures

import grpc
import pytest

from kvtb import credentials
from kvtb.rpc import Security, add_port, channel, server_options

ECHO = "/test.Echo/Say"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    return credentials.init(tmp_path_factory.mktemp("creds"))


@pytest.fixture(scope="module")
def server(deployment):
    security = Security.of("storage", str(deployment))
    srv = grpc.server(futures.ThreadPoolExecutor(2),
                      options=server_options(max_message_bytes=1 << 20, handshake_timeout_ms=1000))
    srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req[:16])})])
    port = add_port(srv, "127.0.0.1:0", security)
    srv.start()
    yield port
    srv.stop(0)


def test_a_message_past_the_cap_is_refused_and_the_server_goes_on(server, deployment):
    with channel(f"127.0.0.1:{server}", Security.of("frontend", str(deployment)), peer="storage",
                 options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
        say = ch.unary_unary(ECHO)
        with pytest.raises(grpc.RpcError) as err:
            say(b"x" * (2 << 20), timeout=10)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert say(b"small", timeout=10) == b"small"


def test_a_connection_that_never_finishes_its_handshake_is_closed(server):
    """Unauthenticated work is bounded in time: silent TCP connections are dropped after the timeout."""
    socks = [socket.create_connection(("127.0.0.1", server), timeout=10) for _ in range(20)]
    try:
        start = time.monotonic()
        for s in socks:
            s.settimeout(max(0.1, 10 - (time.monotonic() - start)))
            assert s.recv(1) == b"", "the server answered a peer that sent nothing"
        assert time.monotonic() - start < 10
    finally:
        for s in socks:
            s.close()
