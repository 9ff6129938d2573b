"""Work before authentication is bounded (pure, a fake clock): a token bucket per peer address, half-open
handshakes capped per address and in all (a flood from one address never pushes out another's), and
forgotten after the handshake timeout. A known host's proven handshake (a first-message proof) has its own
allowance, so a flood from its own address does not push it out; forged, unknown and replayed proofs
prove nothing."""
from __future__ import annotations

import pytest

from fabric import first_proof
from fabric.auth import AuthError, FabricSecurity
from kvtb import credentials
from storage_node.pre_auth import HANDSHAKE_MESSAGES, PeerBuckets, PreAuthLimits
from storage_node.sessions import OVER_HOST_RATE, Sessions

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


# -- known hosts first (a first-message proof) ------------------------------------------------------

MASTER = b"m" * 32
WALL = 1_800_000_000.0


def known(clock: Clock, wall: float = WALL, allowed=(AGENT,), **limits) -> Sessions:
    return Sessions(FabricSecurity("auth", MASTER), PreAuthLimits(**limits), clock, subsystem_nqn=SUBSYSTEM,
                    allowed=lambda nqn: nqn in allowed, wall_clock=lambda: wall)


def agent_proof(subsystem: str = SUBSYSTEM, key: bytes | None = None) -> bytes:
    return first_proof.make(key or credentials.host_key(MASTER, AGENT), AGENT, subsystem, WALL)


def test_a_valid_proof_is_taken_once_and_a_forged_or_unknown_one_never():
    s = known(Clock())
    p = agent_proof()
    assert s.prove(AGENT, p) == first_proof.OK
    assert s.prove(AGENT, p) == first_proof.REPLAYED
    assert s.prove(AGENT, agent_proof(key=b"k" * 32)) == first_proof.FORGED
    evil = "nqn.2026-11.org.evil:bob"
    assert s.prove(evil, first_proof.make(credentials.host_key(MASTER, evil), evil, SUBSYSTEM, WALL)) \
        == first_proof.UNKNOWN_HOST  # a key of the master, but not a host this node serves
    assert s.prove(AGENT, b"") == first_proof.MALFORMED
    assert s.proofs[first_proof.OK] == 1 and sum(s.proofs.values()) == 5


def test_a_proven_host_has_a_rate_of_its_own():
    clock = Clock()
    s = known(clock, handshakes_per_s_per_peer=5)
    taken = sum(s.prove(AGENT, agent_proof()) == first_proof.OK for _ in range(100))
    assert taken == 10  # two seconds' worth
    assert s.proofs[OVER_HOST_RATE] == 90
    clock.now += 1
    assert s.prove(AGENT, agent_proof()) == first_proof.OK


def test_without_authentication_nothing_is_proven():
    s = Sessions(FabricSecurity.off(), PreAuthLimits(), Clock())
    assert s.prove(AGENT, agent_proof()) != first_proof.OK


def test_a_flood_from_the_agents_own_address_leaves_its_proven_handshake():
    s = known(Clock(), max_half_open=64, max_half_open_per_peer=8, max_half_open_per_host=2)
    s.begin(b"agent", AGENT, SUBSYSTEM, "127.0.0.1", proven=True)
    for i in range(1100):  # the same address, the same host NQN, no proof
        s.begin(b"evil%d" % i, AGENT, SUBSYSTEM, "127.0.0.1")
    assert s.half_open_of("127.0.0.1") == 8 and s.half_open_of_host(AGENT) == 1 and s.half_open == 9
    assert s.proven(b"agent") and not s.proven(b"evil1099") and not s.proven(b"nobody")
    assert s.handshake(b"agent").host_nqn == AGENT
    # the proven host's own allowance: past it, its own oldest goes
    for i in range(3):
        s.begin(b"agent%d" % i, AGENT, SUBSYSTEM, "127.0.0.1", proven=True)
    assert s.half_open_of_host(AGENT) == 2 and not s.proven(b"agent") and s.proven(b"agent2")
    s.drop(b"agent1")
    s.drop(b"agent2")
    assert s.half_open_of_host(AGENT) == 0 and not s._by_host


def test_past_the_total_cap_a_flood_loses_before_a_proven_host():
    s = known(Clock(), max_half_open=32, max_half_open_per_peer=16, max_half_open_per_host=4)
    s.begin(b"agent", AGENT, SUBSYSTEM, "10.0.0.1", proven=True)
    for i in range(2000):
        s.begin(b"evil%d" % i, AGENT, SUBSYSTEM, f"10.1.{i // 16 % 250}.1")
    assert s.half_open == 32 and s.proven(b"agent")


def test_a_proven_half_open_session_expires_too():
    clock = Clock()
    s = known(clock, handshake_timeout_s=5)
    s.begin(b"agent", AGENT, SUBSYSTEM, "127.0.0.1", proven=True)
    clock.now += 6
    assert s.expire() == 1 and not s._by_host and not s.proven(b"agent")


def test_limits_check_the_host_allowance():
    with pytest.raises(ValueError):
        PreAuthLimits(max_half_open_per_host=0)
    with pytest.raises(ValueError):
        PreAuthLimits(max_half_open=4, max_half_open_per_peer=4, max_half_open_per_host=5)
