"""gRPC between the services: mutual TLS with the deployment's certificates, and who may call what.

Every internal gRPC port (the agent, the compute node, a storage node's admin) is served with
`add_port`, which requires a client certificate signed by the deployment's CA, and guarded by an
`Authorizer`: a table from method to the identities (certificate common names) that may call it.
A peer without a certificate cannot connect; one with the wrong identity gets PERMISSION_DENIED
naming the method and who may call it. Health checks and reflection answer any authenticated peer.
Clients reach a service with `channel(address, peer=IDENTITY)`: the server's certificate must
carry that identity (its DNS name), whatever address it is reached at.

`Security.off()` (setting `insecure: true`) turns all of it off: for benchmarks that measure what
security costs, never the default.
"""
from __future__ import annotations

import collections
import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Mapping

import grpc
import grpc.aio
import grpc.experimental

from kvtb.credentials import COMMON_NAME, Credentials

logger = logging.getLogger(__name__)

OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "grpc.reflection.v1.ServerReflection")
OPERATOR = "operator"


@dataclasses.dataclass(frozen=True)
class Security:
    """How one process speaks gRPC: as which identity, with which credentials (None: insecure)."""

    credentials: Credentials | None

    @classmethod
    def of(cls, identity: str, credentials_dir: str = "", insecure: bool = False) -> "Security":
        """The settings' security: mutual TLS as `identity` unless insecure."""
        return cls(None if insecure else Credentials.load(identity, credentials_dir))

    @classmethod
    def off(cls) -> "Security":
        return cls(None)

    @property
    def identity(self) -> str:
        return self.credentials.identity if self.credentials else ""

    def server_credentials(self) -> grpc.ServerCredentials:
        ca, cert, key = self.credentials.tls()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self.credentials.tls()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def add_port(server, address: str, security: Security) -> int:
    """Bind address on server (sync or aio) with mutual TLS (or insecure when security is off)."""
    if security.credentials is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, security.server_credentials())


# Bounds every gRPC server of the deployment sets (server_options), before and after authentication.
MAX_MESSAGE_BYTES = 4 << 20  # a request or reply message (gRPC's default receive limit, made explicit)
MAX_CONCURRENT_STREAMS = 256  # calls in flight on one connection
HANDSHAKE_TIMEOUT_MS = 10_000  # a connection that has not finished its TLS handshake by then is closed
MAX_METADATA_BYTES = 16 << 10  # a call's headers


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES,
                   handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS,
                   max_send_bytes: int | None = None,
                   max_concurrent_streams: int = MAX_CONCURRENT_STREAMS) -> list[tuple[str, int]]:
    """A gRPC server's bounds: message size (received; sent: max_send_bytes, else the same), calls per
    connection (a server that takes that many turns of one peer at once raises it: the agent, the
    compute node), header bytes, and how long a peer may hold a connection open without completing
    the TLS handshake (unauthenticated work)."""
    return [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_send_bytes or max_message_bytes),
            ("grpc.max_concurrent_streams", max_concurrent_streams),
            ("grpc.max_metadata_size", MAX_METADATA_BYTES),
            ("grpc.server_handshake_timeout_ms", handshake_timeout_ms)]


def _options(peer: str, options: Iterable[tuple[str, object]]) -> list[tuple[str, object]]:
    return [("grpc.ssl_target_name_override", peer or COMMON_NAME), *options]


# A channel option for callers that read a server stream token by token from one thread: the
# reading thread polls the call itself instead of being woken by the channel's spin thread, one
# thread wake-up less per message (the agent relaying a turn, the chat client reading it).
READ_STREAMS_ON_CALLER = (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)


def channel(address: str, security: Security, peer: str = "", options: Iterable = ()) -> grpc.Channel:
    """A channel to the service of identity `peer` at address ("" peer: any service of the deployment)."""
    if security.credentials is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, security.channel_credentials(), options=_options(peer, options))


def aio_channel(address: str, security: Security, peer: str = "", options: Iterable = ()) -> grpc.aio.Channel:
    """channel() for asyncio."""
    if security.credentials is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, security.channel_credentials(), options=_options(peer, options))


def peer_identity(context) -> str:
    """The calling peer's identity (its certificate's common name); "" without one."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode() if names else ""


class Authorizer(grpc.ServerInterceptor):
    """Who may call what: `allowed[method]` is the identities that may call it (full method names,
    e.g. "/kvtb.smartnic.MatchAction/Write", or a whole service as "/kvtb.smartnic.MatchAction/*").
    The operator may call everything. A method in no entry is refused: new methods are closed
    until someone says who may call them. With security off, everyone may call everything.
    On a grpc.aio server, wrap it in `AioInterceptor`.
    """

    def __init__(self, allowed: Mapping[str, Iterable[str]], security: Security):
        self.allowed = {method: frozenset(ids) | {OPERATOR} for method, ids in allowed.items()}
        self.enabled = security.credentials is not None

    def identities_for(self, method: str) -> frozenset[str] | None:
        """Who may call method; None when it is open (health, reflection) or nobody is named."""
        service = method.rsplit("/", 1)[0]
        if service.strip("/") in OPEN_SERVICES:
            return None
        return self.allowed.get(method, self.allowed.get(f"{service}/*", frozenset({OPERATOR})))

    def intercept_service(self, continuation, handler_call_details):
        return self.wrap(continuation(handler_call_details), handler_call_details.method)

    def wrap(self, handler: grpc.RpcMethodHandler | None, method: str) -> grpc.RpcMethodHandler | None:
        """The method's handler, refusing a caller not allowed to call it."""
        if handler is None or not self.enabled:
            return handler
        allowed = self.identities_for(method)
        if allowed is None:
            return handler
        return _guarded(handler, method, allowed)


class CallCounter(grpc.ServerInterceptor):
    """Counts the calls a server answers by (method, caller's identity), the identity "" without
    one; snapshot() for a service's metrics. Thread-safe. On a grpc.aio server, wrap it in
    `AioInterceptor`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def intercept_service(self, continuation, handler_call_details):
        return self.wrap(continuation(handler_call_details), handler_call_details.method)

    def wrap(self, handler: grpc.RpcMethodHandler | None, method: str) -> grpc.RpcMethodHandler | None:
        """The method's handler, counting each call."""
        if handler is None:
            return None

        def count(context) -> None:
            key = (method, peer_identity(context))
            with self._lock:
                self._counts[key] += 1
        return _before(handler, count)

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


class AioInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor of this module (Authorizer, CallCounter) on a grpc.aio server: its handlers may
    be coroutines and async generators, or plain functions run in the server's migration thread pool."""

    def __init__(self, inner: Authorizer | CallCounter):
        self.inner = inner

    async def intercept_service(self, continuation, handler_call_details):
        return self.inner.wrap(await continuation(handler_call_details), handler_call_details.method)


# A check before a call's behaviour: None to go on, or the status and message to abort with.
Check = Callable[[object], "tuple[grpc.StatusCode, str] | None"]


def _guarded(handler: grpc.RpcMethodHandler, method: str, allowed: frozenset[str]) -> grpc.RpcMethodHandler:
    """The handler, checking the caller's identity before its behaviour runs."""

    def check(context) -> tuple[grpc.StatusCode, str] | None:
        who = peer_identity(context)
        if who in allowed:
            return None
        logger.warning("refused %s to %r", method, who or "a peer without a certificate")
        return (grpc.StatusCode.PERMISSION_DENIED,
                f"{method} may be called by {', '.join(sorted(allowed))}, not by {who or 'an unknown peer'}")
    return _before(handler, check)


def _wrap(behaviour, check: Check, streaming_response: bool):
    """behaviour (sync, a coroutine or an async generator), with check(context) before it runs."""
    if behaviour is None:
        return None
    if inspect.isasyncgenfunction(behaviour):
        async def agen(request, context):
            refused = check(context)
            if refused:
                await context.abort(*refused)
            async for reply in behaviour(request, context):
                yield reply
        return agen
    if inspect.iscoroutinefunction(behaviour):
        async def coro(request, context):
            refused = check(context)
            if refused:
                await context.abort(*refused)
            return await behaviour(request, context)
        return coro
    if streaming_response:
        def stream(request, context):
            refused = check(context)
            if refused:
                context.abort(*refused)
            yield from behaviour(request, context)
        return stream

    def unary(request, context):
        refused = check(context)
        if refused:
            context.abort(*refused)
        return behaviour(request, context)
    return unary


def _before(handler: grpc.RpcMethodHandler, check: Check) -> grpc.RpcMethodHandler:
    """The handler, calling check(context) before its behaviour runs (aborting with what it returns)."""
    kind = ("unary_unary" if handler.unary_unary else "unary_stream" if handler.unary_stream
            else "stream_unary" if handler.stream_unary else "stream_stream")
    make = getattr(grpc, f"{kind}_rpc_method_handler")
    return make(_wrap(getattr(handler, kind), check, kind.endswith("stream")),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
