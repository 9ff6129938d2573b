"""The fabric's handshake and sealed capsules (pure): both ends prove the host's key; a capsule that is
forged, altered, replayed, reflected or reordered is refused; malformed handshake messages raise AuthError."""
from __future__ import annotations

import random
import struct

import pytest

from fabric import auth
from fabric.auth import AuthError, FabricSecurity, HostHandshake, TargetHandshake
from kvtb import credentials
from kvtb.settings import SettingsError

HOST, SUBSYSTEM = "nqn.2026-11.org.kvtestbed:smartnic-0", "nqn.2026-11.org.kvtestbed:storage-0"
KEY = bytes(range(32))


def handshake(host_key: bytes = KEY, target_key: bytes = KEY, subsystem: str = ""):
    """Run the five messages; (host, target) handshakes, or AuthError from the side that refuses."""
    host = HostHandshake(host_key, HOST, subsystem)
    target = TargetHandshake(target_key, HOST, SUBSYSTEM)
    target.receive(host.negotiate())
    reply = host.reply(target.send())
    target.receive(reply)
    target.receive(host.success2(target.send()))
    assert target.done
    return host, target


def test_both_ends_derive_channels_that_open_each_others_capsules():
    host, target = handshake()
    to_target, to_host = host.channel(), target.channel()
    for i in range(3):
        assert to_host.open(to_target.seal(b"capsule %d" % i)) == b"capsule %d" % i
        assert to_target.open(to_host.seal(b"reply %d" % i)) == b"reply %d" % i
    other, _ = handshake()  # another connection of the same host: other session keys
    with pytest.raises(AuthError, match="MAC"):
        to_host.open(other.channel().seal(b"capsule 3"))


def test_a_wrong_key_fails_on_either_side():
    with pytest.raises(AuthError, match="failed to authenticate"):  # the target refuses the host
        handshake(host_key=bytes(32))
    host = HostHandshake(KEY, HOST)
    fake = TargetHandshake(bytes(32), HOST, SUBSYSTEM)  # a target without this host's key
    fake.receive(host.negotiate())
    reply = host.reply(fake.send())  # head (3) | R1 [32] | S2 u32 | C2 [32]
    s2, c2 = struct.unpack_from("<I", reply, 3 + 32)[0], reply[3 + 36:]
    r2 = auth._response(bytes(32), c2, s2, host.t_id, b"Controller", SUBSYSTEM, HOST)  # its best answer
    with pytest.raises(AuthError, match="target failed to authenticate"):
        host.success2(auth._pack(auth.SUCCESS1, host.t_id, r2))


def test_the_host_refuses_a_target_of_another_name():
    with pytest.raises(AuthError, match="not 'nqn.other'"):
        handshake(subsystem="nqn.other")


def test_replayed_altered_reflected_and_reordered_capsules_are_refused():
    host, target = handshake()
    send, recv = host.channel(), target.channel()
    first, second = send.seal(b"store k1"), send.seal(b"store k2")
    with pytest.raises(AuthError, match="sequence number 1, expected 0"):
        recv.open(second)  # reordered
    assert recv.open(first) == b"store k1"
    with pytest.raises(AuthError, match="sequence number 0, expected 1"):
        recv.open(first)  # replayed
    altered = bytearray(second)
    altered[0] ^= 1
    with pytest.raises(AuthError, match="MAC mismatch"):
        recv.open(bytes(altered))
    renumbered = second[:-auth.TRAILER_BYTES] + struct.pack("<Q", 0) + second[-auth.TAG_BYTES:]
    with pytest.raises(AuthError, match="MAC mismatch"):
        recv.open(renumbered)
    with pytest.raises(AuthError, match="MAC mismatch"):  # the host's own capsule sent back to it
        send_back = host.channel()
        send_back.open(second)
    with pytest.raises(AuthError, match="without a MAC"):
        recv.open(b"short")
    assert recv.open(second) == b"store k2"


def test_messages_out_of_turn_or_of_another_transaction_are_refused():
    host = HostHandshake(KEY, HOST)
    target = TargetHandshake(KEY, HOST, SUBSYSTEM)
    with pytest.raises(AuthError, match="out of turn"):
        target.send()
    target.receive(host.negotiate())
    with pytest.raises(AuthError, match="out of turn"):
        target.receive(host.negotiate())  # the CHALLENGE is due first
    challenge = target.send()
    reply = bytearray(host.reply(challenge))
    reply[1] ^= 1  # another transaction id
    with pytest.raises(AuthError, match="transaction id"):
        target.receive(bytes(reply))
    with pytest.raises(AuthError, match="SUCCESS1 before a CHALLENGE"):
        HostHandshake(KEY, HOST).success2(b"\x04\x00\x00" + bytes(32))


def test_random_and_mutated_handshake_messages_raise_only_auth_error():
    rng = random.Random(20)
    host = HostHandshake(KEY, HOST)
    target = TargetHandshake(KEY, HOST, SUBSYSTEM)
    target.receive(host.negotiate())
    good = [host.negotiate(), target.send()]
    good.append(host.reply(good[1]))
    for _ in range(2000):
        base = rng.choice(good + [b""])
        message = bytearray(base)
        for _ in range(rng.randint(0, 4)):
            if message and rng.random() < 0.5:
                message[rng.randrange(len(message))] = rng.randrange(256)
            else:
                message = message[:rng.randint(0, len(message))] + bytes(rng.randrange(256)
                                                                         for _ in range(rng.randint(0, 8)))
        for make in (lambda m: TargetHandshake(KEY, HOST, SUBSYSTEM).receive(m),
                     lambda m: HostHandshake(KEY, HOST).reply(m),
                     lambda m: auth.Channel(KEY, KEY).open(m)):
            try:
                make(bytes(message))
            except AuthError:
                pass


def test_security_comes_from_the_deployments_credentials(tmp_path):
    d = credentials.init(tmp_path / "creds")
    host = FabricSecurity.for_host("curve", str(d), HOST)
    target = FabricSecurity.for_target("curve", str(d))
    assert host.key == credentials.host_key((d / "fabric.key").read_bytes(), HOST) == target.host_key(HOST)
    assert host.curve_public == target.curve_public and len(target.curve_secret) == 40
    assert not host.curve_secret and repr(host.key) not in repr(host)
    assert FabricSecurity.for_host("off", str(tmp_path / "nowhere"), HOST) == FabricSecurity.off()
    with pytest.raises(credentials.CredentialsError):
        FabricSecurity.for_host("auth", str(tmp_path / "nowhere"), HOST)
    with pytest.raises(SettingsError):
        FabricSecurity("tls", KEY)
