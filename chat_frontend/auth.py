"""Bearer-token authentication: which configured user a request speaks for."""
from __future__ import annotations

import hmac
from typing import Iterable, Mapping

from chat_frontend.errors import ChatError

MAX_TOKEN_CHARS = 4096


def token_from(request_token: str, metadata: Iterable[tuple[str, str]] = ()) -> str:
    """The request's token field, else the `authorization: Bearer TOKEN` metadata; '' if none."""
    if request_token:
        return request_token.strip()
    for key, value in metadata:
        if key.lower() == "authorization" and isinstance(value, str):
            scheme, _, rest = value.strip().partition(" ")
            if scheme.lower() == "bearer":
                return rest.strip()
    return ""


class Authenticator:
    """Maps tokens to user names; compares every token in constant time. Immutable."""

    def __init__(self, users: Mapping[str, str]):
        self._users = tuple((name, token.encode()) for name, token in users.items())

    def user_for(self, token: str) -> str:
        """The user whose token this is, or UNAUTHENTICATED."""
        if not token:
            raise ChatError("UNAUTHENTICATED", "no token: give one in the request or as "
                            "'authorization: Bearer TOKEN' metadata")
        if len(token) > MAX_TOKEN_CHARS:
            raise ChatError("INVALID_ARGUMENT", f"the token is {len(token)} characters, over the limit "
                            f"of {MAX_TOKEN_CHARS}")
        found = ""
        for name, known in self._users:
            # surrogateescape: an HTTP header's bytes that are not UTF-8 (they match no token)
            if hmac.compare_digest(known, token.encode("utf-8", "surrogateescape")):
                found = name
        if not found:
            raise ChatError("UNAUTHENTICATED", "unknown token")
        return found
