"""Logging of every service: one format, JSON when asked, the turn's request id on each line.

The frontend makes a request id per turn; TurnRequest.request_id carries it to the agent and
the compute node, which set it with `request_context` while they handle the turn, so that
`grep REQUEST_ID` (or a JSON query on `request_id`) follows one turn through the system.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
import time
from typing import Iterator

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("kvtb_request_id", default="")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"
EXTRA_FIELDS = ("user_id", "context_id", "opcode", "status", "duration_ms", "bytes", "kv_source", "replica", "event")


@contextlib.contextmanager
def request_context(rid: str) -> Iterator[None]:
    """Tag every log line of this thread or task with `rid` until the block ends."""
    token = request_id.set(rid)
    try:
        yield
    finally:
        try:
            request_id.reset(token)
        except ValueError:  # a generator closed from another context
            request_id.set("")


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (an explicit extra wins over the context) and `request_tag` to records."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = getattr(record, "request_id", "") or request_id.get()
        record.request_id = rid
        record.request_tag = f" [{rid}]" if rid else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and known extras."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                + f".{int(record.msecs):03d}Z", "level": record.levelname, "service": self.service,
                "logger": record.name, "message": record.getMessage()}
        if getattr(record, "request_id", ""):
            line["request_id"] = record.request_id
        for field in EXTRA_FIELDS:
            if hasattr(record, field):
                line[field] = getattr(record, field)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def json_wanted(flag: bool = False) -> bool:
    """--log-json, or KVTB_LOG_JSON=1."""
    return flag or os.environ.get("KVTB_LOG_JSON", "").strip().lower() in ("1", "true", "yes", "on")


def setup_logging(service: str, json_lines: bool = False, level: str | int = logging.INFO) -> None:
    """Configure the root logger on stderr (call once, from a service's main)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter(service) if json_wanted(json_lines)
                         else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
