"""Errors a turn can end with, named by the gRPC status code they map to."""
from __future__ import annotations

CODES = ("INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND",
         "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "UNAVAILABLE", "DEADLINE_EXCEEDED",
         "INTERNAL", "CANCELLED", "ABORTED")


class ChatError(Exception):
    """A refusal or failure to report to the user: a status code name, a message, and the
    request field it is about (OpenAI's `param`), if any."""

    def __init__(self, code: str, message: str, param: str | None = None):
        assert code in CODES, code
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.param = param
