"""A host's proof, in its first message, that it holds its fabric secret (pure; WireGuard's mac1).

Before authenticating, a storage node rations its work per peer address (`storage_node.pre_auth`), and
hosts behind one address (one machine, one NAT) share that ration with whoever floods from it. So a
host's Fabrics Connect carries, in its `auth_message`, a proof the node checks in microseconds before it
allocates anything or spends the address's budget; one that checks out skips that budget (the full
DH-HMAC-CHAP handshake still follows, `fabric.auth`).

Wire (PROOF_BYTES = 42):

    version u8 (1) | bound u8 | time ms u64 LE (wall clock) | nonce [16] | tag [16]

    Kp  = HMAC-SHA-256(Kh, "kvtb fabric first-message proof key")        Kh: the host's DH-HMAC-CHAP secret
    tag = HMAC-SHA-256(Kp, "kvtb fabric first-message proof\\0" | version | bound | time | nonce
                           | host NQN | 0 | subsystem NQN)[:16]

`bound` 1: the subsystem NQN is the target's (a host that completed a handshake with it knows it), and
only that target takes the proof; 0: the subsystem NQN is empty, any target of the deployment takes it
(a host's very first Connect to a node). A proof is taken once (`ReplayCache`) and within WINDOW_S of
the node's clock. Only a holder of Kh makes one; a node holds the master Kh derives from.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

VERSION = 1
NONCE_BYTES = 16
TAG_BYTES = 16
_HEAD = struct.Struct("<BBQ")        # version, bound, time in ms
PROOF_BYTES = _HEAD.size + NONCE_BYTES + TAG_BYTES
WINDOW_S = 30.0                      # a proof's time may be this far from the node's, either way
REPLAY_ENTRIES = 4096                # nonces a node remembers (oldest go first)
MAX_NQN_BYTES = 223                  # NVMe's NQN limit
_KEY_LABEL = b"kvtb fabric first-message proof key"
_TAG_LABEL = b"kvtb fabric first-message proof\0"

# Outcomes of a check (Verifier.check); only OK grants anything.
OK, MALFORMED, STALE, UNKNOWN_HOST, FORGED, REPLAYED = (
    "ok", "malformed", "stale", "unknown host", "forged", "replayed")


def proof_key(host_key: bytes) -> bytes:
    """The key proofs are made with, derived from the host's secret (never the secret itself)."""
    return hmac.new(host_key, _KEY_LABEL, hashlib.sha256).digest()


def _tag(key: bytes, head: bytes, nonce: bytes, host_nqn: str, subsystem_nqn: str) -> bytes:
    data = _TAG_LABEL + head + nonce + host_nqn.encode() + b"\0" + subsystem_nqn.encode()
    return hmac.new(key, data, hashlib.sha256).digest()[:TAG_BYTES]


def make(host_key: bytes, host_nqn: str, subsystem_nqn: str = "", now: float | None = None,
         nonce: bytes | None = None) -> bytes:
    """The proof a host puts in its Connect: bound to subsystem_nqn (the target's) when given, else to none."""
    if not host_key:
        raise ValueError("a first-message proof needs the host's secret")
    nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce of {len(nonce)} bytes, expected {NONCE_BYTES}")
    millis = int((time.time() if now is None else now) * 1000)
    head = _HEAD.pack(VERSION, 1 if subsystem_nqn else 0, millis)
    return head + nonce + _tag(proof_key(host_key), head, nonce, host_nqn, subsystem_nqn)


@dataclass(frozen=True)
class Proof:
    """A parsed proof (not checked yet)."""

    bound: bool
    at: float       # seconds, wall clock
    nonce: bytes
    tag: bytes
    head: bytes


def parse(data: bytes) -> Proof | None:
    """The fields of a proof, or None when it is not one (wrong size or version)."""
    data = bytes(data)
    if len(data) != PROOF_BYTES:
        return None
    version, bound, millis = _HEAD.unpack_from(data)
    if version != VERSION or bound > 1:
        return None
    rest = data[_HEAD.size:]
    return Proof(bool(bound), millis / 1000.0, rest[:NONCE_BYTES], rest[NONCE_BYTES:], data[:_HEAD.size])


class ReplayCache:
    """The nonces of proofs taken, at most `capacity` (the oldest taken goes first), within a time window.

    Sound though bounded: a proof whose nonce was pushed out can no longer be taken, as every proof at or
    before the newest time pushed out (`floor`) is refused. Entries older than the window go, as such a
    proof is stale anyway. Not thread-safe.
    """

    def __init__(self, capacity: int = REPLAY_ENTRIES, window_s: float = WINDOW_S):
        if capacity < 1 or window_s <= 0:
            raise ValueError(f"capacity {capacity} and window_s {window_s} must be positive")
        self.capacity, self.window_s = capacity, window_s
        self._seen: OrderedDict[bytes, float] = OrderedDict()  # nonce -> its proof's time, oldest taken first
        self.floor = float("-inf")

    def take(self, nonce: bytes, at: float, now: float) -> bool:
        """True the first time a nonce (of a proof made at `at`) comes, False for a replay."""
        while self._seen:
            first, first_at = next(iter(self._seen.items()))
            if first_at >= now - self.window_s:
                break
            del self._seen[first]
        if at <= self.floor or nonce in self._seen:
            return False
        self._seen[nonce] = at
        while len(self._seen) > self.capacity:
            _, gone_at = self._seen.popitem(last=False)
            self.floor = max(self.floor, gone_at)
        return True

    def __len__(self) -> int:
        return len(self._seen)


class Verifier:
    """A node's check of first-message proofs: in the window, of a known host, genuine, bound to this
    subsystem or to none, and never seen before. Not thread-safe (the fabric thread owns it).

    host_key(nqn): that host's secret, or None for a host the node does not serve.
    """

    def __init__(self, subsystem_nqn: str, host_key: Callable[[str], bytes | None],
                 window_s: float = WINDOW_S, replay_entries: int = REPLAY_ENTRIES,
                 clock: Callable[[], float] = time.time):
        if window_s <= 0:
            raise ValueError(f"window_s {window_s} must be positive")
        self.subsystem_nqn, self.host_key = subsystem_nqn, host_key
        self.window_s, self.clock = window_s, clock
        self.replays = ReplayCache(replay_entries, window_s)

    def check(self, data: bytes, host_nqn: str) -> str:
        """OK when the proof holds (its nonce is then spent), else why not (MALFORMED, STALE, ...)."""
        proof = parse(data)
        if proof is None:
            return MALFORMED
        now = self.clock()
        if abs(proof.at - now) > self.window_s:
            return STALE
        if not host_nqn or len(host_nqn.encode()) > MAX_NQN_BYTES:
            return UNKNOWN_HOST
        key = self.host_key(host_nqn)
        if not key:
            return UNKNOWN_HOST
        subsystem = self.subsystem_nqn if proof.bound else ""
        want = _tag(proof_key(key), proof.head, proof.nonce, host_nqn, subsystem)
        if not hmac.compare_digest(proof.tag, want):
            return FORGED
        if not self.replays.take(proof.nonce, proof.at, now):
            return REPLAYED
        return OK


class LearnedSubsystems:
    """A host's memory of the subsystem NQN behind each fabric address it authenticated with (so its next
    proof there is bound to it); at most `capacity` addresses, the least recent go first. Thread-safe."""

    def __init__(self, capacity: int = 1024):
        if capacity < 1:
            raise ValueError(f"capacity {capacity} must be positive")
        self.capacity = capacity
        self._nqns: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, address: str) -> str:
        with self._lock:
            return self._nqns.get(address, "")

    def remember(self, address: str, subsystem_nqn: str) -> None:
        if not subsystem_nqn:
            return
        with self._lock:
            self._nqns.pop(address, None)
            self._nqns[address] = subsystem_nqn
            while len(self._nqns) > self.capacity:
                self._nqns.popitem(last=False)

    def __len__(self) -> int:
        return len(self._nqns)
