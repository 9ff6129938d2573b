"""Map the agent's exceptions to gRPC status codes, in one place for every servicer."""
from __future__ import annotations

import functools
import logging

import grpc

from smartnic.match_action import TableError
from hostmem.region import RegionError
from smartnic.registrations import AccessDenied, UnknownRegion
from smartnic.triggered import QueueFull

logger = logging.getLogger(__name__)

CODES = (
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (AccessDenied, grpc.StatusCode.PERMISSION_DENIED),
    (PermissionError, grpc.StatusCode.PERMISSION_DENIED),  # requester.NotOwner
    (UnknownRegion, grpc.StatusCode.NOT_FOUND),
    (TableError, grpc.StatusCode.INVALID_ARGUMENT),
    (RegionError, grpc.StatusCode.INVALID_ARGUMENT),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
)


def code_for(exc: BaseException) -> grpc.StatusCode | None:
    for cls, code in CODES:
        if isinstance(exc, cls):
            return code
    return None


def rpc(method):
    """Decorate a unary servicer method: known exceptions become their status, with the message."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Exception as exc:  # translated below, or INTERNAL with the message
            code = code_for(exc)
            if code is None:
                logger.exception("%s failed", method.__name__)
                context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
            context.abort(code, str(exc))
    return wrapper
