"""Each fabric session's authentication on the target: its handshake, then its sealed channel (pure).

A session (a ZeroMQ routing id) that connected to a target with `fabric_security` auth or curve
has a handshake until it completes, then a channel: every capsule it sends must be sealed
(`fabric.auth.Channel`) and every reply to it is sealed. Half-open sessions (handshakes begun,
not finished) are bounded (`storage_node.pre_auth.PreAuthLimits`): per peer address (past the
cap, that address's oldest goes, so a flood from one address cannot push out another's), in all
(past the cap, the oldest of the address holding the most goes), and in time (older than the
handshake timeout, forgotten). Before authenticating, a session's messages are rate-limited per
peer address (`admit`). A session whose Connect carried a valid first-message proof (`prove`,
`fabric.first_proof`) is a known host's: its handshake skips the address's rate, and its half-open
handshake counts against its host NQN's own allowance (`max_half_open_per_host`), not its address's
(in all, it counts as any other). Not thread-safe: the fabric thread owns it.
"""
from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

from fabric import first_proof
from fabric.auth import AuthError, Channel, FabricSecurity, TargetHandshake
from storage_node.pre_auth import PeerBuckets, PreAuthLimits

logger = logging.getLogger(__name__)

OVER_HOST_RATE = "over the host's rate"  # a valid proof past its host NQN's rate of Connects


@dataclass
class HalfOpen:
    """A handshake in progress: who began it, from where, and when."""

    handshake: TargetHandshake
    peer: str
    started: float
    proven: bool = False   # its Connect carried a valid first-message proof


class Sessions:
    """session -> HalfOpen (authenticating) or Channel (authenticated)."""

    def __init__(self, security: FabricSecurity, limits: PreAuthLimits | None = None,
                 clock: Callable[[], float] = time.monotonic, subsystem_nqn: str = "",
                 allowed: Callable[[str], bool] = lambda host_nqn: True,
                 wall_clock: Callable[[], float] = time.time):
        """allowed(host_nqn): whether the node serves that host (a proof of any other is refused unchecked);
        wall_clock: the time first-message proofs are checked against (the hosts' clock)."""
        self.security = security
        self.limits = limits or PreAuthLimits()
        self.clock = clock
        self._pending: OrderedDict[bytes, HalfOpen] = OrderedDict()   # oldest first
        self._by_peer: dict[str, OrderedDict[bytes, None]] = {}       # peer -> its half-open, oldest first
        self._by_host: dict[str, OrderedDict[bytes, None]] = {}       # proven host NQN -> its half-open
        self._channels: dict[bytes, Channel] = {}
        self._buckets = PeerBuckets.for_handshakes(self.limits.handshakes_per_s_per_peer, self.limits.max_peers)
        # a proven host's Connects, per host NQN (a leaked secret still cannot flood)
        self._host_buckets = PeerBuckets(self.limits.handshakes_per_s_per_peer,
                                         self.limits.handshakes_per_s_per_peer * 2, self.limits.max_peers)
        self._allowed = allowed
        self._proofs = first_proof.Verifier(subsystem_nqn, self._proof_key, clock=wall_clock) \
            if security.authenticates else None
        self.evicted = 0   # half-open sessions dropped for a cap
        self.expired = 0   # half-open sessions dropped for the timeout
        self.limited = 0   # pre-authentication messages dropped for the rate limit
        self.proofs: Counter[str] = Counter()  # first-message proofs checked, by outcome (first_proof.OK...)

    @property
    def required(self) -> bool:
        return self.security.authenticates

    @property
    def half_open(self) -> int:
        return len(self._pending)

    def half_open_of(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    def half_open_of_host(self, host_nqn: str) -> int:
        """The proven half-open handshakes of host_nqn."""
        return len(self._by_host.get(host_nqn, ()))

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

    def prove(self, host_nqn: str, proof: bytes) -> str:
        """Whether a Connect as host_nqn carrying `proof` is a known host's: first_proof.OK when it is (it
        may skip its address's budget; its nonce is spent), else why not (first_proof's outcomes, or
        OVER_HOST_RATE past the host NQN's own rate of Connects). Checked in microseconds; nothing is kept
        unless it holds."""
        if self._proofs is None:
            return first_proof.MALFORMED
        outcome = self._proofs.check(proof, host_nqn)
        if outcome == first_proof.OK and not self._host_buckets.take(host_nqn, self.clock()):
            outcome = OVER_HOST_RATE
        self.proofs[outcome] += 1
        return outcome

    def proven(self, session: bytes) -> bool:
        """True for a half-open session whose Connect carried a valid proof."""
        half = self._pending.get(session)
        return half is not None and half.proven

    def _proof_key(self, host_nqn: str) -> bytes | None:
        return self.security.host_key(host_nqn) if self._allowed(host_nqn) else None

    def open(self, session: bytes, header) -> bytes:
        """The capsule bytes of a received header frame (its seal checked for an authenticated session)."""
        channel = self._channels.get(session)
        return bytes(header) if channel is None else channel.open(header)

    def seal(self, session: bytes, capsule: bytes) -> bytes:
        """A reply's header frame: sealed for an authenticated session."""
        channel = self._channels.get(session)
        return capsule if channel is None else channel.seal(capsule)

    def begin(self, session: bytes, host_nqn: str, subsystem_nqn: str, peer: str = "",
              proven: bool = False) -> None:
        """Start the handshake of a session that connected as host_nqn (an allowed host) from peer;
        proven: its Connect's proof held (`prove`), so it counts against its host's allowance."""
        self.drop(session)
        now = self.clock()
        self.expire(now)
        table, key, cap = (self._by_host, host_nqn, self.limits.max_half_open_per_host) if proven else \
            (self._by_peer, peer, self.limits.max_half_open_per_peer)
        mine = table.setdefault(key, OrderedDict())
        while len(mine) >= cap:
            self._evict(next(iter(mine)))
        while len(self._pending) >= self.limits.max_half_open:
            crowded = max(chain(self._by_peer.values(), self._by_host.values()), key=len)
            self._evict(next(iter(crowded)))
        mine = table.setdefault(key, OrderedDict())  # an eviction may have emptied it
        handshake = TargetHandshake(self.security.host_key(host_nqn), host_nqn, subsystem_nqn)
        self._pending[session] = HalfOpen(handshake, peer, now, proven)
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
            table, key = (self._by_host, half.handshake.host_nqn) if half.proven else \
                (self._by_peer, half.peer)
            mine = table.get(key)
            if mine is not None:
                mine.pop(session, None)
                if not mine:
                    del table[key]
        return half
