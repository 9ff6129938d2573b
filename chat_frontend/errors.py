"""Errors a turn can end with, named by the gRPC status code they map to."""
from __future__ import annotations

CODES = ("INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND",
         "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "UNAVAILABLE", "DEADLINE_EXCEEDED",
         "INTERNAL", "CANCELLED", "ABORTED")


class ChatError(Exception):
    """A refusal or failure to report to the user: a status code name, a message, the request
    field it is about (OpenAI's `param`), if any, for a refusal of a busy frontend when to try
    again (`retry_after_s`: HTTP's Retry-After), and OpenAI's own error code where it has one
    (`openai_code`, e.g. context_length_exceeded; None: the status code's name)."""

    def __init__(self, code: str, message: str, param: str | None = None,
                 retry_after_s: float | None = None, openai_code: str | None = None):
        if code not in CODES:
            raise ValueError(f"unknown status code {code!r}; one of {', '.join(CODES)}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s
        self.openai_code = openai_code
