"""Session ids: which a request names, and which the frontend accepts. Pure.

A session id is a context id of its user: the frontend mints one (`ctx-` and 20 hex digits) or the
client chooses it (AIPerf's X-Correlation-ID, a LangChain session, OpenAI's `user` field), and the
first turn naming an unknown id starts that user's context. The agent's descriptors carry context
ids of up to 240 bytes, so an id is 1 to 240 characters of ASCII letters, digits and `._:@+=-`,
starting with a letter or digit (no spaces, no path separators, nothing to escape in a log line).
"""
from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping

from chat_frontend.errors import ChatError

SESSION_HEADER = "X-Session-Id"
MAX_SESSION_ID_BYTES = 240
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]*")


def new_context_id() -> str:
    """A context id minted by the frontend."""
    return "ctx-" + uuid.uuid4().hex[:20]


def check_session_id(value: str, where: str) -> str:
    """The id, or INVALID_ARGUMENT (param `where`) when it is too long or has other characters."""
    if len(value.encode("utf-8", "surrogatepass")) > MAX_SESSION_ID_BYTES:
        raise ChatError("INVALID_ARGUMENT", f"{where} is {len(value)} characters, over the limit of "
                        f"{MAX_SESSION_ID_BYTES}", where)
    if not _SESSION_ID.fullmatch(value):
        raise ChatError("INVALID_ARGUMENT", f"{where} must be ASCII letters, digits and ._:@+=- (starting "
                        "with a letter or digit)", where)
    return value


def named_session(headers: Mapping[str, str], header_names: Iterable[str], user_field: str | None) -> str:
    """The session id a request names (checked), or "" for a new context.

    The first of X-Session-Id and `header_names` that the request carries names it; else
    `user_field` (OpenAI's `user`, when the settings make it the session; None otherwise).
    """
    for name in (SESSION_HEADER, *header_names):
        value = headers.get(name, "").strip()
        if value:
            return check_session_id(value, name)
    if user_field:
        return check_session_id(user_field, "user")
    return ""
