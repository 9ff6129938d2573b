"""Each fabric session's authentication on the target: its handshake, then its sealed channel (pure).

A session (a ZeroMQ routing id) that connected to a target with `fabric_security` auth or curve
has a handshake until it completes, then a channel: every capsule it sends must be sealed
(`fabric.auth.Channel`) and every reply to it is sealed. Pending handshakes are bounded (the
oldest goes first), so sessions that connect and never authenticate cannot grow the table.
Not thread-safe: the fabric thread owns it.
"""
from __future__ import annotations

import logging
from collections import OrderedDict

from fabric.auth import AuthError, Channel, FabricSecurity, TargetHandshake

logger = logging.getLogger(__name__)

MAX_PENDING = 1024  # handshakes not completed yet


class Sessions:
    """session -> TargetHandshake (authenticating) or Channel (authenticated)."""

    def __init__(self, security: FabricSecurity):
        self.security = security
        self._pending: OrderedDict[bytes, TargetHandshake] = OrderedDict()
        self._channels: dict[bytes, Channel] = {}

    @property
    def required(self) -> bool:
        return self.security.authenticates

    def sealed(self, session: bytes) -> bool:
        """True once the session authenticated: its capsules must come sealed."""
        return session in self._channels

    def open(self, session: bytes, header) -> bytes:
        """The capsule bytes of a received header frame (its seal checked for an authenticated session)."""
        channel = self._channels.get(session)
        return bytes(header) if channel is None else channel.open(header)

    def seal(self, session: bytes, capsule: bytes) -> bytes:
        """A reply's header frame: sealed for an authenticated session."""
        channel = self._channels.get(session)
        return capsule if channel is None else channel.seal(capsule)

    def begin(self, session: bytes, host_nqn: str, subsystem_nqn: str) -> None:
        """Start the handshake of a session that connected as host_nqn (an allowed host)."""
        self.drop(session)
        self._pending[session] = TargetHandshake(self.security.host_key(host_nqn), host_nqn, subsystem_nqn)
        while len(self._pending) > MAX_PENDING:
            _, handshake = self._pending.popitem(last=False)
            logger.info("dropped the unfinished handshake of %s", handshake.host_nqn)

    def handshake(self, session: bytes) -> TargetHandshake:
        """The session's handshake in progress; AuthError when there is none."""
        handshake = self._pending.get(session)
        if handshake is None:
            raise AuthError("no authentication in progress (send a Fabrics Connect first)")
        return handshake

    def establish(self, session: bytes) -> TargetHandshake:
        """Turn a completed handshake into the session's channel (after its reply went out plain)."""
        handshake = self._pending.pop(session)
        self._channels[session] = handshake.channel()
        return handshake

    def drop(self, session: bytes) -> None:
        self._pending.pop(session, None)
        self._channels.pop(session, None)
