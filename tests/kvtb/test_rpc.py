"""Mutual TLS and per-method identities on a real gRPC server (kvtb.rpc), with real certificates."""
from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from kvtb import credentials
from kvtb.rpc import Authorizer, Security, add_port, channel

ECHO = "/test.Echo/Say"
STREAM = "/test.Echo/Many"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    return credentials.init(tmp_path_factory.mktemp("creds"))


@pytest.fixture(scope="module")
def server(deployment):
    security = Security.of("storage", str(deployment))
    srv = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[Authorizer(
        {ECHO: {"frontend"}, STREAM: {"frontend"}}, security)])
    handlers = {"Say": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req),
                "Many": grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter([req, req])),
                "Closed": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}
    srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", handlers)])
    port = add_port(srv, "127.0.0.1:0", security)
    srv.start()
    yield f"127.0.0.1:{port}"
    srv.stop(0)


def call(address, security, method=ECHO, peer="storage", timeout=5.0):
    with channel(address, security, peer=peer) as ch:
        fn = ch.unary_stream if method == STREAM else ch.unary_unary
        result = fn(method)(b"hi", timeout=timeout)
        return list(result) if method == STREAM else result


def test_the_named_identity_and_the_operator_may_call(server, deployment):
    assert call(server, Security.of("frontend", str(deployment))) == b"hi"
    assert call(server, Security.of("frontend", str(deployment)), STREAM) == [b"hi", b"hi"]
    assert call(server, Security.of("operator", str(deployment))) == b"hi"


@pytest.mark.parametrize("method", [ECHO, STREAM, "/test.Echo/Closed"])
def test_another_identity_is_refused_by_name(server, deployment, method):
    with pytest.raises(grpc.RpcError) as err:
        call(server, Security.of("compute", str(deployment)), method)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not by compute" in err.value.details()


def test_no_certificate_or_another_deployments_cannot_connect(server, tmp_path):
    with pytest.raises(grpc.RpcError) as err:
        call(server, Security.off(), timeout=3)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    stranger = Security.of("operator", str(credentials.init(tmp_path / "other")))
    with pytest.raises(grpc.RpcError) as err:
        call(server, stranger, timeout=3)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_refuses_a_server_with_another_identity(server, deployment):
    with pytest.raises(grpc.RpcError) as err:
        call(server, Security.of("operator", str(deployment)), peer="smartnic", timeout=3)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_init_is_idempotent_and_private(deployment):
    before = {p.name: p.read_bytes() for p in deployment.iterdir()}
    credentials.init(deployment)
    assert {p.name: p.read_bytes() for p in deployment.iterdir()} == before
    assert all(p.stat().st_mode & 0o077 == 0 for p in deployment.iterdir())
    assert set(before) >= {"ca.crt", "fabric.key", "kv-mac.key"} | {f"{i}.crt" for i in credentials.IDENTITIES}


def test_missing_credentials_say_how_to_make_them(tmp_path):
    with pytest.raises(credentials.CredentialsError, match="kvtb credentials init"):
        Security.of("smartnic", str(tmp_path / "nothing"))
