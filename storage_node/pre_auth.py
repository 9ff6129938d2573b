"""Bounds on the work a storage node does before a fabric session authenticates (pure).

A peer that has not authenticated can make the node parse its messages, answer them and hold a
half-open handshake. `PreAuthLimits` bounds each: a message's size, the messages a peer address
may send a second (a token bucket per address, `PeerBuckets`), the half-open handshakes in all
and per address (`storage_node.sessions`), and how long one may stay half-open. Peer addresses
are the TCP source addresses ZeroMQ reports; every table keyed by them is bounded.

Known hosts come first: a Connect that carries a valid first-message proof (`fabric.first_proof`: an
HMAC under a key of the host's secret, in its time window, never seen before) skips its address's
bucket, and so does the rest of that session's handshake; its half-open handshake counts against its
host's own small allowance (`max_half_open_per_host`) instead of its address's, and its Connects
against a bucket of its host NQN (`PeerBuckets`, the same rate). A message whose proof fails, or that
carries none, is rationed by its address as before.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

HANDSHAKE_MESSAGES = 6   # Connect, AUTH_SEND NEGOTIATE, AUTH_RECV, AUTH_SEND REPLY, AUTH_RECV, AUTH_SEND SUCCESS2
BURST_S = 2.0            # a bucket holds this many seconds' worth of messages
MAX_PRE_AUTH_BYTES = 4096   # a Connect or handshake capsule is a few hundred bytes
MAX_PEERS = 4096         # peer addresses whose buckets are kept (least recently seen go first)
MAX_HALF_OPEN_PER_HOST = 4   # half-open handshakes of one proven host NQN (past it, its oldest goes)


@dataclass(frozen=True)
class PreAuthLimits:
    """The caps (defaults as StorageSettings'): see storage_node.settings for each one's meaning."""

    max_half_open: int = 256
    max_half_open_per_peer: int = 16
    handshakes_per_s_per_peer: float = 50.0
    handshake_timeout_s: float = 10.0
    max_pre_auth_bytes: int = MAX_PRE_AUTH_BYTES
    max_peers: int = MAX_PEERS
    max_half_open_per_host: int = MAX_HALF_OPEN_PER_HOST

    def __post_init__(self) -> None:
        if not 1 <= self.max_half_open_per_peer <= self.max_half_open:
            raise ValueError("max_half_open_per_peer must be in 1..max_half_open")
        if not 1 <= self.max_half_open_per_host <= self.max_half_open:
            raise ValueError("max_half_open_per_host must be in 1..max_half_open")
        if self.handshakes_per_s_per_peer <= 0 or self.handshake_timeout_s <= 0 or self.max_peers < 1:
            raise ValueError("handshakes_per_s_per_peer, handshake_timeout_s and max_peers must be positive")

    @classmethod
    def of(cls, settings) -> PreAuthLimits:
        """The limits a StorageSettings names."""
        return cls(settings.max_half_open, settings.max_half_open_per_peer, settings.handshakes_per_s_per_peer,
                   settings.handshake_timeout_s)


class PeerBuckets:
    """A token bucket per peer address: `rate` messages a second, `burst` at once.

    At most `max_peers` addresses are kept; the one seen longest ago goes first (it comes back
    with a full bucket, as a peer idle for `burst / rate` seconds would). Not thread-safe.
    """

    def __init__(self, rate: float, burst: float, max_peers: int = MAX_PEERS):
        if rate <= 0 or burst < 1 or max_peers < 1:
            raise ValueError(f"rate {rate} and max_peers {max_peers} must be positive, burst {burst} at least 1")
        self.rate, self.burst, self.max_peers = rate, burst, max_peers
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # peer -> (tokens, at)

    @classmethod
    def for_handshakes(cls, handshakes_per_s: float, max_peers: int = MAX_PEERS) -> PeerBuckets:
        rate = handshakes_per_s * HANDSHAKE_MESSAGES
        return cls(rate, rate * BURST_S, max_peers)

    def take(self, peer: str, now: float) -> bool:
        """True when peer may send one more message now (a token is spent), False when it is over."""
        tokens, at = self._buckets.pop(peer, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate)
        allowed = tokens >= 1
        self._buckets[peer] = (tokens - 1 if allowed else tokens, now)
        while len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)
        return allowed

    def __len__(self) -> int:
        return len(self._buckets)
