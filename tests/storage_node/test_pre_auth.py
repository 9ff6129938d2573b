"""Work before authentication is bounded (pure, a fake clock): a token bucket per peer address, half-open
handshakes capped per address and in all (a flood from one address never pushes out another's), and
forgotten after the handshake timeout."""
from __future__ import annotations

import pytest

from fabric.auth import AuthError, FabricSecurity
from kvtb import credentials
from storage_node.pre_auth import HANDSHAKE_MESSAGES, PeerBuckets, PreAuthLimits
from storage_node.sessions import Sessions

AGENT = "nqn.2026-11.org.kvtestbed:smartnic-0"
SUBSYSTEM = "nqn.2026-11.org.kvtestbed:storage-0"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sessions(clock: Clock, **limits) -> Sessions:
    return Sessions(FabricSecurity("auth", b"m" * 32), PreAuthLimits(**limits), clock)


def test_a_bucket_allows_its_burst_then_its_rate():
    b = PeerBuckets(rate=10, burst=20)
    assert sum(b.take("a", 0.0) for _ in range(100)) == 20
    assert b.take("b", 0.0)  # another address has its own
    assert sum(b.take("a", 1.0) for _ in range(100)) == 10  # a second's refill
    assert sum(b.take("a", 100.0) for _ in range(100)) == 20  # never more than the burst


def test_the_buckets_kept_are_bounded():
    b = PeerBuckets(rate=1, burst=1, max_peers=50)
    for i in range(10_000):
        b.take(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(b) == 50


def test_a_peers_handshake_rate_is_in_messages():
    b = PeerBuckets.for_handshakes(5)
    assert sum(b.take("a", 0.0) for _ in range(1000)) == 5 * HANDSHAKE_MESSAGES * 2  # two seconds' worth


def test_a_flood_from_one_address_keeps_to_its_cap_and_leaves_another_addresss_handshake():
    clock = Clock()
    s = sessions(clock, max_half_open=64, max_half_open_per_peer=8)
    s.begin(b"agent", AGENT, SUBSYSTEM, "10.0.0.1")
    for i in range(1100):
        s.begin(b"evil%d" % i, AGENT, SUBSYSTEM, "10.0.0.66")
    assert s.half_open_of("10.0.0.66") == 8 and s.half_open == 9
    assert s.handshake(b"agent").host_nqn == AGENT  # still there
    assert s.handshake(b"evil1099")  # the newest of the flood are kept, the oldest went
    with pytest.raises(AuthError):
        s.handshake(b"evil0")


def test_past_the_total_cap_the_crowded_address_loses_first():
    clock = Clock()
    s = sessions(clock, max_half_open=32, max_half_open_per_peer=16)
    s.begin(b"agent", AGENT, SUBSYSTEM, "10.0.0.1")
    for i in range(1000):  # from many addresses, two each at most: the total cap decides
        s.begin(b"evil%d" % i, AGENT, SUBSYSTEM, f"10.1.{i // 2 % 250}.{i % 2}")
    assert s.half_open <= 32
    s2 = sessions(clock, max_half_open=32, max_half_open_per_peer=16)
    s2.begin(b"agent", AGENT, SUBSYSTEM, "10.0.0.1")
    for addr in ("10.0.0.2", "10.0.0.3"):
        for i in range(100):
            s2.begin(b"%s-%d" % (addr.encode(), i), AGENT, SUBSYSTEM, addr)
    assert s2.half_open == 32 and s2.half_open_of("10.0.0.1") == 1
    assert s2.half_open_of("10.0.0.2") + s2.half_open_of("10.0.0.3") == 31


def test_half_open_sessions_expire_and_their_state_goes():
    clock = Clock()
    s = sessions(clock, handshake_timeout_s=5)
    for i in range(100):
        s.begin(b"h%d" % i, AGENT, SUBSYSTEM, f"10.0.{i}.1")
    clock.now += 4
    s.begin(b"late", AGENT, SUBSYSTEM, "10.0.0.9")
    assert s.expire() == 0 and s.half_open == 101
    clock.now += 1.5
    assert s.expire() == 100 and s.half_open == 1 and s.expired == 100
    assert s._by_peer.keys() == {"10.0.0.9"}  # no table keeps the forgotten addresses
    with pytest.raises(AuthError):
        s.handshake(b"h0")


def test_a_handshake_completes_within_the_caps(tmp_path):
    from fabric.auth import HostHandshake
    d = credentials.init(tmp_path / "creds")
    target = FabricSecurity.for_target("auth", str(d))
    host = FabricSecurity.for_host("auth", str(d), AGENT)
    s = Sessions(target, PreAuthLimits(max_half_open=4, max_half_open_per_peer=2), Clock())
    s.begin(b"a", AGENT, SUBSYSTEM, "10.0.0.1")
    hs = HostHandshake(host.key, AGENT, SUBSYSTEM)
    s.handshake(b"a").receive(hs.negotiate())
    s.handshake(b"a").receive(hs.reply(s.handshake(b"a").send()))
    s.handshake(b"a").receive(hs.success2(s.handshake(b"a").send()))
    s.establish(b"a")
    assert s.sealed(b"a") and s.half_open == 0 and not s._by_peer
