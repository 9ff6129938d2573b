"""Each fabric session's authentication on the target: its handshake, then its sealed channel (pure).

A session (a ZeroMQ routing id) that connected to a target with `fabric_security` auth or curve
has a handshake until it completes, then a channel: every capsule it sends must be sealed
(`fabric.auth.Channel`) and every reply to it is sealed. Half-open sessions (handshakes begun,
not finished) are bounded (`storage_node.pre_auth.PreAuthLimits`): per peer address (past the
cap, that address's oldest goes, so a flood from one address cannot push out another's), in all
(past the cap, the oldest of the address holding the most goes), and in time (older than the
handshake timeout, forgotten). Before authenticating, a session's messages are rate-limited per
peer address (`admit`). Not thread-safe: the fabric thread owns it.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from fabric.auth import AuthError, Channel, FabricSecurity, TargetHandshake
from storage_node.pre_auth import PeerBuckets, PreAuthLimits

logger = logging.getLogger(__name__)


@dataclass
class HalfOpen:
    """A handshake in progress: who began it, from where, and when."""

    handshake: TargetHandshake
    peer: str
    started: float


class Sessions:
    """session -> HalfOpen (authenticating) or Channel (authenticated)."""

    def __init__(self, security: FabricSecurity, limits: PreAuthLimits | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.security = security
        self.limits = limits or PreAuthLimits()
        self.clock = clock
        self._pending: OrderedDict[bytes, HalfOpen] = OrderedDict()   # oldest first
        self._by_peer: dict[str, OrderedDict[bytes, None]] = {}       # peer -> its half-open, oldest first
        self._channels: dict[bytes, Channel] = {}
        self._buckets = PeerBuckets.for_handshakes(self.limits.handshakes_per_s_per_peer, self.limits.max_peers)
        self.evicted = 0   # half-open sessions dropped for a cap
        self.expired = 0   # half-open sessions dropped for the timeout
        self.limited = 0   # pre-authentication messages dropped for the rate limit

    @property
    def required(self) -> bool:
        return self.security.authenticates

    @property
    def half_open(self) -> int:
        return len(self._pending)

    def half_open_of(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    @property
    def peers_tracked(self) -> int:
        return len(self._buckets)

    def sealed(self, session: bytes) -> bool:
        """True once the session authenticated: its capsules must come sealed."""
        return session in self._channels

    def admit(self, peer: str) -> bool:
        """Whether a message of a session not authenticated yet, from peer, may be handled (a token
        of peer's bucket spent), or must be dropped unanswered (over the rate)."""
        if self._buckets.take(peer, self.clock()):
            return True
        self.limited += 1
        if self.limited & (self.limited - 1) == 0:  # 1st, 2nd, 4th, ...: the log stays short in a flood
            logger.warning("dropped %d messages before authentication over the rate limit (last from %s)",
                           self.limited, peer or "a local peer")
        return False

    def open(self, session: bytes, header) -> bytes:
        """The capsule bytes of a received header frame (its seal checked for an authenticated session)."""
        channel = self._channels.get(session)
        return bytes(header) if channel is None else channel.open(header)

    def seal(self, session: bytes, capsule: bytes) -> bytes:
        """A reply's header frame: sealed for an authenticated session."""
        channel = self._channels.get(session)
        return capsule if channel is None else channel.seal(capsule)

    def begin(self, session: bytes, host_nqn: str, subsystem_nqn: str, peer: str = "") -> None:
        """Start the handshake of a session that connected as host_nqn (an allowed host) from peer."""
        self.drop(session)
        now = self.clock()
        self.expire(now)
        mine = self._by_peer.setdefault(peer, OrderedDict())
        while len(mine) >= self.limits.max_half_open_per_peer:
            self._evict(next(iter(mine)))
        while len(self._pending) >= self.limits.max_half_open:
            crowded = max(self._by_peer.values(), key=len)
            self._evict(next(iter(crowded)))
        mine = self._by_peer.setdefault(peer, OrderedDict())  # an eviction may have emptied it
        handshake = TargetHandshake(self.security.host_key(host_nqn), host_nqn, subsystem_nqn)
        self._pending[session] = HalfOpen(handshake, peer, now)
        mine[session] = None

    def expire(self, now: float | None = None) -> int:
        """Forget half-open sessions older than the handshake timeout; how many went."""
        now = self.clock() if now is None else now
        gone = 0
        while self._pending:
            session, half = next(iter(self._pending.items()))
            if now - half.started < self.limits.handshake_timeout_s:
                break
            self._forget(session)
            gone += 1
        self.expired += gone
        return gone

    def handshake(self, session: bytes) -> TargetHandshake:
        """The session's handshake in progress; AuthError when there is none."""
        half = self._pending.get(session)
        if half is None:
            raise AuthError("no authentication in progress (send a Fabrics Connect first)")
        return half.handshake

    def establish(self, session: bytes) -> TargetHandshake:
        """Turn a completed handshake into the session's channel (after its reply went out plain)."""
        handshake = self.handshake(session)
        self._forget(session)
        self._channels[session] = handshake.channel()
        return handshake

    def drop(self, session: bytes) -> None:
        self._forget(session)
        self._channels.pop(session, None)

    def _evict(self, session: bytes) -> None:
        half = self._forget(session)
        self.evicted += 1
        if half is not None:
            logger.debug("dropped the unfinished handshake of %s from %s", half.handshake.host_nqn, half.peer)

    def _forget(self, session: bytes) -> HalfOpen | None:
        half = self._pending.pop(session, None)
        if half is not None:
            mine = self._by_peer.get(half.peer)
            if mine is not None:
                mine.pop(session, None)
                if not mine:
                    del self._by_peer[half.peer]
        return half
