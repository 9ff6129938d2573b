"""Fabric authentication (pure): the DH-HMAC-CHAP handshake at Connect and sealed capsules.

NVMe-oF's model (NVMe Base 2.0, 8.13.5): after Connect, host and controller authenticate each
other in-band with DH-HMAC-CHAP, carried by AUTH_SEND / AUTH_RECV; the subsystem serves only
the hosts on its allow list; encryption is a separate layer (here CURVE, `fabric_security:
curve`). The secret is the host's: `kvtb.credentials.host_key(master, nqn)`; the target holds the
master and derives it, a host holds only its own. No DH group is used (DH-HMAC-CHAP's NULL
group): in `auth` mode nothing is encrypted, so a DH exchange would protect no secret, and
CURVE brings its own.

Messages (type u8 | transaction id u16 LE | fields; hash: HMAC-SHA-256):

    NEGOTIATE  host -> target  hash ids offered (u8 count, u8 each)
    CHALLENGE  target -> host  hash id u8, S1 u32, C1 [32], subsystem NQN (u16 length, utf-8)
    REPLY      host -> target  R1 [32], S2 u32, C2 [32]
    SUCCESS1   target -> host  R2 [32]
    SUCCESS2   host -> target  (nothing)

    R1 = HMAC(Kh, C1 | S1 | T_ID | 0 | "HostHost" | NQNh | 0 | NQNc)     the host proves Kh
    R2 = HMAC(Kh, C2 | S2 | T_ID | 0 | "Controller" | NQNc | 0 | NQNh)   the target proves it too

Each side then derives one session key per direction from Kh, both challenges and both NQNs,
and seals every capsule it sends: the capsule's bytes, the direction's next sequence number
(u64 LE) and a 16-byte keyed BLAKE3 MAC over both. A capsule that is forged, altered, replayed,
reflected or out of order fails `Channel.open`. Payload frames are not sealed (too costly at
GB/s): a stored chunk carries its own MAC (`fabric.chunk_format`), checked end to end.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
import struct
from collections.abc import Callable

import blake3

from kvtb.credentials import Credentials, host_key, resolve_dir
from kvtb.settings import require

MODES = ("auth", "curve", "off")
NEGOTIATE, CHALLENGE, REPLY, SUCCESS1, SUCCESS2 = 1, 2, 3, 4, 5
HMAC_SHA256 = 1  # DH-HMAC-CHAP's hash identifier for SHA-256
NONCE_BYTES = 32
TAG_BYTES = 16
TRAILER_BYTES = 8 + TAG_BYTES  # sequence number u64 LE, then the MAC
MAX_NQN_BYTES = 223            # NVMe's NQN limit
_HEAD = struct.Struct("<BH")
_SEQ = struct.Struct("<Q")
HOST_TO_TARGET, TARGET_TO_HOST = b"H2C", b"C2H"



class AuthError(Exception):
    """A handshake or a sealed capsule that does not check out."""


@dataclasses.dataclass(frozen=True)
class FabricSecurity:
    """How one end of the fabric authenticates: its mode and the secrets it holds (never logged).

    A host holds its own secret (`key`) and the storage nodes' CURVE public key; a target holds
    the master (`key`, from which it derives each host's) and its CURVE key pair.
    """

    mode: str = "off"
    key: bytes = dataclasses.field(default=b"", repr=False)
    curve_public: bytes = b""
    curve_secret: bytes = dataclasses.field(default=b"", repr=False)

    def __post_init__(self) -> None:
        require(self.mode in MODES, f"fabric_security: one of {MODES}, got {self.mode!r}")
        require(self.mode == "off" or self.key, "fabric_security auth or curve needs a secret")
        require(self.mode != "curve" or self.curve_public, "fabric_security curve needs the CURVE public key")

    @classmethod
    def off(cls) -> FabricSecurity:
        return cls()

    @classmethod
    def for_host(cls, mode: str, credentials_dir: str, host_nqn: str) -> FabricSecurity:
        """A host's security from the deployment's credentials (CredentialsError if absent)."""
        if mode == "off":
            return cls.off()
        creds = Credentials(resolve_dir(credentials_dir), "host")
        public = creds.fabric_curve_public() if mode == "curve" else b""
        return cls(mode, creds.fabric_host_key(host_nqn), public)

    @classmethod
    def for_target(cls, mode: str, credentials_dir: str) -> FabricSecurity:
        """A storage node's security: the master, and for curve its key pair."""
        if mode == "off":
            return cls.off()
        creds = Credentials(resolve_dir(credentials_dir), "storage")
        public, secret = creds.fabric_curve_pair() if mode == "curve" else (b"", b"")
        return cls(mode, creds.fabric_master(), public, secret)

    @property
    def authenticates(self) -> bool:
        return self.mode != "off"

    def host_key(self, host_nqn: str) -> bytes:
        """Target side: the secret of host_nqn, derived from the master."""
        return host_key(self.key, host_nqn)


# -- messages ---------------------------------------------------------------------------------

def _pack(kind: int, t_id: int, body: bytes = b"") -> bytes:
    return _HEAD.pack(kind, t_id) + body


def _unpack(message: bytes, kind: int, t_id: int | None, length: int | None = None) -> memoryview:
    """The fields of a message of `kind` (for transaction t_id; None: any); AuthError otherwise."""
    message = bytes(message)
    if len(message) < _HEAD.size:
        raise AuthError(f"handshake message of {len(message)} bytes")
    got_kind, got_t_id = _HEAD.unpack_from(message)
    if got_kind != kind:
        raise AuthError(f"expected handshake message {kind}, got {got_kind}")
    if t_id is not None and got_t_id != t_id:
        raise AuthError(f"transaction id {got_t_id}, expected {t_id}")
    body = memoryview(message)[_HEAD.size:]
    if length is not None and body.nbytes != length:
        raise AuthError(f"handshake message {kind} of {body.nbytes} bytes, expected {length}")
    return body


def transaction_id(message: bytes) -> int:
    """The transaction id a NEGOTIATE opens (AuthError if it is not one)."""
    _unpack(message, NEGOTIATE, None)
    return _HEAD.unpack_from(bytes(message))[1]


def _response(key: bytes, challenge: bytes, seq: int, t_id: int, role: bytes, first: str, second: str) -> bytes:
    data = (challenge + struct.pack("<IH", seq, t_id) + b"\0" + role + first.encode() + b"\0"
            + second.encode())
    return hmac.new(key, data, hashlib.sha256).digest()


def _session_keys(key: bytes, c1: bytes, c2: bytes, t_id: int, host_nqn: str,
                  subsystem_nqn: str) -> tuple[bytes, bytes]:
    """(host -> target key, target -> host key)."""
    context = c1 + c2 + struct.pack("<H", t_id) + host_nqn.encode() + b"\0" + subsystem_nqn.encode()
    return tuple(hmac.new(key, b"kvtb fabric session\0" + d + context, hashlib.sha256).digest()
                 for d in (HOST_TO_TARGET, TARGET_TO_HOST))


class HostHandshake:
    """The host's side: negotiate() -> reply(challenge) -> success2(success1) -> channel()."""

    def __init__(self, key: bytes, host_nqn: str, subsystem_nqn: str = "",
                 random: Callable[[int], bytes] = secrets.token_bytes):
        self.key, self.host_nqn, self.subsystem_nqn = key, host_nqn, subsystem_nqn
        self.random = random
        self.t_id = int.from_bytes(random(2), "little")
        self._c1 = self._c2 = b""
        self._s2 = 0
        self._done = False

    def negotiate(self) -> bytes:
        return _pack(NEGOTIATE, self.t_id, bytes([1, HMAC_SHA256]))

    def reply(self, challenge: bytes) -> bytes:
        """REPLY to the target's CHALLENGE (its subsystem NQN must be the one asked for, if any)."""
        body = _unpack(challenge, CHALLENGE, self.t_id)
        if body.nbytes < 1 + 4 + NONCE_BYTES + 2:
            raise AuthError("short CHALLENGE")
        hash_id, s1 = body[0], struct.unpack_from("<I", body, 1)[0]
        c1 = bytes(body[5:5 + NONCE_BYTES])
        (nqn_len,) = struct.unpack_from("<H", body, 5 + NONCE_BYTES)
        nqn = bytes(body[7 + NONCE_BYTES:])
        if hash_id != HMAC_SHA256 or len(nqn) != nqn_len:
            raise AuthError("CHALLENGE with an unknown hash or a malformed subsystem NQN")
        subsystem = nqn.decode(errors="replace")
        if self.subsystem_nqn and subsystem != self.subsystem_nqn:
            raise AuthError(f"the target is {subsystem!r}, not {self.subsystem_nqn!r}")
        self.subsystem_nqn, self._c1 = subsystem, c1
        self._c2, self._s2 = self.random(NONCE_BYTES), int.from_bytes(self.random(4), "little")
        r1 = _response(self.key, c1, s1, self.t_id, b"HostHost", self.host_nqn, subsystem)
        return _pack(REPLY, self.t_id, r1 + struct.pack("<I", self._s2) + self._c2)

    def success2(self, success1: bytes) -> bytes:
        """SUCCESS2 once the target proved it holds this host's secret too (AuthError if not)."""
        if not self._c2:
            raise AuthError("SUCCESS1 before a CHALLENGE")
        r2 = bytes(_unpack(success1, SUCCESS1, self.t_id, 32))
        want = _response(self.key, self._c2, self._s2, self.t_id, b"Controller", self.subsystem_nqn,
                         self.host_nqn)
        if not hmac.compare_digest(r2, want):
            raise AuthError("the target failed to authenticate (it does not hold this host's secret)")
        self._done = True
        return _pack(SUCCESS2, self.t_id)

    def channel(self) -> Channel:
        if not self._done:
            raise AuthError("the handshake has not completed")
        send, recv = _session_keys(self.key, self._c1, self._c2, self.t_id, self.host_nqn, self.subsystem_nqn)
        return Channel(send, recv)


class TargetHandshake:
    """The target's side of one session's handshake: receive() each AUTH_SEND, send() each AUTH_RECV.

    Any message out of turn, malformed or wrong raises AuthError; the session must Connect again.
    """

    def __init__(self, key: bytes, host_nqn: str, subsystem_nqn: str,
                 random: Callable[[int], bytes] = secrets.token_bytes):
        self.key, self.host_nqn, self.subsystem_nqn = key, host_nqn, subsystem_nqn
        self.random = random
        self.t_id: int | None = None
        self.expect = NEGOTIATE
        self.pending = b""       # the message the next AUTH_RECV returns
        self._c1 = self._c2 = b""
        self._s1 = 0
        self.done = False

    def receive(self, message: bytes) -> None:
        """Take the host's next message (AUTH_SEND)."""
        if self.pending or self.done:
            raise AuthError("AUTH_SEND out of turn (an AUTH_RECV was due, or the handshake is over)")
        if self.expect == NEGOTIATE:
            self.t_id = transaction_id(message)
            offered = bytes(_unpack(message, NEGOTIATE, self.t_id))
            if not offered or HMAC_SHA256 not in offered[1:1 + offered[0]]:
                raise AuthError("the host offers no hash this target supports")
            self._c1, self._s1 = self.random(NONCE_BYTES), int.from_bytes(self.random(4), "little")
            nqn = self.subsystem_nqn.encode()[:MAX_NQN_BYTES]
            self.pending = _pack(CHALLENGE, self.t_id, bytes([HMAC_SHA256]) + struct.pack("<I", self._s1)
                                 + self._c1 + struct.pack("<H", len(nqn)) + nqn)
            self.expect = REPLY
        elif self.expect == REPLY:
            body = _unpack(message, REPLY, self.t_id, 32 + 4 + NONCE_BYTES)
            r1, s2, c2 = bytes(body[:32]), struct.unpack_from("<I", body, 32)[0], bytes(body[36:])
            want = _response(self.key, self._c1, self._s1, self.t_id, b"HostHost", self.host_nqn,
                             self.subsystem_nqn)
            if not hmac.compare_digest(r1, want):
                raise AuthError(f"host {self.host_nqn!r} failed to authenticate (wrong secret)")
            self._c2 = c2
            r2 = _response(self.key, c2, s2, self.t_id, b"Controller", self.subsystem_nqn, self.host_nqn)
            self.pending = _pack(SUCCESS1, self.t_id, r2)
            self.expect = SUCCESS2
        else:
            _unpack(message, SUCCESS2, self.t_id, 0)
            self.done = True

    def send(self) -> bytes:
        """The target's next message (AUTH_RECV); AuthError when none is due."""
        if not self.pending:
            raise AuthError("AUTH_RECV out of turn (no handshake message is due)")
        message, self.pending = self.pending, b""
        return message

    def channel(self) -> Channel:
        if not self.done:
            raise AuthError("the handshake has not completed")
        to_target, to_host = _session_keys(self.key, self._c1, self._c2, self.t_id, self.host_nqn,
                                           self.subsystem_nqn)
        return Channel(to_host, to_target)


class Channel:
    """One authenticated connection's sealing: a key and a sequence number per direction.

    Not thread-safe: each side seals on one thread (in send order) and opens on one (in receive order).
    """

    def __init__(self, send_key: bytes, recv_key: bytes):
        self._send_key, self._recv_key = send_key, recv_key
        self.sent = 0       # sequence number of the next capsule sealed
        self.received = 0   # sequence number the next capsule opened must carry

    def seal(self, capsule: bytes) -> bytes:
        """capsule | sequence number | MAC."""
        seq = _SEQ.pack(self.sent)
        self.sent += 1
        return capsule + seq + _tag(self._send_key, capsule, seq)

    def open(self, frame) -> bytes:
        """The capsule of a sealed frame, once its MAC and sequence number check out."""
        frame = bytes(frame)
        if len(frame) < TRAILER_BYTES:
            raise AuthError("capsule without a MAC")
        capsule, seq = frame[:-TRAILER_BYTES], frame[-TRAILER_BYTES:-TAG_BYTES]
        if not hmac.compare_digest(frame[-TAG_BYTES:], _tag(self._recv_key, capsule, seq)):
            raise AuthError("capsule MAC mismatch (forged or altered)")
        (number,) = _SEQ.unpack(seq)
        if number != self.received:
            raise AuthError(f"capsule sequence number {number}, expected {self.received} (replayed or reordered)")
        self.received += 1
        return capsule


def _tag(key: bytes, capsule: bytes, seq: bytes) -> bytes:
    h = blake3.blake3(capsule, key=key)
    h.update(seq)
    return h.digest(TAG_BYTES)
